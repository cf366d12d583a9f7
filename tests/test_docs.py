"""The user guide builds with warnings as errors: a broken link, a missing page, an example DAG
that is no longer where the guide includes it from, or an operator docstring mkdocstrings cannot
read fails the build."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_user_guide_builds_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    operators = (tmp_path / "site" / "operators" / "index.html").read_text()
    assert "LaunchTFClusterOperator" in operators and "WorkerCompletionSensor" in operators
