"""Marking a run failed through the REST API while its training runs: the run ends failed
(not success), and nothing of the training group is left running."""

from __future__ import annotations

import time

import pytest
import requests

from airflow_tf.backends import get_backend
from airflow_tf.cluster import group_name

pytestmark = pytest.mark.slow

DAG_ID = "tf_linear_regression"
# Far more steps than the test lets it train: the run is marked failed mid-training.
LONG_RUN = {"steps": 1_000_000, "rows": 2000}


def test_a_run_marked_failed_while_the_sensor_waits_ends_failed_with_nothing_left(stack):
    api = stack.api
    api.wait_for_dag(DAG_ID)
    api.unpause(DAG_ID)
    run_id = api.trigger(DAG_ID, conf=LONG_RUN)
    backend = get_backend("local", state_dir=str(stack.state_dir))
    name = group_name(DAG_ID, "training.launch", run_id)

    deadline = time.monotonic() + 300
    while True:
        try:
            states = {t: ti["state"] for t, ti in api.task_instances(DAG_ID, run_id).items()}
        except requests.Timeout:  # an API server slowed down by a loaded machine: ask again
            continue
        ref = backend.find(name)
        if states.get("training.wait_for_workers") in ("running", "deferred") and ref and backend.processes(ref):
            break
        assert "failed" not in states.values(), api.failure_report(DAG_ID, run_id)
        assert time.monotonic() < deadline, f"training never started waiting: {states}"
        time.sleep(1)

    api.call("PATCH", f"/dags/{DAG_ID}/dagRuns/{run_id}", json={"state": "failed"})
    run = api.wait_for_run(DAG_ID, run_id, timeout=180)
    assert run["state"] == "failed", api.failure_report(DAG_ID, run_id)
    states = {t: ti["state"] for t, ti in api.task_instances(DAG_ID, run_id).items()}
    assert states["training.wait_for_workers"] == "failed", states
    assert states["training.evaluate"] == "skipped" and states["training.export"] == "skipped", states
    assert states["training.teardown"] == "failed", "the teardown ran, then failed the run: " + str(states)
    log = api.task_log(DAG_ID, run_id, "training.teardown", 1)
    assert f"tore down 3 task(s) of group {name}" in log and "Task failed with exception" in log, log[-3000:]

    time.sleep(5)  # a run that ends failed stays failed once its last task is done
    assert api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")["state"] == "failed"
    ref = backend.find(name)
    assert ref is None or not backend.processes(ref), "no process of the training group is left"
