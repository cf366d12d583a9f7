"""Faults and abuse of a local training group, with real TensorFlow tasks on gRPC: each case
asserts what the user sees, that nothing is lost, and that nothing is left running
(the ``local_state_dir`` fixture fails a test that leaves a process of its groups).
docs/reference/faults.md ("Local group") lists these cases."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from processes import can_connect, environ_of, external_address

from airflow_tf.backends import BackendError
from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.wait import completion_event, wait_for_group
from airflow_tf.cluster import GroupSpec, OutcomeCode, Phase, TrainingConfig
from airflow_tf.files import read_json

pytestmark = pytest.mark.slow

SESSION_READY = re.compile(r"airflow-tf session ready global_step=(\d+)")
SECRETS = {
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow:hunter2@db/airflow",
    "AIRFLOW__API_AUTH__JWT_SECRET": "jwt-secret-value",
    "AIRFLOW_CONN_WAREHOUSE": "postgres://user:pw@warehouse/db",
    "AIRFLOW_VAR_API_TOKEN": "token-value",
    "DATABASE_URL": "postgresql://app:pw@db/app",
}


def linear_group(name: str, dataset: str, run_dir: Path, steps: int, workers: int = 2, **options) -> GroupSpec:
    config = TrainingConfig(dataset=dataset, run_dir=str(run_dir), steps=steps, batch_size=32, learning_rate=0.05,
                            checkpoint_every_secs=0.5, log_every_secs=0.3)
    return GroupSpec.for_training(name, config, ps=1, workers=workers, **options)


def training(backend, ref, index: int) -> bool:
    return bool(SESSION_READY.search(backend.logs(ref, "worker", index)))


def launcher(state_dir: Path, spec: GroupSpec, hand_over: bool) -> subprocess.Popen:
    """A process that launches ``spec`` as an Airflow launch task does, optionally hands the
    group over and exits (as the task returns), or else waits to be killed."""
    code = textwrap.dedent(f"""
        import json, sys, time
        from airflow_tf.backends.local import LocalBackend
        from airflow_tf.cluster import GroupSpec
        backend = LocalBackend({str(state_dir)!r})
        ref = backend.launch(GroupSpec.from_dict(json.loads(sys.argv[1])))
        print('launched', flush=True)
        if {hand_over!r}:
            backend.hand_over(ref)
        else:
            time.sleep(600)
        """)
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(spec.to_dict())], stdout=subprocess.PIPE, text=True)


def test_nothing_reaches_the_group_from_outside_and_tasks_hold_no_secrets(local_state_dir, linear_dataset, tmp_path,
                                                                          monkeypatch, wait_until):
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    address = external_address()
    backend = LocalBackend()
    ref = backend.launch(linear_group("walled", linear_dataset, tmp_path / "run", steps=600))
    try:
        # A process's environment is fixed when it starts: read it at once, before a worker
        # that has trained its steps can exit.
        pids = wait_until(lambda: len(p := backend.processes(ref)) == 3 and p, 60, what="3 tasks")
        for name, pid in pids.items():
            env = environ_of(pid)
            assert not set(env) & set(SECRETS) and not any(k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_"))
                                                           for k in env), f"{name} holds an Airflow secret"
        wait_until(lambda: training(backend, ref, 0) and training(backend, ref, 1), 600, what="both workers to train")
        state = read_json(local_state_dir / "walled" / "state.json", missing_ok=True)
        assert state["isolation"]["network"] == "private"
        ports = {name: task["port"] for name, task in state["processes"].items()}
        assert "walled-ps-0" in ports, "the ps serves until teardown"
        # The probe itself is checked in tests/backends/test_local_safety.py.
        for name, port in ports.items() if address is not None else ():
            assert not can_connect(address, port), f"{name}'s gRPC port is reachable at {address}"
        outcome, status = wait_for_group(backend, ref, timeout=600)
        assert outcome.succeeded, outcome.reason
        assert status.progress["global_step"] >= 600
    finally:
        backend.teardown(ref)
    if address is None:
        pytest.skip("trained isolated, but this machine has no non-loopback address to probe the ports from")


def airflow_tf_run(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "airflow_tf.cli", "run", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_rerun_after_the_launcher_was_sigkilled_starts_afresh_and_keeps_every_attempts_logs(
        local_state_dir, linear_dataset, tmp_path, group_processes, wait_until):
    run_dir = tmp_path / "run"
    args = ("--dataset", linear_dataset, "--run-dir", str(run_dir), "--name", "rerun", "--learning-rate", "0.05")
    first = airflow_tf_run(*args, "--steps", "1000000")
    try:
        backend = LocalBackend()
        wait_until(lambda: (ref := backend.find("rerun")) and training(backend, ref, 0), 600, what="training")
        first.kill()
        first.communicate()
        wait_until(lambda: not group_processes(local_state_dir), 60, what="the group to stop with its launcher")
    finally:
        first.kill()
    first_log = (run_dir / "logs" / "attempt-1" / "rerun-worker-0.log").read_text()
    assert SESSION_READY.search(first_log), "the killed attempt's logs are copied to the run directory"

    # More workers than cores this time: a warning on stderr, and the run goes ahead.
    workers = len(os.sched_getaffinity(0)) + 1
    second = airflow_tf_run(*args, "--steps", "300", "--workers", str(workers))
    out, err = second.communicate(timeout=900)
    assert second.returncode == 0, err
    assert f"airflow-tf run: warning: training group 'rerun' has {workers} training tasks for" in err
    assert "NOT network-isolated" not in err
    summary = json.loads(out)
    assert summary["succeeded"] is True and summary["logs"] == str(run_dir / "logs" / "attempt-2")
    assert (run_dir / "logs" / "attempt-1" / "rerun-worker-0.log").read_text() == first_log, "never overwritten"
    assert SESSION_READY.search((run_dir / "logs" / "attempt-2" / f"rerun-worker-{workers - 1}.log").read_text())
    assert os.listdir(local_state_dir) == [], "no stale group state is left"


def test_a_sigstopped_worker_is_restarted_and_training_completes(local_state_dir, linear_dataset, tmp_path, wait_until):
    # The progress watchdog is under test, the net under the health question (test_self_healing.py):
    # the question is off, as for a task that answers it but makes no progress.
    backend = LocalBackend()
    ref = backend.launch(linear_group("frozen", linear_dataset, tmp_path / "run", steps=1500, progress_timeout=15,
                                      health_timeout=None))
    try:
        wait_until(lambda: training(backend, ref, 1), 600, what="worker 1 to train")
        os.kill(backend.processes(ref)["frozen-worker-1"], signal.SIGSTOP)
        outcome, status = wait_for_group(backend, ref, timeout=900)
        assert outcome.succeeded, outcome.reason
        stopped = status.task("worker", 1)
        assert stopped.restarts == 1 and "no progress for 15 s" in stopped.reason
        assert status.progress["global_step"] >= 1500
    finally:
        backend.teardown(ref)


def test_a_stuck_chief_fails_the_group_by_name_once_the_budget_is_spent(local_state_dir, linear_dataset, tmp_path,
                                                                         group_processes, wait_until):
    backend = LocalBackend()
    # The chief alone: a second worker would only burn CPU training on while the bound runs out.
    ref = backend.launch(linear_group("stuck", linear_dataset, tmp_path / "run", steps=1_000_000, workers=1,
                                      progress_timeout=15, backoff_limit=0, health_timeout=None))
    try:
        wait_until(lambda: backend.status(ref).progress, 600, what="the chief's first progress report")
        os.kill(backend.processes(ref)["stuck-worker-0"], signal.SIGSTOP)  # alive, but no step ever ends
        outcome, _ = wait_for_group(backend, ref, timeout=600)
        assert not outcome.succeeded and outcome.failed_task.name == "stuck-worker-0"
        assert outcome.code is OutcomeCode.NO_PROGRESS
        assert "15 s" in outcome.reason and "backoff limit of 0" in outcome.reason
        wait_until(lambda: not group_processes(local_state_dir), 60, what="the rest of the group to stop by itself")
    finally:
        backend.teardown(ref)


def test_a_launch_killed_after_creating_its_group_takes_the_group_with_it(local_state_dir, linear_dataset, tmp_path,
                                                                          group_processes, wait_until):
    launch = launcher(local_state_dir, linear_group("orphan", linear_dataset, tmp_path / "run", steps=1_000_000),
                      hand_over=False)
    try:
        assert launch.stdout.readline().strip() == "launched"
        backend = LocalBackend()
        ref = backend.find("orphan")
        wait_until(lambda: len(backend.processes(ref)) == 3, 300, what="the group's tasks")
    finally:
        launch.kill()
        launch.communicate()
    wait_until(lambda: not group_processes(local_state_dir), 60, what="the group to stop with its launch")
    status = backend.status(ref)
    assert f"launching process (pid {launch.pid}) exited before handing the group over" in status.failure
    backend.teardown(ref)


def test_the_supervisor_stops_the_ps_after_the_workers_with_no_airflow_left(local_state_dir, linear_dataset, tmp_path,
                                                                           group_processes, wait_until):
    run_dir = tmp_path / "run"
    launch = launcher(local_state_dir, linear_group("unattended", linear_dataset, run_dir, steps=300), hand_over=True)
    assert launch.wait(timeout=300) == 0, "the launch hands the group over and returns"
    # Nobody watches from here on: no sensor, no teardown.
    wait_until(lambda: not group_processes(local_state_dir), 900, what="the whole group to end by itself")
    backend = LocalBackend()
    ref = backend.find("unattended")
    status = backend.status(ref)
    ps = status.task("ps", 0)
    assert ps.phase is Phase.SUCCEEDED and ps.reason.startswith("stopped by the supervisor 5 s after the workers")
    event = completion_event(backend, ref, status, ref.success_policy)
    assert event["status"] == "success" and event["counts"]["worker"]["Succeeded"] == 2
    assert sorted(p.name for p in (run_dir / "logs" / "attempt-1").iterdir()) == [
        "unattended-ps-0.log", "unattended-supervisor.log", "unattended-worker-0.log", "unattended-worker-1.log"]
    backend.teardown(ref)


def test_fifty_workers_on_this_machine_are_refused_with_the_numbers(local_state_dir, linear_dataset, tmp_path,
                                                                    group_processes):
    config = TrainingConfig(dataset=linear_dataset, run_dir=str(tmp_path / "run"), steps=10)
    with pytest.raises(BackendError) as refused:
        LocalBackend().launch(GroupSpec.for_training("crowd", config, ps=1, workers=50))
    assert re.search(r"needs about 26112 MiB \(1 ps x 512 MiB, 50 worker x 512 MiB\) but this machine has only "
                     r"\d+ MiB available \(MemAvailable in /proc/meminfo\)", str(refused.value))
    assert not group_processes(local_state_dir)
    assert not local_state_dir.exists() or os.listdir(local_state_dir) == []
