"""Real TensorFlow groups on the local backend: faults mid-training, and ``airflow-tf run``
from launch to teardown on every path (success, failure, SIGTERM, SIGKILL)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.wait import wait_for_group
from airflow_tf.cluster import GroupSpec, TrainingConfig

pytestmark = pytest.mark.slow

SESSION_READY = re.compile(r"airflow-tf session ready global_step=(\d+)")


def linear_group(name: str, dataset: str, run_dir: Path, steps: int, **training) -> GroupSpec:
    config = TrainingConfig(dataset=dataset, run_dir=str(run_dir), steps=steps, batch_size=32,
                            learning_rate=0.05, checkpoint_every_secs=0.5, log_every_secs=0.3, **training)
    return GroupSpec.for_training(name, config, ps=1, workers=2)


def checkpoint_step(run_dir: Path) -> int:
    """Global step of the newest checkpoint the chief wrote (0 if none yet)."""
    try:
        text = (run_dir / "checkpoint").read_text()
    except FileNotFoundError:
        return 0
    found = re.search(r'^model_checkpoint_path: ".*?-(\d+)"', text, re.M)
    return int(found.group(1)) if found else 0


def training_step(backend, ref) -> int:
    progress = backend.status(ref).progress
    return progress["global_step"] if progress else 0


def test_killed_chief_worker_resumes_from_the_checkpoint(local_state_dir, linear_dataset, tmp_path, wait_until,
                                                         monkeypatch):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    backend = LocalBackend()
    run_dir = tmp_path / "run"
    ref = backend.launch(linear_group("killchief", linear_dataset, run_dir, steps=1500))
    try:
        wait_until(lambda: checkpoint_step(run_dir) > 0, 60, what="a first checkpoint")
        os.kill(backend.processes(ref)["killchief-worker-0"], signal.SIGKILL)

        outcome, status = wait_for_group(backend, ref, timeout=120)
        assert outcome.succeeded, outcome.reason
        chief = status.task("worker", 0)
        assert chief.restarts == 1 and "killed by SIGKILL" in chief.reason
        starts = [int(s) for s in SESSION_READY.findall(backend.logs(ref, "worker", 0))]
        assert len(starts) == 2 and starts[1] > 0, f"the restarted chief did not restore: {starts}"
        assert status.progress["global_step"] >= 1500
        assert checkpoint_step(run_dir) >= 1500
    finally:
        backend.teardown(ref)
    # The killed chief's temporary files (autograph's) went with it, as the others' did.
    assert os.listdir(temporary) == []


def test_killed_ps_restarts_the_group_from_the_checkpoint(local_state_dir, linear_dataset, tmp_path, wait_until):
    backend = LocalBackend()
    run_dir = tmp_path / "run"
    ref = backend.launch(linear_group("killps", linear_dataset, run_dir, steps=1500))
    try:
        # Both workers are training (each opened its session) and a checkpoint exists.
        wait_until(lambda: all(SESSION_READY.search(backend.logs(ref, "worker", i)) for i in (0, 1)), 60,
                   what="both workers to train")
        saved = wait_until(lambda: checkpoint_step(run_dir), 60, what="a first checkpoint")
        before = backend.processes(ref)
        # The workers hold still while the ps dies: on a loaded machine they could otherwise reach
        # the last step between the checkpoint seen and the kill, leaving nothing to restart.
        workers = [before[f"killps-worker-{i}"] for i in (0, 1)]
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        assert checkpoint_step(run_dir) < 1500, "training ended before the ps could be killed"
        os.kill(before["killps-ps-0"], signal.SIGKILL)
        for pid in workers:
            os.kill(pid, signal.SIGCONT)

        outcome, status = wait_for_group(backend, ref, timeout=120)
        assert outcome.succeeded, outcome.reason
        assert [t.restarts for t in status.tasks] == [1, 1, 1]
        for index in (0, 1):
            starts = [int(s) for s in SESSION_READY.findall(backend.logs(ref, "worker", index))]
            assert len(starts) == 2, starts
        chief_starts = [int(s) for s in SESSION_READY.findall(backend.logs(ref, "worker", 0))]
        assert chief_starts[1] >= saved, "the restarted group lost checkpointed steps"
        assert status.progress["global_step"] >= 1500
    finally:
        backend.teardown(ref)


# -- airflow-tf run ---------------------------------------------------------------------------
def airflow_tf_run(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "airflow_tf.cli", "run", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def test_run_trains_and_leaves_nothing_behind(local_state_dir, linear_dataset, tmp_path, group_processes):
    run_dir, temporary = tmp_path / "run", tmp_path / "tmp"
    temporary.mkdir()
    cli = airflow_tf_run("--dataset", linear_dataset, "--ps", "1", "--workers", "2", "--steps", "400",
                         "--learning-rate", "0.05", "--run-dir", str(run_dir), "--name", "cli-ok",
                         env={**os.environ, "TMPDIR": str(temporary)})
    out, err = cli.communicate(timeout=180)
    assert cli.returncode == 0, err
    summary = json.loads(out)
    assert summary["succeeded"] is True and summary["group"] == "cli-ok"
    assert summary["global_step"] >= 400 and math.isfinite(summary["loss"])
    assert Path(summary["checkpoint"] + ".index").exists()
    assert "global step" in err, "progress is shown while training"
    assert summary["logs"] == str(run_dir / "logs" / "attempt-1")
    logs = sorted(p.name for p in Path(summary["logs"]).iterdir())
    assert logs == ["cli-ok-ps-0.log", "cli-ok-supervisor.log", "cli-ok-worker-0.log", "cli-ok-worker-1.log"]
    # The two workers share this machine's cores: each runs its ops on half of them.
    from airflow_tf.data.cpus import usable_cpus

    for worker in ("cli-ok-worker-0.log", "cli-ok-worker-1.log"):
        started = Path(summary["logs"], worker).read_text()
        assert f"intra_op_threads={max(1, usable_cpus() // 2)} " in started, started[-2000:]
    assert not group_processes(local_state_dir)
    assert os.listdir(local_state_dir) == [], "the finished group is deleted"
    # TensorFlow's temporary files (autograph's converted functions) went with the tasks.
    assert os.listdir(temporary) == []


def test_run_reports_the_failed_task_with_its_last_log_lines(local_state_dir, linear_dataset, tmp_path,
                                                             group_processes):
    cli = airflow_tf_run("--dataset", linear_dataset, "--model", "no_such_module:build", "--steps", "100",
                         "--run-dir", str(tmp_path / "run"), "--name", "cli-bad")
    out, err = cli.communicate(timeout=180)
    assert cli.returncode == 1
    summary = json.loads(out)
    assert summary["succeeded"] is False and summary["failed_task"].startswith("cli-bad-worker-")
    assert "exit code" in summary["reason"] and "no_such_module" in summary["reason"]
    assert f"log lines of {summary['failed_task']}:" in err and "no_such_module" in err.split("log lines of")[1]
    assert not group_processes(local_state_dir)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_run_killed_mid_training_takes_its_group_with_it(signum, local_state_dir, linear_dataset, tmp_path,
                                                         group_processes, wait_until):
    cli = airflow_tf_run("--dataset", linear_dataset, "--steps", "1000000", "--run-dir", str(tmp_path / "run"),
                         "--name", "cli-killed")
    try:
        wait_until(lambda: LocalBackend().status(LocalBackend().find("cli-killed")).progress
                   if LocalBackend().find("cli-killed") else None, 90, what="training to start")
        assert len(group_processes(local_state_dir)) >= 5  # the CLI, supervisor, ps, 2 workers
        killed_at = time.monotonic()
        cli.send_signal(signum)
        cli.wait(timeout=30)
        wait_until(lambda: not group_processes(local_state_dir), 30, what="every process of the group to stop")
        gone_after = time.monotonic() - killed_at
    finally:
        cli.kill()
        cli.communicate()
    assert gone_after < 15, f"the group took {gone_after:.1f} s to stop"  # not the 600 s of a forgotten group
    if signum == signal.SIGTERM:
        assert cli.returncode == 128 + signal.SIGTERM
        assert os.listdir(local_state_dir) == [], "SIGTERM deletes the group"
    else:
        status = LocalBackend().status(LocalBackend().find("cli-killed"))
        assert "launching process" in status.failure and "exited" in status.failure
        LocalBackend().teardown(LocalBackend().find("cli-killed"))


def test_run_refuses_a_dataset_without_success_marker(local_state_dir, tmp_path, group_processes):
    dataset = tmp_path / "datasets" / "half" / "1"
    (dataset / "train").mkdir(parents=True)
    (dataset / "schema.json").write_text("{}")
    cli = airflow_tf_run("--dataset", str(dataset), "--steps", "10", "--run-dir", str(tmp_path / "run"))
    out, err = cli.communicate(timeout=60)
    assert cli.returncode != 0 and out == ""
    assert str(dataset) in err and "_SUCCESS" in err
    assert not group_processes(local_state_dir)
    assert not local_state_dir.exists() or os.listdir(local_state_dir) == []
    assert not (tmp_path / "run").exists(), "nothing is created for a refused run"
