"""Four DAG runs of the example DAGs at once on one machine, on the embedded default: local
process groups sharing one storage and one group-state directory, as runs started together by
one Airflow would. Each run goes through its own ``airflow dags test`` and its own SQLite
home (SQLite takes one writer at a time; the shared parts are the ones under test)."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from airflow_tf.demo import airflow_env, dag_run_state, dags_test, reserialize

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

RUNS = [
    ("tf_linear_regression", {"steps": 1000, "rows": 5000}),
    ("tf_linear_regression", {"steps": 1000, "rows": 5000}),
    ("tf_digits_classifier", {"steps": 600}),
    ("tf_digits_classifier", {"steps": 600}),
]


def test_four_example_dag_runs_at_once_all_finish_without_collisions(airflow_home, tmp_path, group_processes):
    shared = tmp_path / "shared"
    homes = []
    for i in range(len(RUNS)):
        env = airflow_env(tmp_path / f"home-{i}", airflow_home.dags)
        env.update(AIRFLOW_TF_STORAGE=str(shared / "storage"), AIRFLOW_TF_STATE_DIR=str(shared / "groups"))
        Path(env["AIRFLOW_HOME"]).mkdir(parents=True)
        if not homes:  # DAG files read the storage at parse time: serialize them once for it
            shutil.copy(Path(airflow_home.env["AIRFLOW_HOME"]) / "airflow.db", Path(env["AIRFLOW_HOME"]))
            reserialize(env)
        else:  # the same DAG folder and storage: a copy of that database
            shutil.copy(Path(homes[0]["AIRFLOW_HOME"]) / "airflow.db", Path(env["AIRFLOW_HOME"]))
        homes.append(env)

    with ThreadPoolExecutor(len(RUNS)) as pool:
        results = list(pool.map(lambda run: dags_test(run[0], run[1][0], json.dumps(run[1][1])),
                                zip(homes, RUNS)))
    for (dag_id, _), result, env in zip(RUNS, results, homes):
        (tmp_path / f"{Path(env['AIRFLOW_HOME']).parent.name}-{dag_id}.log").write_text(result.stdout)
        assert dag_run_state(result.stdout) == "success", f"{dag_id}:\n{result.stdout[-4000:]}"

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
    datasets = {name: sorted(p.name for p in (storage / "datasets" / name).iterdir() if p.is_dir())
                for name in ("linear_regression", "digits") if (storage / "datasets" / name).is_dir()}
    for name, versions in datasets.items():
        assert len(versions) == 2, f"{name}: two runs prepared {versions}, not one version each"
    # Exports of one model name at once get distinct versions, none half-written.
    linear = sorted((storage / "models" / "linear_regression").iterdir())
    assert [p.name for p in linear] == ["1", "2"] and all((p / "saved_model.pb").exists() for p in linear)
