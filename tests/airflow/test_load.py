"""Four DAG runs at once on one machine, on the embedded default: local process groups sharing
one storage and one group-state directory, as runs started together by one Airflow would. Each
run goes through its own ``airflow dags test`` and its own SQLite home (SQLite takes one writer
at a time; the shared parts are the ones under test).

Each run is also the end-to-end check of its DAG (the model it serves, its tasks' states), so
no DAG here is run a second time on its own."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from airflow_tf.demo import airflow_env, dag_run_state, dags_test, predict, task_states

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

RUNS = [
    ("tf_linear_regression", {"steps": 1500, "rows": 5000}),
    ("tf_linear_regression", {"steps": 1000, "rows": 5000}),
    ("tf_digits_classifier", None),
    # Written against the first release's API (training={...}, the teardown's launch_task_id).
    ("tf_test_first_release_api", None),
]


def _exported(output: str, model_name: str) -> Path:
    """Where this run's export wrote ``model_name`` (runs at once take distinct versions)."""
    found = re.search(rf"exported {model_name} version \d+ to (\S+)", output)
    assert found, f"no export of {model_name}:\n{output[-4000:]}"
    return Path(found.group(1))


def _run_dir(output: str, storage: Path) -> Path:
    found = re.search(r"launched training group (\S+) \(uid", output)
    assert found, output[-4000:]
    return storage / "runs" / found.group(1)


@pytest.mark.long
def test_four_dag_runs_at_once_all_finish_without_collisions_each_serving_its_model(airflow_home, tmp_path,
                                                                                     group_processes,
                                                                                     migrated_airflow_db):
    shared = tmp_path / "shared"
    homes = []
    for i in range(len(RUNS)):
        env = airflow_env(tmp_path / f"home-{i}", airflow_home.dags)
        env.update(AIRFLOW_TF_STORAGE=str(shared / "storage"), AIRFLOW_TF_STATE_DIR=str(shared / "groups"))
        # Each `dags test` writes the DAGs it parses into its own database.
        migrated_airflow_db(env)
        homes.append(env)

    with ThreadPoolExecutor(len(RUNS)) as pool:
        results = list(pool.map(lambda run: dags_test(run[0], run[1][0], run[1][1] and json.dumps(run[1][1])),
                                zip(homes, RUNS)))
    outputs = []
    for (dag_id, _), result, env in zip(RUNS, results, homes):
        (tmp_path / f"{Path(env['AIRFLOW_HOME']).parent.name}-{dag_id}.log").write_text(result.stdout)
        assert dag_run_state(result.stdout) == "success", f"{dag_id}:\n{result.stdout[-4000:]}"
        outputs.append(result.stdout)

    storage = shared / "storage"
    run_dirs = sorted((storage / "runs").iterdir())
    assert len(run_dirs) == len(RUNS), "each run trains in its own run directory"
    for run_dir in run_dirs:
        logs = list(run_dir.rglob("logs/attempt-*/*.log"))
        assert logs, f"no task logs kept in {run_dir}"
        text = "\n".join(log.read_text(errors="replace") for log in logs)
        # Never killed for memory: no task of any run was SIGKILLed or restarted.
        assert "SIGKILL" not in text and "restart 1 of" not in text, f"a task of {run_dir.name} was killed"
    # Each training got its own dataset version; no group is left running.
    assert not group_processes(shared / "groups")
    versions = sorted(p.name for p in (storage / "datasets" / "linear_regression").iterdir() if p.is_dir())
    assert len(versions) == 2, f"linear_regression: two runs prepared {versions}, not one version each"
    # Exports of one model name at once get distinct versions, none half-written.
    linear = sorted((storage / "models" / "linear_regression").iterdir())
    assert [p.name for p in linear] == ["1", "2"] and all((p / "saved_model.pb").exists() for p in linear)

    _linear_regression_serves_2x_plus_10(outputs[0], homes[0], storage)
    _digits_classifier_reaches_090_accuracy(outputs[2], storage)
    _first_release_dag_still_runs(outputs[3], storage)


def _linear_regression_serves_2x_plus_10(output: str, env: dict[str, str], storage: Path) -> None:
    states = task_states(env, "tf_linear_regression", output)
    assert set(states.values()) == {"success"}, states
    assert {"training.launch", "training.wait_for_workers", "training.teardown", "training.evaluate",
            "training.export"} <= set(states), states
    assert json.loads((_run_dir(output, storage) / "metrics.json").read_text())["blessed"] is True
    predictions = predict(str(_exported(output, "linear_regression")), {"x": [0.0, 1.0, 5.0]})
    assert predictions == pytest.approx([10.0, 12.0, 20.0], abs=0.5)


def _digits_classifier_reaches_090_accuracy(output: str, storage: Path) -> None:
    metrics = json.loads((_run_dir(output, storage) / "metrics.json").read_text())
    assert metrics["metrics"]["accuracy"] >= 0.9, metrics
    import tensorflow as tf
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = (digits.data[:50] / 16.0).astype("float32")
    serve = tf.saved_model.load(str(_exported(output, "digits"))).signatures["serving_default"]
    classes = np.asarray(serve(pixels=tf.constant(pixels))["classes"]).reshape(-1)
    assert (classes == digits.target[:50]).mean() >= 0.9


def _first_release_dag_still_runs(output: str, storage: Path) -> None:
    """training={...} and TeardownTFClusterOperator(launch_task_id=...) (0.1.0), deprecated."""
    assert re.search(r"tore down [1-9]\d* task\(s\) of group ", output), \
        "the teardown found the group from the launch's task id alone"
    assert (_exported(output, "first_release") / "saved_model.pb").exists()
