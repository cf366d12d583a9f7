"""Packaging: the Airflow side installs and works without TensorFlow.

A fresh virtual environment gets only ``airflow-tf[airflow]``, then imports every module of
the Airflow side (operators, sensor, trigger, backends, data preparation) and parses the
example DAGs with Airflow's own DagBag while ``import tensorflow`` fails. This is what an
Airflow image for a Kubernetes deployment carries (images/airflow/Dockerfile): evaluation and
export run on the cluster in the training image.

The environment is filled by a real ``pip install -c constraints.txt ".[airflow]"`` of a copy
of the package (about a minute here from pip's cache; the first install on a machine downloads
the wheels from the package registry). With ``AIRFLOW_TF_CONSTRAINTS`` set (as scripts/bootstrap
takes it), that lock is installed instead: CI checks the oldest supported Airflow this way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = Path(os.environ.get("AIRFLOW_TF_CONSTRAINTS") or REPO / "constraints.txt").resolve()

CHECK = textwrap.dedent('''
    import importlib, json, pkgutil, sys

    import airflow_tf
    # Every module of the package but the training side (runtime, serving), found by walking
    # it, so a new module is checked too.
    training_side = ("airflow_tf.runtime", "airflow_tf.serving")
    names = ["airflow_tf"] + [m.name for m in pkgutil.walk_packages(airflow_tf.__path__, "airflow_tf.")
                              if not m.name.startswith(training_side)]
    for name in names:
        importlib.import_module(name)
    from airflow_tf.operators import (EvaluateModelOperator, ExportSavedModelOperator,  # noqa: F401
                                      LaunchTFClusterOperator, PrepareTFRecordsOperator, TeardownTFClusterOperator)
    from airflow_tf.sensors import WorkerCompletionSensor  # noqa: F401
    from airflow_tf.triggers import WorkerCompletionTrigger  # noqa: F401
    from airflow_tf.backends import get_backend
    get_backend("kubernetes", kubernetes_conn_id=None, namespace="ml")
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras"))
    try:
        import tensorflow  # noqa: F401
        tensorflow_importable = True
    except ImportError:
        tensorflow_importable = False

    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.1 keeps it in airflow.models
        from airflow.models.dagbag import DagBag
    bag = DagBag(dag_folder=sys.argv[1])
    print(json.dumps({"modules": len(names), "tensorflow_modules": loaded,
                      "tensorflow_importable": tensorflow_importable, "dags": sorted(bag.dag_ids),
                      "import_errors": bag.import_errors}))
''')


def _check_without_tensorflow(python: Path, tmp_path: Path) -> None:
    home = tmp_path / "airflow-home"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AIRFLOW_HOME": str(home),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
           "AIRFLOW_TF_STORAGE": str(tmp_path / "storage")}
    run = subprocess.run([str(python), "-c", CHECK, str(REPO / "dags")], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, f"the Airflow side failed without TensorFlow:\n{run.stderr[-5000:]}"
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["tensorflow_importable"] is False
    assert report["tensorflow_modules"] == [], "importing the Airflow side loaded TensorFlow"
    assert report["import_errors"] == {}
    expected = {path.stem for path in (REPO / "dags").glob("tf_*.py")}
    assert expected <= set(report["dags"]), f"example DAGs not parsed: {sorted(expected - set(report['dags']))}"
    assert report["modules"] > 20


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_pip_install_of_the_airflow_extra_brings_no_tensorflow_and_works(tmp_path):
    # A copy of what the package is built from, so the build leaves the work tree untouched.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "airflow_tf", source / "airflow_tf", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # --no-compile: this environment is used once; byte-compiling all of Airflow ahead costs
    # more CPU than compiling the modules the check imports as it imports them.
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-compile",
         "-c", str(CONSTRAINTS), f"{source}[airflow]"],
        capture_output=True, text=True, timeout=1500)
    assert install.returncode == 0, f"pip install .[airflow] failed:\n{install.stdout[-3000:]}\n{install.stderr[-5000:]}"
    installed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                               check=True).stdout.lower()
    assert "tensorflow" not in installed and "keras" not in installed, "the airflow extra pulled in TensorFlow"
    pinned = next(line for line in CONSTRAINTS.read_text().lower().splitlines() if line.startswith("apache-airflow=="))
    assert pinned in installed.splitlines(), f"{CONSTRAINTS.name} pins {pinned}"
    _check_without_tensorflow(python, tmp_path)
