"""The user guide builds with warnings as errors: a broken link or anchor, a missing page, an example
DAG that is no longer where the guide includes it from, or an operator docstring mkdocstrings cannot
read fails the build. Links into the guide from outside it (the READMEs, code, tests, images) point
at pages and headings that exist, and the guide holds no test diaries or measurements outside
the performance page."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Files outside docs/ that send readers into the guide; mkdocs does not check their links.
POINTING_IN = ["README.md", "CHANGELOG.md", "tests/README.md", "bench/README.md", "bench/results/*.md", "pyproject.toml",
               "docker-compose.yml", ".ci/run", "images/*/Dockerfile", "airflow_tf/**/*.py", "tests/**/*.py",
               "bench/*.py", "scripts/*", "dags/*.py"]
GUIDE_REFERENCE = re.compile(r"\bdocs/((?:[\w-]+/)*[\w-]+\.md)(#[\w-]+)?")


def test_user_guide_builds_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    operators = (tmp_path / "site" / "reference" / "operators" / "index.html").read_text()
    assert "LaunchTFClusterOperator" in operators and "WorkerCompletionSensor" in operators
    # The launch operator's training options are documented from TrainingConfig, with its defaults' values.
    assert "{training_options}" not in operators and "the optimizer's learning rate" in operators
    assert "TrainingConfig.learning_rate" not in operators


@pytest.mark.parametrize("link, complaint", [
    ("[numbers](other.md#no-such-heading)", "does not contain an anchor '#no-such-heading'"),
    ("[numbers](#no-such-heading)", "there is no such anchor on this page"),
    ("[gone](missing.md)", "not found among documentation files"),
])
def test_the_guide_settings_fail_the_build_on_a_broken_link_or_anchor(tmp_path, link, complaint):
    """The guide's own ``validation`` settings, on a two-page site with one bad link."""
    settings = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(f"# Home\n\nSee {link}.\n")
    (docs / "other.md").write_text("# Other\n\n## Numbers\n")
    config = {"site_name": "check", "docs_dir": "docs", "strict": True, "validation": settings["validation"],
              "nav": ["index.md", "other.md"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--site-dir", str(tmp_path / "site")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and complaint in result.stderr, result.stderr[-2000:]


def test_every_parameter_of_the_operators_sensor_and_task_group_is_documented():
    """The reference page is generated from these docstrings: a parameter without its
    ``:param name:`` line would be a parameter the guide never mentions."""
    import inspect
    import re

    from airflow.sdk import BaseOperator

    import airflow_tf.operators as operators
    import airflow_tf.sensors as sensors
    from airflow_tf.task_groups import tf_training

    documented = [getattr(m, n) for m in (operators, sensors) for n in m.__all__]
    documented = [c for c in documented if inspect.isclass(c) and issubclass(c, BaseOperator)]
    assert len(documented) >= 6
    missing = []
    for thing, signature in [(c, inspect.signature(c.__init__)) for c in documented] + [(tf_training, inspect.signature(tf_training))]:
        doc = inspect.getdoc(thing) or ""
        for name, parameter in signature.parameters.items():
            if name != "self" and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                if not re.search(rf":param {name}:", doc):
                    missing.append(f"{thing.__name__}({name})")
    assert not missing, f"parameters without a :param: line: {missing}"


def anchors(page: Path) -> set[str]:
    """The ids mkdocs gives the headings of a page (Python-Markdown's toc slugify)."""
    from markdown.extensions.toc import slugify

    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {slugify(m.group(1), "-") for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, flags=re.M)}


def test_links_into_the_guide_from_outside_it_resolve():
    """``docs/<page>.md#<heading>`` in a README, an error message or a test names a page and a
    heading that exist: moving a page or renaming a heading must update those too."""
    broken = []
    files = sorted({f for pattern in POINTING_IN for f in ROOT.glob(pattern) if f.is_file()})
    assert len(files) > 20
    for path in files:
        for match in GUIDE_REFERENCE.finditer(path.read_text(encoding="utf-8", errors="replace")):
            page, anchor = DOCS / match.group(1), match.group(2)
            where = f"{path.relative_to(ROOT)}: {match.group(0)}"
            if not page.is_file():
                broken.append(f"{where} (no such page)")
            elif anchor and anchor[1:] not in anchors(page):
                broken.append(f"{where} (no such heading on the page)")
    assert not broken, "links into the guide that lead nowhere:\n" + "\n".join(broken)


def test_anchors_are_the_ids_mkdocs_gives_headings(tmp_path):
    """The check above computes heading ids itself: they are the ones the built site has."""
    page = DOCS / "reference" / "kubernetes.md"
    ours = anchors(page)
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    built = set(re.findall(r'<h[1-6] id="([^"]+)"', (tmp_path / "site" / "reference" / "kubernetes" / "index.html").read_text()))
    assert ours == built


def test_the_guide_holds_no_test_diaries_or_measurements():
    """Test runs, their counts and timings belong in tests/README.md; figures in the performance
    page (with the command that measured them) or bench/README.md."""
    performance = DOCS / "reference" / "performance.md"
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        if page == performance:
            continue
        text = page.read_text(encoding="utf-8")
        for pattern in (r"^#+\s*(Tests|Measured|Tests and figures)\b", r"\b\d+ (passed|failed|tests?)\b",
                        r"load average"):
            found += [f"{page.relative_to(ROOT)}: {m.group(0)!r}" for m in re.finditer(pattern, text, flags=re.M)]
    assert not found, "test diaries or measurements in the user guide:\n" + "\n".join(found)


def test_the_training_options_table_states_training_configs_defaults():
    """docs/reference/training.md's table of options gives each literal default (a number or a
    code word) as TrainingConfig has it; a default changed in the code fails here until the
    table follows. Descriptions ("per label", "16 MiB") are left to the reader."""
    import dataclasses
    import re

    from airflow_tf.cluster import TrainingConfig

    defaults = {f.name: f.default for f in dataclasses.fields(TrainingConfig)}
    table = (ROOT / "docs" / "reference" / "training.md").read_text(encoding="utf-8").split("## Options", 1)[1]
    checked, wrong = [], []
    for row in re.findall(r"^\| (`[^|]+) \| ([^|]+) \|", table, flags=re.M):
        names, values = re.findall(r"`(\w+)`", row[0]), [v.strip() for v in row[1].split(",")]
        if len(names) != len(values):
            continue
        for name, value in zip(names, values):
            literal = re.fullmatch(r"`(\w+)`|(\d+(?:\.\d+)?)", value)
            if literal is None or name not in defaults:
                continue
            expected = defaults[name]
            same = literal[1] == expected if literal[1] else float(literal[2]) == expected
            checked.append(name)
            if not same:
                wrong.append(f"{name}: the table says {value}, TrainingConfig {expected!r}")
    assert not wrong, wrong
    assert {"model", "learning_rate", "batch_size", "seed", "on_nan", "mode"} <= set(checked), checked
