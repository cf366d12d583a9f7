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
POINTING_IN = ["README.md", ".env.example", "CHANGELOG.md", "tests/README.md", "bench/README.md", "bench/results/*.md", "pyproject.toml",
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


# -- what the guide tells a newcomer to type or expect -------------------------------------------------
READER_PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _texts() -> list[tuple[str, str]]:
    return [(str(page.relative_to(ROOT)), page.read_text(encoding="utf-8")) for page in READER_PAGES]


def test_image_names_in_the_docs_are_the_images_scripts_images_builds():
    """``airflow-tf-training:0.1.0`` (behind any registry) in a page is an image ``scripts/images``
    builds under that name and the package's version: a how-to that builds one name and launches
    another fails here."""
    import tomllib

    built = set(re.findall(r'f"localhost/(airflow-tf-[\w-]+):\{version\}(-[\w-]+)?"',
                           (ROOT / "scripts" / "images").read_text()))
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    names = {f"{name}:{version}{suffix}" for name, suffix in built}
    assert {"airflow-tf-training:" + version, "airflow-tf-airflow:" + version} <= names
    wrong, seen = [], 0
    for where, text in _texts():
        for match in re.finditer(r"(?<![\w.-])(airflow-tf-(?:train|airflow)[\w-]*:[\w.-]+)", text):
            seen += 1
            if match.group(1).rstrip(".") not in names:
                wrong.append(f"{where}: {match.group(1)}")
    assert seen > 5, "the check found the image names of the how-tos"
    assert not wrong, f"images scripts/images does not build (it builds {sorted(names)}):\n" + "\n".join(wrong)


def _cli_parsers() -> dict[str, object]:
    import argparse

    from airflow_tf.cli import SUBCOMMANDS

    parser = argparse.ArgumentParser(prog="airflow-tf")
    sub = parser.add_subparsers(dest="command")
    for add in SUBCOMMANDS:
        add(sub)
    return dict(sub.choices)


def test_every_airflow_tf_command_in_the_docs_uses_flags_the_command_has():
    """Each ``airflow-tf <command> --flag ...`` a page shows (in a code block or inline, lines
    joined at a trailing backslash) is a command ``airflow-tf`` has, with flags it takes."""
    parsers = _cli_parsers()
    wrong, checked = [], 0
    for where, text in _texts():
        text = text.replace("\\\n", " ")
        for match in re.finditer(r"(?<![\w/.-])airflow-tf (\w+)((?: +(?:--[\w-]+(?:=\S+)?|[^\s`|;&]+))*)", text):
            command, rest = match.group(1), match.group(2)
            if command not in parsers:
                if rest.strip().startswith("--") or command in ("run", "render", "prepare", "evaluate", "export"):
                    wrong.append(f"{where}: airflow-tf {command}: no such command")
                continue
            known = parsers[command]._option_string_actions  # type: ignore[attr-defined]
            for flag in re.findall(r"(?<!\S)(--[\w-]+)", rest):
                checked += 1
                if flag not in known:
                    wrong.append(f"{where}: airflow-tf {command} {flag}: no such flag")
    assert checked > 30, "the check found the commands of the guide"
    assert not wrong, "\n".join(wrong)


def test_the_kubernetes_how_to_lists_what_the_rendered_role_grants_and_says_render_prints_jobs(capsys):
    """The how-to's RBAC summary names every resource of the Role ``airflow-tf render --rbac``
    prints, and what ``render`` prints for a group."""
    from airflow_tf.cli import main

    assert main(["render", "--rbac", "--namespace", "team-a"]) == 0
    role, = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d["kind"] == "Role"]
    words = {"jobs": "Jobs", "pods": "pods", "pods/log": "their logs", "services": "Services", "events": "events",
             "networkpolicies": "NetworkPolicies", "jobsets": "JobSets", "workloads": "Kueue Workloads",
             "pods/status": "pod status", "poddisruptionbudgets": "PodDisruptionBudgets"}
    granted = {resource for rule in role["rules"] for resource in rule["resources"]}
    assert granted <= set(words), f"a resource this test does not know the word for: {granted - set(words)}"
    how_to = (DOCS / "how-to" / "kubernetes.md").read_text(encoding="utf-8")
    summary = re.search(r"the Role of\s+`airflow_tf/rbac/role.yaml` \(([^)]*)\)", how_to)
    assert summary, "the how-to summarises the Role"
    text = " ".join(summary.group(1).split())
    assert not [words[r] for r in granted if words[r] not in text], text
    assert "prints the pods" not in how_to
    assert re.search(r"airflow-tf render --name demo.*`\s+prints the Jobs", how_to, flags=re.S)


def test_the_demos_sample_output_has_every_key_the_demo_prints():
    """The getting-started page shows the JSON ``airflow-tf demo`` prints: every key of the
    summary ``run_demo`` returns on local processes, in the order ``--sort-keys`` prints them."""
    import ast
    import json

    tree = ast.parse((ROOT / "airflow_tf" / "demo.py").read_text())
    run_demo = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "run_demo")
    summary = next(n.value for n in ast.walk(run_demo) if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", None) == "summary")
    keys = [k.value for k in summary.keys]  # type: ignore[union-attr]
    page = (DOCS / "tutorials" / "getting-started.md").read_text(encoding="utf-8")
    sample = json.loads(re.search(r"```json\n(\{.*?\})\n```", page, flags=re.S).group(1))
    assert list(sample) == sorted(keys)


def test_the_operators_reference_reads_outside_the_built_site():
    """reference/operators.md is mkdocstrings directives: its text names each of them, so the
    page is not empty where the directives are not expanded (GitHub, an editor)."""
    page = (DOCS / "reference" / "operators.md").read_text(encoding="utf-8")
    prose = "\n".join(line for line in page.splitlines() if not line.startswith(":::"))
    directives = re.findall(r"^::: ([\w.]+)$", page, flags=re.M)
    assert len(directives) > 10
    assert not [d for d in directives if d.rsplit(".", 1)[1] not in prose]
