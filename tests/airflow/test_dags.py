"""The example DAGs, run through Airflow (``airflow dags test``), end to end on local processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_tf.demo import dag_run_state as run_state
from airflow_tf.demo import predict
from airflow_tf.demo import task_states as _task_states
from processes import titled_processes

pytestmark = pytest.mark.slow


def task_states(home, dag_id: str, output: str) -> dict[str, str]:
    return _task_states(home.env, dag_id, output)


def asset_events(home) -> dict[str, list[dict]]:
    """Asset name -> its events (oldest first), read from the Airflow database of ``home``."""
    code = """
import json
from sqlalchemy import select
from airflow.models.asset import AssetEvent, AssetModel
from airflow.utils.session import create_session
with create_session() as session:
    rows = session.execute(select(AssetModel.name, AssetEvent.source_task_id, AssetEvent.extra)
                           .join(AssetModel, AssetEvent.asset_id == AssetModel.id).order_by(AssetEvent.id)).all()
print(json.dumps([[name, task, extra] for name, task, extra in rows]))
"""
    done = subprocess.run([sys.executable, "-c", code], env=home.env, capture_output=True, text=True, check=True)
    events: dict[str, list[dict]] = {}
    for name, task, extra in json.loads(done.stdout.strip().splitlines()[-1]):
        events.setdefault(name, []).append({"source_task_id": task, "extra": extra})
    return events


@pytest.mark.long
def test_recommendation_dag_trains_tables_on_both_ps_and_exports_a_model_of_raw_ids(airflow_home, tmp_path,
                                                                                     group_processes):
    result = airflow_home.run("tf_recommendation", tmp_path, conf=json.dumps({"steps": 1500, "rows": 200_000}))
    assert run_state(result.stdout) == "success", result.stdout[-4000:]
    run_dir = next((tmp_path / "storage" / "runs").iterdir())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["task"] == "binary_classification" and metrics["metrics"]["auc"] >= 0.7, metrics
    worker_log = next((run_dir / "logs").rglob("*-worker-0.log")).read_text()
    for table in ("user_embedding", "item_embedding"):
        assert f"airflow-tf embedding {table} 524288x16 32.0 MiB in 2 slice(s) on ps 0,1" in worker_log
    export = tmp_path / "storage" / "models" / "clicks" / "1"
    import tensorflow as tf

    serve = tf.saved_model.load(str(export)).signatures["serving_default"]
    clicks = serve(user=tf.constant(["u0", "u1", "u149999"]), item=tf.constant(["i0", "i5", "i7"]))["predictions"]
    assert clicks.shape == (3, 1) and bool(tf.reduce_all((clicks >= 0) & (clicks <= 1)))
    assert not group_processes(tmp_path / "groups"), "no process of the group is left"


def test_crashing_workers_fail_the_run_with_the_reason_and_teardown_still_runs(airflow_home, tmp_path, group_processes):
    result = airflow_home.run("tf_test_crashing_workers", tmp_path)
    assert run_state(result.stdout) == "failed"
    states = task_states(airflow_home, "tf_test_crashing_workers", result.stdout)
    # The teardown tears the group down, then fails: the training did not complete.
    assert states["training.wait_for_workers"] == "failed" and states["training.teardown"] == "failed", states
    assert "tore down" in result.stdout and "the training did not complete" in result.stdout
    assert states["training.evaluate"] == "upstream_failed", states
    # Whichever worker crashed first is named, with its exit code.
    assert re.search(r"failed: task tf-\S+-worker-\d \(worker \d\) failed: exit code 2", result.stdout)
    assert "no_such_package" in result.stdout, "the sensor quotes the worker's last log lines"
    assert not group_processes(tmp_path / "groups"), "no process of the group is left"
    # The Training view's row, read from this Airflow's database as the API server reads it.
    code = """
import json
from airflow_tf.plugins.access import recorded_launches
from airflow_tf.plugins.training_view import _waits, training_rows
launches = [launch for launch in recorded_launches() if launch.dag_id == "tf_test_crashing_workers"]
print(json.dumps(training_rows(launches, _waits(launches))))
"""
    env = dict(airflow_home.env, AIRFLOW_TF_STORAGE=str(tmp_path / "storage"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["state"] == "failed" and row["backend"] == "local", row
    assert re.search(r"task tf-\S+-worker-\d \(worker \d\) failed: exit code 2", row["failure_reason"]), row
    assert row["log_url"].endswith("/tasks/training.wait_for_workers"), row


def test_retried_launch_reattaches_to_the_same_group(airflow_home, tmp_path, group_processes):
    result = airflow_home.run("tf_test_launch_retry", tmp_path)
    assert run_state(result.stdout) == "success", result.stdout[-4000:]
    assert result.stdout.count("launched training group") == 1
    # Airflow 3.3's task state store: the first try recorded the group's uid, the retry found that very group.
    launched = re.search(r"launched training group (\S+) \(uid ([0-9a-f]{32})\)", result.stdout)
    reattached = re.search(r"re-attaching to training group (\S+) \(uid ([0-9a-f]{32})\)", result.stdout)
    assert launched and reattached, result.stdout[-4000:]
    assert reattached.groups() == launched.groups()
    assert not group_processes(tmp_path / "groups"), "no process of the group is left"


@pytest.mark.long
@pytest.mark.timeout(1500)  # four DAG runs through Airflow, beside the stack tests on two cores
def test_continuous_retraining_warm_starts_and_exports_only_a_better_model(airflow_home, tmp_path, group_processes):
    conf = json.dumps({"steps": 800})
    models = tmp_path / "storage" / "models" / "linear_regression_retrained"
    assert run_state(airflow_home.run("tf_ingest_linear_data", tmp_path).stdout) == "success"
    first = airflow_home.run("tf_continuous_retraining", tmp_path, conf=conf)
    assert run_state(first.stdout) == "success", first.stdout[-4000:]
    assert sorted(p.name for p in models.iterdir()) == ["1"], "nothing served yet: the first good model is exported"
    served_metrics = json.loads((models / "1" / "assets.extra" / "airflow_tf.json").read_text())["metrics"]
    assert predict(str(models / "1"), {"x": [0.0, 5.0]}) == pytest.approx([10.0, 20.0], abs=0.5)
    # The chain: prepare announced the dataset version, export the model version ...
    events = asset_events(airflow_home)
    dataset_event = events["airflow_tf.dataset.linear_regression_stream"][-1]
    assert dataset_event["source_task_id"] == "prepare" and dataset_event["extra"]["rows"] == 5000
    model_event = events["airflow_tf.model.linear_regression_retrained"][-1]
    assert model_event["extra"]["version"] == 1 and model_event["extra"]["path"] == str(models / "1")
    assert model_event["extra"]["metrics"]["blessed"] is True
    # ... on which the deployment DAG is scheduled; run by hand it deploys the latest export.
    assert run_state(airflow_home.run("tf_deploy_linear_model", tmp_path).stdout) == "success"
    deployed = json.loads((tmp_path / "storage" / "deployed" / "linear_regression_retrained.json").read_text())
    assert deployed["version"] == 1

    # The next batch lands as any other delivery would put it there (the ingest DAG's own run is
    # checked above; each DAG run costs seconds of CPU).
    _land_batch(tmp_path / "storage" / "incoming" / "linear_regression_stream")
    second = airflow_home.run("tf_continuous_retraining", tmp_path, conf=conf)
    assert run_state(second.stdout) == "success", second.stdout[-4000:]
    assert "warm start" in second.stdout.lower(), "the second run continues from the served model's checkpoint"
    states = task_states(airflow_home, "tf_continuous_retraining", second.stdout)
    run_dirs = sorted((tmp_path / "storage" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    evaluation = json.loads((run_dirs[-1] / "metrics.json").read_text())
    assert evaluation["baseline"]["version"] == 1, "the new model is compared with the one being served"
    assert evaluation["baseline"]["metrics"]["mse"] < 1.0 and served_metrics["blessed"]
    if evaluation["blessed"]:
        assert states["training.export"] == "success" and (models / "2").is_dir()
        assert evaluation["metrics"]["mse"] <= evaluation["baseline"]["metrics"]["mse"]
    else:
        assert states["training.export"] == "skipped" and not (models / "2").exists()
    assert not group_processes(tmp_path / "groups"), "no process of the group is left"


def _land_batch(stream: Path) -> None:
    """A partition of new rows under the stream's incoming folder, named to sort after the ones before."""
    from airflow_tf.data.samples import write_linear_regression_csv

    partition = time.strftime("%Y-%m-%dT%H-%M-%S", time.gmtime()) + f".{time.time_ns() % 10**9:09d}"
    assert all(partition > earlier.name for earlier in stream.iterdir())
    write_linear_regression_csv(stream / partition / "batch.csv", rows=5000, seed=1)


def test_a_refused_model_fails_the_launch_once_without_retries(airflow_home, tmp_path, group_processes):
    result = airflow_home.run("tf_test_refused_model", tmp_path)
    assert run_state(result.stdout) == "failed"
    states = task_states(airflow_home, "tf_test_refused_model", result.stdout)
    assert states["training.launch"] == "failed", states
    assert "launch refused" in result.stdout and "not a model reference" in result.stdout
    # retries=2, yet one try: a retry could not fix the model reference.
    assert result.stdout.count("launch refused") >= 1 and "up_for_retry" not in result.stdout.lower(), (
        result.stdout[-4000:])
    assert not (tmp_path / "groups").exists() or not group_processes(tmp_path / "groups")


def test_a_mapped_sweep_trains_one_group_per_learning_rate_and_exports_the_best(airflow_home, tmp_path,
                                                                                group_processes):
    conf = json.dumps({"learning_rates": [0.002, 0.02], "steps": 600})
    result = airflow_home.run("tf_learning_rate_sweep", tmp_path, conf=conf)
    assert run_state(result.stdout) == "success", result.stdout[-4000:]
    assert result.stdout.count("launched training group") == 2
    runs = sorted((tmp_path / "storage" / "runs").iterdir())
    assert len(runs) == 2, runs
    evaluations = {run.name: json.loads((run / "metrics.json").read_text()) for run in runs}
    best = min((e for e in evaluations.values() if e["blessed"]), key=lambda e: e["metrics"]["mse"])
    export = tmp_path / "storage" / "models" / "linear_regression_sweep"
    assert sorted(p.name for p in export.iterdir()) == ["1"], "only the best run is exported"
    metadata = json.loads((export / "1" / "assets.extra" / "airflow_tf.json").read_text())
    assert metadata["run_dir"] == best["run_dir"], (metadata["run_dir"], evaluations)
    assert metadata["training_config"]["learning_rate"] in (0.002, 0.02)
    # At once, as a cleanup script would look: no task titled with either group's run is left.
    assert titled_processes(tmp_path / "storage" / "runs") == {}, "no ps or worker of either group is left"
    assert not group_processes(tmp_path / "groups"), "no process of the group is left"


def test_a_same_named_group_the_launch_did_not_create_is_refused_and_left_alone(airflow_home, tmp_path,
                                                                                group_processes):
    from airflow_tf.backends.local import LocalBackend

    result = airflow_home.run("tf_test_foreign_group", tmp_path)
    assert run_state(result.stdout) == "failed", result.stdout[-4000:]
    states = task_states(airflow_home, "tf_test_foreign_group", result.stdout)
    assert states["launch"] == "failed" and states["wait_for_workers"] == "upstream_failed", states
    assert re.search(r"launch refused: training group (\S+) \(local backend, uid [0-9a-f]{32}\) already exists, "
                     r"but this launch \(dag tf_test_foreign_group, run \S+, task launch, map index -1\) did not "
                     "create it", result.stdout), result.stdout[-4000:]
    assert result.stdout.count("launch refused: training group") == 1, "refused at once, not retried"
    assert "launched training group" not in result.stdout
    # Someone else's group still runs: nothing of this run touched it. Stop it here.
    backend = LocalBackend(tmp_path / "groups")
    [name] = [p.name for p in (tmp_path / "groups").iterdir() if not p.name.startswith(".")]
    ref = backend.find(name)
    assert ref is not None and ref.labels["airflow.dag_id"] == "another_deployment"
    assert backend.status(ref).exists
    backend.teardown(ref)
    assert not group_processes(tmp_path / "groups")
