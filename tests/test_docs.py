"""The user guide builds with warnings as errors: a broken link, a missing page, an example DAG
that is no longer where the guide includes it from, or an operator docstring mkdocstrings cannot
read fails the build."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_user_guide_builds_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    operators = (tmp_path / "site" / "reference" / "operators" / "index.html").read_text()
    assert "LaunchTFClusterOperator" in operators and "WorkerCompletionSensor" in operators


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
