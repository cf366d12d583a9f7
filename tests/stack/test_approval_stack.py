"""Approval before export on the real stack (scheduler, API server, LocalExecutor, PostgreSQL):
the approval task waits for a person (``awaiting_input``) showing what the model scored;
approving through the REST API exports the chosen run of a sweep, rejecting ends the run
without a new version, no answer within the timeout rejects by itself, and a person approves in
the web UI's Required actions in Chromium."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from airflow_stack import USERNAME

pytestmark = pytest.mark.slow

SWEEP = "tf_learning_rate_sweep_approved"
SINGLE = "tf_stack_approval"
TIMEOUT = "tf_stack_approval_timeout"


def versions(stack, model_name: str) -> list[str]:
    models = stack.storage / "models" / model_name
    return sorted((p.name for p in models.iterdir() if p.name.isdigit()), key=int) if models.is_dir() else []


# A person answers seconds after the request appears, never within the first second. On Airflow
# 3.3.2 an answer that lands before the scheduler has processed the parking task's end (about a
# second here) makes the scheduler mark the resumed task failed ("finished with state success, but
# the task instance's state attribute is queued"), so the tests answer as a person would.
ANSWER_AFTER_SECONDS = 10


def wait_for_state(api, dag_id: str, run_id: str, task_id: str, state: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tis = api.task_instances(dag_id, run_id)
        ti = tis.get(task_id)
        if ti is not None and ti["state"] == state:
            if state == "awaiting_input":
                time.sleep(ANSWER_AFTER_SECONDS)
            return ti
        if api.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"] in ("success", "failed"):
            break
        time.sleep(1)
    raise AssertionError(f"{task_id} never reached {state}:\n{api.failure_report(dag_id, run_id)}")


def hitl_path(dag_id: str, run_id: str, task_id: str) -> str:
    return f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/-1/hitlDetails"


def result_of(api, dag_id: str, run_id: str, task_id: str):
    return api.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value",
                    params={"deserialize": "true"})["value"]


def start(stack, dag_id: str, conf: dict | None = None) -> str:
    api = stack.api
    api.wait_for_dag(dag_id)
    api.unpause(dag_id)
    return api.trigger(dag_id, conf=conf)


@pytest.mark.long
@pytest.mark.timeout(2400)
def test_a_person_approves_the_chosen_run_of_a_sweep_through_the_rest_api(stack):
    api = stack.api
    run_id = start(stack, SWEEP, {"learning_rates": [0.002, 0.05], "steps": 600})
    approve = "sweep.approve"
    wait_for_state(api, SWEEP, run_id, approve, "awaiting_input", timeout=900)
    before = versions(stack, "linear_regression_sweep")

    # What the person is shown: the chosen run, its checks against the thresholds, and both runs.
    request = api.call("GET", hitl_path(SWEEP, run_id, approve))
    assert request["options"] == ["Approve", "Reject"] and not request["response_received"]
    assert request["subject"].startswith("Export linear_regression_sweep? Run "), request["subject"]
    body = request["body"]
    assert re.search(r"\| mse \| [\d.e-]+ \| max 1 \| yes \|", body), body
    assert "Chosen from 2 runs of the sweep" in body and body.count("(this one)") == 1, body
    best = result_of(api, SWEEP, run_id, "sweep.select_best")
    assert best["evaluation"]["run_dir"] in body
    assert versions(stack, "linear_regression_sweep") == before, "nothing is exported before the approval"

    answer = api.call("PATCH", hitl_path(SWEEP, run_id, approve),
                      json={"chosen_options": ["Approve"], "params_input": {}})
    assert answer["chosen_options"] == ["Approve"] and answer["responded_by"]["name"] == USERNAME
    run = api.wait_for_run(SWEEP, run_id, timeout=600)
    assert run["state"] == "success", api.failure_report(SWEEP, run_id)
    assert run["run_type"] == "manual" and run["triggered_by"] == "rest_api"
    assert api.task_instances(SWEEP, run_id)["sweep.export"]["state"] == "success"
    decision = result_of(api, SWEEP, run_id, approve)
    assert decision["approved"] and decision["by"] == USERNAME and not decision["timed_out"], decision
    assert decision["run_dir"] == best["evaluation"]["run_dir"]
    exported = result_of(api, SWEEP, run_id, "sweep.export")
    assert len(versions(stack, "linear_regression_sweep")) == len(before) + 1
    metadata = json.loads((Path(exported["path"]) / "assets.extra" / "airflow_tf.json").read_text())
    assert metadata["run_dir"] == best["evaluation"]["run_dir"], "the approved run is the one exported"
    log = api.task_log(SWEEP, run_id, approve, 1)
    assert f"APPROVED by {USERNAME}" in log, log[-3000:]


@pytest.mark.timeout(2400)
def test_a_rejected_model_is_not_exported_and_the_run_says_so(stack):
    api = stack.api
    before = versions(stack, SINGLE)
    run_id = start(stack, SINGLE)
    wait_for_state(api, SINGLE, run_id, "training.approve", "awaiting_input", timeout=900)
    api.call("PATCH", hitl_path(SINGLE, run_id, "training.approve"),
             json={"chosen_options": ["Reject"], "params_input": {}})
    run = api.wait_for_run(SINGLE, run_id, timeout=300)
    tis = api.task_instances(SINGLE, run_id)
    assert tis["training.approve"]["state"] == "success" and tis["training.export"]["state"] == "skipped", \
        api.failure_report(SINGLE, run_id)
    assert run["state"] == "success"
    assert versions(stack, SINGLE) == before, "a rejected model is not exported"
    decision = result_of(api, SINGLE, run_id, "training.approve")
    assert decision["decision"] == "rejected" and decision["by"] == USERNAME, decision
    log = api.task_log(SINGLE, run_id, "training.approve", 1)
    assert f"REJECTED by {USERNAME}" in log and "NOT exported" in log, log[-3000:]
    detail = api.call("GET", hitl_path(SINGLE, run_id, "training.approve"))
    assert detail["chosen_options"] == ["Reject"], "Airflow's own record of the answer says Reject"


@pytest.mark.timeout(2400)
def test_no_answer_within_the_timeout_rejects_by_itself(stack):
    api = stack.api
    before = versions(stack, TIMEOUT)
    run_id = start(stack, TIMEOUT)
    seen: dict[str, set] = {}
    run = api.wait_for_run(TIMEOUT, run_id, timeout=900, seen=seen)
    assert "awaiting_input" in seen["training.approve"], seen["training.approve"]
    tis = api.task_instances(TIMEOUT, run_id)
    assert tis["training.export"]["state"] == "skipped", api.failure_report(TIMEOUT, run_id)
    assert run["state"] == "success"
    decision = result_of(api, TIMEOUT, run_id, "training.approve")
    assert decision["decision"] == "rejected" and decision["timed_out"], decision
    assert decision["by"].startswith("nobody: no answer within"), decision
    assert versions(stack, TIMEOUT) == before


@pytest.mark.timeout(2400)
def test_a_person_approves_in_the_web_ui(stack, signed_in_page):
    """In Chromium, signed in: the run's Required actions page shows the request with the
    model's metrics; clicking Approve exports the model."""
    api, page = stack.api, signed_in_page
    before = versions(stack, SINGLE)
    run_id = start(stack, SINGLE)
    wait_for_state(api, SINGLE, run_id, "training.approve", "awaiting_input", timeout=900)
    subject = api.call("GET", hitl_path(SINGLE, run_id, "training.approve"))["subject"]
    screenshot = stack.artifacts / "ui-approval.png"
    screenshot.unlink(missing_ok=True)

    page.goto(f"{stack.airflow.url}/dags/{SINGLE}/runs/{run_id}/tasks/training.approve/required_actions")
    page.get_by_text(subject).first.wait_for()
    page.get_by_text("Approve publishes this model").first.wait_for()
    page.screenshot(path=str(screenshot), full_page=True)
    page.get_by_role("button", name="Approve", exact=True).click()

    run = api.wait_for_run(SINGLE, run_id, timeout=600)
    assert run["state"] == "success", api.failure_report(SINGLE, run_id)
    decision = result_of(api, SINGLE, run_id, "training.approve")
    assert decision["approved"] and decision["by"] == USERNAME, decision
    assert len(versions(stack, SINGLE)) == len(before) + 1, "the approved model is exported"
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
