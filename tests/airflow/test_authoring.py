"""Authoring without running a DAG: the task group's shape, mapping, provider conventions,
typed results. (DAG runs through Airflow are in test_dags.py.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_tf import get_provider_info
from airflow_tf.cluster.results import EvaluationResult, ExportResult, LaunchResult, best_evaluation
from airflow_tf.operators import LaunchTFClusterOperator, TeardownTFClusterOperator
from airflow_tf.task_groups import tf_training


def _dag(dag_id: str = "authoring") -> DAG:
    return DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))


def test_the_task_group_wires_launch_wait_teardown_evaluate_export():
    with _dag() as dag:
        tf_training(dataset="/data/ds", model="linear_regression", steps=10, model_name="m")
    tasks = {t.task_id: t for t in dag.tasks}
    assert set(tasks) == {"training.launch", "training.wait_for_workers", "training.teardown",
                          "training.evaluate", "training.export"}
    teardown = tasks["training.teardown"]
    assert teardown.is_teardown and teardown.on_failure_fail_dagrun, "a training that did not complete fails the run"
    assert teardown.upstream_task_ids == {"training.launch", "training.wait_for_workers"}
    assert teardown.launch_task_id == "training.launch" and teardown.wait_task_id == "training.wait_for_workers"
    assert tasks["training.wait_for_workers"].downstream_task_ids == {"training.teardown", "training.evaluate"}
    assert tasks["training.launch"].retries == 2, "a killed launch re-attaches on its retry"
    assert not teardown.downstream_task_ids, "the teardown is a leaf: it decides the run's state"


def test_a_pool_holds_the_launch_and_the_wait_so_its_slots_bound_the_trainings_at_once():
    with _dag() as dag:
        tf_training(dataset="/data/ds", model="linear_regression", steps=10, model_name="m", pool="tf_trainings")
    pools = {t.task_id: t.pool for t in dag.tasks}
    assert pools["training.launch"] == pools["training.wait_for_workers"] == "tf_trainings"
    assert pools["training.evaluate"] == pools["training.teardown"] == "default_pool", "only the training holds a slot"


def test_mapping_the_launch_over_any_documented_option_parses():
    with _dag():
        launch = LaunchTFClusterOperator.partial(
            task_id="launch", dataset="/data/ds", model="linear_regression", steps=100, epochs=None, batch_size=32,
            optimizer="adam", loss="mse", model_kwargs={}, sync=False, ps=1, workers=2, mode="between_graph",
            devices_per_worker=1, on_nan="stop", summary_every_steps=10, operation_timeout_secs=60,
        ).expand(learning_rate=[0.01, 0.1])
    assert launch.partial_kwargs["model"] == "linear_regression"
    for field in ("ps", "workers", "sync", "learning_rate", "steps"):
        assert field in LaunchTFClusterOperator.template_fields


def test_each_map_index_gets_its_own_group_and_run_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_TF_STORAGE", str(tmp_path))
    with _dag("sweep"):
        launch = LaunchTFClusterOperator(task_id="launch", dataset=str(tmp_path / "ds"), steps=10, learning_rate=0.1)
    specs = [launch.build_spec({"ti": SimpleNamespace(dag_id="sweep", task_id="launch", run_id="manual__1",
                                                      map_index=index, try_number=1)}) for index in (-1, 0, 1)]
    assert len({s.name for s in specs}) == 3
    assert len({s.training.run_dir for s in specs}) == 3
    assert all(s.training.run_dir.startswith(str(tmp_path / "runs")) for s in specs), "storage read at run time"
    assert [s.labels["airflow.map_index"] for s in specs] == ["-1", "0", "1"]


def test_the_teardown_takes_the_launch_object_not_its_id():
    with _dag():
        launch = LaunchTFClusterOperator(task_id="renamed_launch", dataset="/data/ds", steps=10)
        assert TeardownTFClusterOperator(task_id="t1", group=launch.output).launch_task_id == "renamed_launch"
        with pytest.raises(TypeError, match="operator object"):
            TeardownTFClusterOperator(task_id="t2", launch="renamed_launch")


def test_the_provider_config_section_is_listed_by_airflow(tmp_path):
    assert set(get_provider_info()["config"]["airflow_tf"]["options"]) == {"storage", "backend", "backend_options",
                                                                            "teams", "state_dir", "kept_log_bytes"}
    airflow = str(Path(sys.executable).with_name("airflow"))
    env = {"AIRFLOW_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "AIRFLOW__AIRFLOW_TF__STORAGE": "/shared/tf"}
    listed = subprocess.run([airflow, "config", "list", "--section", "airflow_tf"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert "[airflow_tf]" in listed.stdout, listed.stdout + listed.stderr
    assert all(option in listed.stdout for option in ("state_dir", "backend_options")), listed.stdout
    code = "from airflow_tf.storage import runs_dir; print(runs_dir())"
    got = subprocess.run([sys.executable, "-c", code], env={**env, "AIRFLOW_TF_STORAGE": "/from/env"},
                         capture_output=True, text=True, timeout=300)
    assert got.stdout.strip() == "/shared/tf/runs", "the config section wins over the environment variable"


def test_results_round_trip_as_dicts_and_the_best_run_is_picked_by_its_metric():
    launch = LaunchResult(group={"backend": "local", "name": "g"}, run_dir="/r", dataset="/d",
                          training={"dataset": "/d", "run_dir": "/r", "steps": 5})
    assert LaunchResult.from_dict(launch.to_dict()) == launch and launch.training_config().steps == 5
    evaluation = {"run_dir": "/r", "checkpoint": "/r/model.ckpt-5", "metrics": {"mse": 0.5}, "blessed": True,
                  "code_hash": "abc"}
    assert EvaluationResult.from_dict(evaluation).to_dict()["code_hash"] == "abc", "unknown keys are kept"
    with pytest.raises(ValueError, match="missing path, version"):
        ExportResult.from_dict({"model_name": "m"})
    runs = [{**evaluation, "metrics": {"mse": 0.9, "accuracy": 0.5}},
            {**evaluation, "metrics": {"mse": 0.2, "accuracy": 0.4}},
            {**evaluation, "metrics": {"mse": 0.1, "accuracy": 0.9}, "blessed": False}]
    assert best_evaluation(runs, "mse") == 1, "lower is better for errors; unblessed runs never win"
    assert best_evaluation(runs, "accuracy") == 0
    with pytest.raises(ValueError, match="no run of the sweep is blessed"):
        best_evaluation(runs[2:], "mse")


NAMED = {"PrepareTFRecordsOperator": ("name", {"input": "/in.csv"}),  # kept as dataset_name
         "ExportSavedModelOperator": ("model_name", {"launch": {}}),
         "EvaluateModelOperator": ("model_name", {"launch": {}}),  # optional there: None means no comparison
         "ApproveExportOperator": ("model_name", {"evaluation": {}})}


@pytest.mark.parametrize("operator, value", [(operator, value) for operator in NAMED
                                             for value in ("", "  ", 7, ["m"], None)
                                             if not (operator == "EvaluateModelOperator" and value is None)])
def test_a_dataset_or_model_name_that_is_not_a_name_is_refused_while_the_dag_is_parsed(operator, value):
    """The name becomes an asset and a directory: ``airflow_tf.model.None`` would be quietly wrong."""
    import airflow_tf.operators as operators

    argument, arguments = NAMED[operator]
    with _dag(), pytest.raises(ValueError, match=rf"{argument}: expected a name \(a non-empty string or a template\), "
                                                 rf"got {re.escape(repr(value))}"):
        getattr(operators, operator)(task_id="t", **arguments, **{argument: value})
    with _dag() as dag:  # a template waits for the task
        getattr(operators, operator)(task_id="t", **arguments, **{argument: "{{ params.name }}"})
    kept = "dataset_name" if argument == "name" else argument
    assert getattr(dag.get_task("t"), kept) == "{{ params.name }}"
