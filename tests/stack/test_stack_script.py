"""``scripts/stack`` as a person runs it: a component that dies is restarted with nothing of it
left behind, the stack goes on running DAGs, and Ctrl-C stops everything within seconds."""

from __future__ import annotations

import signal
import time

import psutil
import pytest
from airflow_stack import session_members  # scripts/ is on sys.path (conftest.py)

pytestmark = pytest.mark.slow

DAG_ID = "tf_stack_hourly"


# Starting the stack, restarting its scheduler and running a DAG take minutes on a loaded machine.
@pytest.mark.timeout(2400)
def test_a_killed_scheduler_is_restarted_and_ctrl_c_stops_everything_in_seconds(script_stack):
    up = script_stack.wait_for_line(r"Airflow is up at (\S+) \(user (\w+), password (\S+);", timeout=1200)
    url, user, password = up.groups()
    assert url == script_stack.url

    # The scheduler with its LocalExecutor workers (one session): SIGKILL its leader only, as
    # the kernel's OOM killer would. Its workers live on until scripts/stack ends the session.
    scheduler = script_stack.components()["scheduler"]
    old_session = session_members({scheduler.pid})
    assert len(old_session) > 1, "the scheduler has forked its LocalExecutor workers"
    scheduler.send_signal(signal.SIGKILL)

    restarted = script_stack.wait_for_line(r"airflow scheduler \(pid (\d+)\) was killed by SIGKILL; restarted it as pid (\d+)", timeout=120)
    assert int(restarted.group(1)) == scheduler.pid
    new_pid = int(restarted.group(2))
    assert new_pid != scheduler.pid
    script_stack.wait_for_component("scheduler", new_pid, timeout=30)
    left = [p for p in old_session if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"the old scheduler's processes live on: {[p.pid for p in left]}"
    assert script_stack.process.poll() is None, "the rest of the stack kept running"

    # The new scheduler queues work: a DAG triggered through the REST API runs to success.
    api = script_stack.api(user, password)
    api.wait_for_dag(DAG_ID, timeout=240)
    api.unpause(DAG_ID)
    run_id = api.trigger(DAG_ID)
    run = api.wait_for_run(DAG_ID, run_id, timeout=300)
    assert run["state"] == "success", api.failure_report(DAG_ID, run_id)
    api.session.close()

    # Ctrl-C: every component and everything they forked, and the database, end within seconds.
    running = script_stack.processes()
    assert len(running) > 5
    began = time.monotonic()
    script_stack.process.send_signal(signal.SIGINT)
    assert script_stack.process.wait(60) == 0
    took = time.monotonic() - began
    print(f"scripts/stack stopped in {took:.1f}s")
    stopped = script_stack.wait_for_line(r"stopped Airflow in ([\d.]+)s and its database in ([\d.]+)s", timeout=5)
    left = [p for p in running if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes of the stack left running: {[(p.pid, p.name()) for p in left]}"
    assert took < 15, f"stopping took {took:.1f}s (scripts/stack: Airflow {stopped.group(1)}s, database {stopped.group(2)}s)"
