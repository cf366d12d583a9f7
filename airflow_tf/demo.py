"""Run the example DAGs through Airflow itself (``airflow dags test``) in a self-contained
home: SQLite, local processes, local disk. Used by ``airflow-tf demo`` and the DAG tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_DAGS = Path(__file__).resolve().parents[1] / "dags"


def airflow_env(workdir: str | os.PathLike, dags_folder: str | os.PathLike = REPO_DAGS) -> dict[str, str]:
    """Environment for an isolated Airflow home under ``workdir`` with the project's DAGs."""
    workdir = Path(workdir).resolve()
    home = workdir / "airflow"
    # The user's own Airflow settings must not leak into this self-contained home.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(Path(dags_folder).resolve()),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW_TF_STORAGE": str(workdir / "storage"),
        "AIRFLOW_TF_STATE_DIR": str(workdir / "groups"),
    })
    return env


def _airflow(env: dict[str, str], *args: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
    airflow = str(Path(sys.executable).with_name("airflow"))
    return subprocess.run([airflow, *args], env=env, check=check, text=True,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.STDOUT if capture else None)


def init_airflow(env: dict[str, str]) -> None:
    """Create the metadata database and serialize the DAGs (``dags test`` needs both)."""
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    _airflow(env, "db", "migrate", capture=True)
    reserialize(env)


def reserialize(env: dict[str, str]) -> None:
    _airflow(env, "dags", "reserialize", capture=True)


def dags_test(env: dict[str, str], dag_id: str, conf: str | None = None) -> subprocess.CompletedProcess:
    """Run one DAG run to the end through Airflow; output captured, no exception on failure."""
    args = ["dags", "test", dag_id] + (["--conf", conf] if conf else [])
    return _airflow(env, *args, check=False, capture=True)


def dag_run_state(output: str) -> str:
    """The final DagRun state (``success``/``failed``) from ``dags test`` output."""
    return _finished_line(output).split("state=")[1].split(",")[0]


def run_id_of(output: str) -> str:
    return _finished_line(output).split("run_id=")[1].split(",")[0]


def _finished_line(output: str) -> str:
    for line in reversed(output.splitlines()):
        if "DagRun Finished" in line:
            return line
    raise RuntimeError("the DAG run did not finish; last output:\n" + "\n".join(output.splitlines()[-40:]))


def task_states(env: dict[str, str], dag_id: str, output: str) -> dict[str, str]:
    """task_id -> final state of the run in ``output``, read back from Airflow's database."""
    result = _airflow(env, "tasks", "states-for-dag-run", dag_id, run_id_of(output), "--output", "json", capture=True)
    rows = json.loads(result.stdout[result.stdout.index("["):])
    return {row["task_id"]: row["state"] for row in rows}


def run_demo(workdir: str | os.PathLike, dags_folder: str | os.PathLike = REPO_DAGS) -> dict:
    """Run ``tf_linear_regression`` end to end and report where the model went and how good it is."""
    from airflow_tf.serving import latest_export

    env = airflow_env(workdir, dags_folder)
    print(f"airflow-tf demo: Airflow home {env['AIRFLOW_HOME']}, storage {env['AIRFLOW_TF_STORAGE']}", flush=True)
    init_airflow(env)
    print("airflow-tf demo: running DAG tf_linear_regression (airflow dags test) ...", flush=True)
    result = dags_test(env, "tf_linear_regression")
    log_path = Path(workdir) / "tf_linear_regression.log"
    log_path.write_text(result.stdout)
    if result.returncode != 0 or dag_run_state(result.stdout) != "success":
        tail = "\n".join(result.stdout.splitlines()[-40:])
        raise SystemExit(f"airflow-tf demo: the DAG run failed (full log: {log_path}):\n{tail}")
    models = Path(env["AIRFLOW_TF_STORAGE"]) / "models"
    served = latest_export(str(models), "linear_regression")
    if served is None:
        raise SystemExit(f"airflow-tf demo: the run succeeded but no model was exported under {models}")
    evaluation = served["metadata"].get("metrics", {})
    predictions = predict(served["path"], {"x": [0.0, 1.0, 5.0]})
    summary = {
        "dag_id": "tf_linear_regression",
        "exported_model": served["path"],
        "version": served["version"],
        "eval_metrics": evaluation.get("metrics", {}),
        "blessed": evaluation.get("blessed"),
        "training_curve": evaluation.get("plot"),
        "predictions_for_x_0_1_5": predictions,
        "expected_for_x_0_1_5 (2x + 10)": [10.0, 12.0, 20.0],
        "dag_log": str(log_path),
    }
    return summary


def predict(saved_model_dir: str, features: dict[str, list]) -> list[float]:
    """Call an exported model's ``serving_default`` signature, as TensorFlow Serving would."""
    import tensorflow as tf

    signature = tf.saved_model.load(saved_model_dir).signatures["serving_default"]
    inputs = {}
    for name, spec in signature.structured_input_signature[1].items():
        value = tf.constant(features[name], dtype=spec.dtype)
        inputs[name] = tf.reshape(value, [-1, *[d or 1 for d in spec.shape[1:]]])
    outputs = signature(**inputs)
    first = outputs.get("predictions", next(iter(outputs.values())))
    return [round(float(v), 3) for v in tf.reshape(first, [-1]).numpy()]
