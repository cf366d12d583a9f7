"""DAG runs through Airflow's own components, the way users run them: a REST API v2 trigger,
a schedule firing with nobody triggering, and a person in the web UI (headless Chromium)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from airflow_tf.demo import predict

pytestmark = pytest.mark.slow

DAG_ID = "tf_linear_regression"
UI_SCRIPT = Path(__file__).parent / "ui_trigger.mjs"
PLAYWRIGHT = Path(__file__).parent / "node_modules" / "playwright-core"
# Enough steps for the seed's y = 2x + 10 to pass the DAG's mse <= 1.0 blessing threshold.
SMALL_RUN = {"steps": 1500, "rows": 5000}


def exported_versions(stack) -> list[str]:
    models = stack.storage / "models" / "linear_regression"
    return sorted((p.name for p in models.iterdir() if p.name.isdigit()), key=int) if models.is_dir() else []


def test_rest_triggered_run_trains_defers_on_the_triggerer_and_exports_a_model(stack):
    api = stack.api
    api.wait_for_dag(DAG_ID)
    api.unpause(DAG_ID)
    run_id = api.trigger(DAG_ID, conf=SMALL_RUN)
    seen: dict[str, set] = {}
    run = api.wait_for_run(DAG_ID, run_id, timeout=420, seen=seen)

    assert run["state"] == "success", api.failure_report(DAG_ID, run_id)
    assert run["run_type"] == "manual" and run["triggered_by"] == "rest_api"
    tis = api.task_instances(DAG_ID, run_id)
    assert {t: ti["state"] for t, ti in tis.items()} == {t: "success" for t in tis}
    assert {"prepare", "launch", "wait_for_workers", "teardown", "evaluate", "export"} <= set(tis)

    # The sensor handed its wait to the triggerer: deferred while the workers trained, then
    # resumed by the trigger's event.
    assert "deferred" in seen["wait_for_workers"], seen["wait_for_workers"]
    sensor = tis["wait_for_workers"]
    log = api.task_log(DAG_ID, run_id, "wait_for_workers", sensor["try_number"])
    assert "Pausing task as DEFERRED" in log, log[-3000:]
    assert "Trigger fired event" in log, "the triggerer's lines are part of the task log:\n" + log[-3000:]

    # The blessed model is served from <storage>/models/<name>/<version>/ and predicts 2x + 10.
    versions = exported_versions(stack)
    assert versions, f"nothing exported under {stack.storage / 'models'}"
    export = stack.storage / "models" / "linear_regression" / versions[-1]
    assert (export / "saved_model.pb").is_file()
    assert predict(str(export), {"x": [0.0, 1.0, 5.0]}) == pytest.approx([10.0, 12.0, 20.0], abs=0.5)


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


def test_a_user_triggers_the_dag_in_the_web_ui_and_sees_it_succeed(stack):
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    assert Path(chromium).exists(), f"{chromium} is missing: ./scripts/test installs Debian's chromium (as root)"
    assert PLAYWRIGHT.is_dir(), (
        f"{PLAYWRIGHT} is missing: ./scripts/test installs it (or run: npm ci --prefix {PLAYWRIGHT.parents[1]})"
    )
    api = stack.api
    api.wait_for_dag(DAG_ID)
    before = exported_versions(stack)
    screenshot = stack.artifacts / "ui-dag-run-success.png"
    screenshot.unlink(missing_ok=True)
    env = dict(
        os.environ,
        AIRFLOW_URL=stack.airflow.url,
        AIRFLOW_USERNAME="admin",
        AIRFLOW_PASSWORD=stack.airflow.password,
        DAG_ID=DAG_ID,
        SCREENSHOT=str(screenshot),
        RUN_TIMEOUT_SECONDS="420",
        PARAMS=json.dumps(SMALL_RUN),
    )
    done = subprocess.run(["node", str(UI_SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"the UI walk-through failed:\n{done.stdout}\n{done.stderr}"
    seen_in_ui = json.loads(done.stdout.strip().splitlines()[-1])

    assert seen_in_ui["state"] == "Success", seen_in_ui
    run = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{seen_in_ui['run_id']}")
    assert run["state"] == "success" and run["run_type"] == "manual", run
    assert run["triggering_user_name"] == "admin"
    assert run["conf"] == SMALL_RUN, "the values typed into the Run Parameters form reached the run"
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(exported_versions(stack)) == len(before) + 1, "the UI's run exported a new model version"
