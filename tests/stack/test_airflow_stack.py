"""DAG runs through Airflow's own components, the way users run them: a schedule firing with
nobody triggering, and a person in the web UI (headless Chromium). A REST API v2 trigger is
tests/stack/test_approval_stack.py's."""

from __future__ import annotations

import json
import re
import time
from urllib.parse import unquote, urlparse

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from airflow_tf.demo import predict

pytestmark = pytest.mark.slow

DAG_ID = "tf_linear_regression"
# Enough steps for the seed's y = 2x + 10 to pass the DAG's mse <= 1.0 blessing threshold.
SMALL_RUN = {"steps": 1500, "rows": 5000}


def exported_versions(stack) -> list[str]:
    models = stack.storage / "models" / "linear_regression"
    return sorted((p.name for p in models.iterdir() if p.name.isdigit()), key=int) if models.is_dir() else []


def test_a_scheduled_dag_runs_by_itself_once_unpaused(stack):
    api = stack.api
    dag_id = "tf_stack_hourly"
    dag = api.wait_for_dag(dag_id)
    assert dag["is_paused"], "new DAGs start paused, so nothing ran before the user turned it on"
    assert api.runs(dag_id) == []
    api.unpause(dag_id)

    run = None
    for _ in range(120):
        runs = api.runs(dag_id)
        if runs:
            run = api.wait_for_run(dag_id, runs[0]["dag_run_id"], timeout=180)
            break
        time.sleep(1)
    assert run is not None, "the scheduler created no run within two minutes of unpausing"
    assert run["run_type"] == "scheduled" and run["state"] == "success", run
    records = [json.loads(p.read_text()) for p in (stack.storage / "scheduled-runs").glob("*.json")]
    assert [r["run_id"] for r in records] == [run["dag_run_id"]]


# The stack's start counts into the first test that uses it, and a loaded machine is slow.
@pytest.mark.timeout(2400)
def test_a_user_triggers_the_dag_in_the_web_ui_sees_it_succeed_and_its_model_is_served(stack, signed_in_page):
    """A person in the UI: opens the DAG, types the run parameters into the trigger dialog,
    triggers it and watches the run page until its state badge reads Success or Failed. The run
    waited for its workers on the triggerer and exported a model that predicts 2x + 10."""
    page = signed_in_page
    api = stack.api
    api.wait_for_dag(DAG_ID)
    api.unpause(DAG_ID)  # a run of a paused DAG would wait in the queue
    before = exported_versions(stack)
    screenshot = stack.artifacts / "ui-dag-run-success.png"
    screenshot.unlink(missing_ok=True)

    # Triggering: the DAG page's Trigger button, the dialog's Run Parameters form, then the
    # dialog's own Trigger button (a single run).
    page.goto(f"{stack.airflow.url}/dags/{DAG_ID}")
    page.get_by_role("button", name="Trigger Dag").click()
    dialog = page.get_by_role("dialog")
    for name, value in SMALL_RUN.items():
        # The label reads "steps *" for a required param.
        dialog.get_by_label(re.compile(rf"^{re.escape(name)}\W*$")).fill(str(value))
    dialog.get_by_role("button", name="Trigger", exact=True).click()
    page.wait_for_url(lambda url: f"/dags/{DAG_ID}/runs/" in url)
    run_id = unquote(urlparse(page.url).path.split("/runs/", 1)[1])

    # Watching: the run page's header badge; reload now and then in case polling stalls.
    badge = page.get_by_test_id("header-card").get_by_test_id("state-badge")
    deadline = time.monotonic() + 420
    reloaded = time.monotonic()
    state = ""
    while time.monotonic() < deadline:
        try:
            state = badge.inner_text(timeout=10_000).strip()
        except PlaywrightTimeoutError:
            state = ""
        if state in ("Success", "Failed"):
            break
        page.wait_for_timeout(2_000)
        if time.monotonic() - reloaded > 30:
            page.reload()
            reloaded = time.monotonic()
    page.screenshot(path=str(screenshot), full_page=True)

    assert state == "Success", f"the run page shows {state!r}:\n{api.failure_report(DAG_ID, run_id)}"
    run = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")
    assert run["state"] == "success" and run["run_type"] == "manual", run
    assert run["triggering_user_name"] == "admin"
    assert run["conf"] == SMALL_RUN, "the values typed into the Run Parameters form reached the run"
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(exported_versions(stack)) == len(before) + 1, "the UI's run exported a new model version"
    tis = api.task_instances(DAG_ID, run_id)
    assert {t: ti["state"] for t, ti in tis.items()} == {t: "success" for t in tis}
    assert {"prepare", "training.launch", "training.wait_for_workers", "training.teardown", "training.evaluate",
            "training.export"} <= set(tis)

    # The sensor handed its wait to the triggerer: deferred while the workers trained, then
    # resumed by the trigger's event (the triggerer's lines are part of the task log).
    sensor = tis["training.wait_for_workers"]
    log = api.task_log(DAG_ID, run_id, "training.wait_for_workers", sensor["try_number"])
    assert "Pausing task as DEFERRED" in log and "Trigger fired event" in log, log[-3000:]

    # The blessed model is served from <storage>/models/<name>/<version>/ and predicts 2x + 10.
    export = stack.storage / "models" / "linear_regression" / exported_versions(stack)[-1]
    assert (export / "saved_model.pb").is_file()
    assert predict(str(export), {"x": [0.0, 1.0, 5.0]}) == pytest.approx([10.0, 12.0, 20.0], abs=0.5)
