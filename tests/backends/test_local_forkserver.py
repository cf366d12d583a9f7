"""A local group's fork server: the trainers are forked from one process that loaded TensorFlow
for them, remain the supervisor's children (restarted, reaped and killed with it as before), and
a group whose fork server is lost starts its tasks by themselves."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.local.forkserver import ForkServer, ForkServerError, forkable
from airflow_tf.cluster import GroupSpec, TrainingConfig
from processes import environ_of

FORK_WARNING_IS_ERROR = "error:This process:DeprecationWarning"
"""Python's warning (3.12 on) about forking a process with threads made an error, and only it."""
SESSION_READY = re.compile(r"airflow-tf session ready global_step=(\d+)")


def _config(tmp_path: Path, dataset: str = "/data/linear/1", steps: int = 100) -> TrainingConfig:
    return TrainingConfig(dataset=dataset, run_dir=str(tmp_path / "run"), steps=steps, batch_size=32,
                          learning_rate=0.05, checkpoint_every_secs=0.5, log_every_secs=0.3)


def test_trainers_are_forked_and_a_role_with_its_own_loading_settings_or_command_is_not(tmp_path):
    spec = GroupSpec.for_training("fs", _config(tmp_path), ps=1, workers=2,
                                  role_options={"worker": {"env": {"COLOR": "blue"}}})
    assert forkable(spec, "worker") and not forkable(spec, "ps")
    for env in ({"TF_ENABLE_ONEDNN_OPTS": "0"}, {"KERAS_BACKEND": "jax"}, {"PYTHONPATH": "/models"},
                {"OMP_NUM_THREADS": "1"}):
        own = GroupSpec.for_training("fs", _config(tmp_path), ps=1, workers=2, role_options={"worker": {"env": env}})
        assert not forkable(own, "worker"), f"a worker with {env} must load TensorFlow with it"
    spec.roles["worker"].command = ["python", "-c", "pass"]
    assert not forkable(spec, "worker")


def _proc(pid: int, what: str) -> str:
    with open(f"/proc/{pid}/{what}", "rb") as f:
        return f.read().replace(b"\0", b" ").decode().strip()


def _parent(pid: int) -> int:
    return int(_proc(pid, "stat").rsplit(")", 1)[1].split()[1])


def _fork_server(pids: list[int], supervisor: int) -> int | None:
    """The supervisor's fork server among ``pids`` (its forked tasks show its command line too,
    under their role's name)."""
    for pid in pids:
        try:
            if _parent(pid) == supervisor and _proc(pid, "comm") == "python" \
                    and "airflow_tf.runtime.forkserver" in _proc(pid, "cmdline"):
                return pid
        except FileNotFoundError:  # gone while looked at
            continue
    return None


@pytest.mark.slow
def test_forked_trainers_restart_die_with_their_supervisor_and_a_lost_fork_server_is_replaced_by_plain_starts(
        local_state_dir, linear_dataset, tmp_path, group_processes, wait_until):
    backend = LocalBackend()
    ref = backend.launch(GroupSpec.for_training("fs", _config(tmp_path, linear_dataset, 10_000_000), ps=1, workers=2))
    try:
        supervisor = backend.supervisor_pid(ref)
        pids = wait_until(lambda: len(p := backend.processes(ref)) == 3 and p, 120, what="3 tasks")
        wait_until(lambda: all(SESSION_READY.search(backend.logs(ref, "worker", i)) for i in (0, 1)), 300,
                   what="both workers to train")
        for index in (0, 1):
            worker = pids[f"fs-worker-{index}"]
            assert "TF_CONFIG" not in environ_of(worker), "a trainer is forked: /proc shows the server's environment"
            assert _proc(worker, "comm") == f"worker-{index}", "ps and top name a forked task by its role"
            assert _parent(worker) == supervisor, "the supervisor reaps a forked task as its own child"
        assert "TF_CONFIG" in environ_of(pids["fs-ps-0"]), "a ps starts by itself, with its own environment"

        # A killed worker is forked again, its exit status read as for any child.
        os.kill(pids["fs-worker-1"], signal.SIGKILL)
        again = wait_until(lambda: (p := backend.processes(ref).get("fs-worker-1")) not in (None, pids["fs-worker-1"])
                           and p, 120, what="worker 1 restarted")
        assert "killed by SIGKILL" in (backend.status(ref).task("worker", 1).reason or "")
        assert _proc(again, "comm") == "worker-1"

        # Without its fork server, the group starts a restarted task by itself and trains on.
        server = _fork_server(group_processes(local_state_dir), supervisor)
        assert server is not None
        os.kill(server, signal.SIGKILL)
        os.kill(again, signal.SIGKILL)
        plain = wait_until(lambda: (p := backend.processes(ref).get("fs-worker-1")) not in (None, again) and p, 120,
                           what="worker 1 restarted again")
        assert "TF_CONFIG" in environ_of(plain), "started by itself"
        logged = len(backend.logs(ref, "worker", 1))
        wait_until(lambda: SESSION_READY.search(backend.logs(ref, "worker", 1)[logged:]), 300,
                   what="worker 1 to train again")
        assert "the fork server failed" in Path(local_state_dir, "fs", "supervisor.log").read_text()

        # Killed with its supervisor: nothing of the group is left, forked or not.
        os.kill(supervisor, signal.SIGKILL)
        wait_until(lambda: not group_processes(local_state_dir), 30, what="the group's processes to die")
    finally:
        backend.teardown(ref)


def _exit_status_of(body) -> int:
    from airflow_tf.runtime.forkserver import _exit_as_python_would

    with warnings.catch_warnings():  # pytest's own threads: the child only exits
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        _exit_as_python_would(body)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _raise(error: BaseException):
    def body():
        raise error

    return body


def test_a_forked_task_exits_with_the_status_its_interpreter_would_have():
    """Never as a success after an exception: the fork server's child must not fall through to
    the exit of the process that forked it."""
    assert _exit_status_of(lambda: None) == 0
    assert _exit_status_of(_raise(SystemExit(2))) == 2, "argparse's refusal"
    assert _exit_status_of(_raise(SystemExit("no dataset"))) == 1
    assert _exit_status_of(_raise(RuntimeError("boom"))) == 1
    assert _exit_status_of(_raise(KeyboardInterrupt())) == 1


def _server_saying(tmp_path: Path, script: str) -> ForkServer:
    """A fork server whose interpreter is a shell script: what it prints is the server's output."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\n{script}\nexec cat >/dev/null\n")
    python.chmod(0o755)
    return ForkServer(str(python), os.getpid(), {"PATH": os.environ["PATH"]}, preexec_fn=lambda: None)


def _poll_until_refused(server: ForkServer) -> ForkServerError:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            server.poll_ready()
        except ForkServerError as err:
            return err
        time.sleep(0.05)
    raise AssertionError("the server's line was neither taken nor refused")


def test_a_fork_server_that_prints_what_is_not_its_protocol_is_dropped_not_crashing_the_supervisor(tmp_path):
    """Output that is not a JSON object (a stray print, a traceback) is ForkServerError, on which
    the supervisor starts its tasks by itself, never an exception out of its loop."""
    for first_line in ("Traceback (most recent call last):", "[1, 2]"):
        server = _server_saying(tmp_path, f"echo '{first_line}'")
        try:
            assert "not a JSON object" in str(_poll_until_refused(server)), first_line
        finally:
            server.close()
    # Ready, then an answer to a fork that is not one.
    server = _server_saying(tmp_path, "echo '{\"ready\": true}'; read request; echo '{\"pid\": \"1; rm\"}'")
    try:
        deadline = time.monotonic() + 30
        while not server.poll_ready():
            assert time.monotonic() < deadline, "the ready line was not taken"
            time.sleep(0.05)
        with pytest.raises(ForkServerError, match="pid"):
            server.fork(["--steps", "1"], {}, tmp_path / "task.log", "worker-0")
    finally:
        server.close()


@pytest.mark.slow
def test_while_the_fork_server_loads_the_supervisor_runs_the_ps_and_answers_a_teardown(
        local_state_dir, linear_dataset, tmp_path, group_processes, wait_until):
    """The fork server frozen before it has loaded: the ps runs, the trainers wait for the server,
    and the supervisor still answers a teardown itself, without being killed as unresponsive."""
    from airflow_tf.backends.local.processes import is_running, process_start_time

    backend = LocalBackend()
    ref = backend.launch(GroupSpec.for_training("fs", _config(tmp_path, linear_dataset, 10_000_000), ps=1, workers=2))
    try:
        supervisor = backend.supervisor_pid(ref)
        started = process_start_time(supervisor)
        server = wait_until(lambda: _fork_server(group_processes(local_state_dir), supervisor), 30,
                            what="the fork server", interval=0.01)
        os.kill(server, signal.SIGSTOP)
        wait_until(lambda: "fs-ps-0" in backend.processes(ref), 60, what="the ps to start")
        assert set(backend.processes(ref)) == {"fs-ps-0"}, "no trainer starts before the fork server has loaded"
        assert {t.name: t.phase.value for t in backend.status(ref).tasks if t.role == "worker"} == \
            {"fs-worker-0": "Pending", "fs-worker-1": "Pending"}

        assert sorted(backend.teardown(ref, roles=["worker"])) == ["fs-worker-0", "fs-worker-1"]
        assert is_running(supervisor, started), "the supervisor answered the teardown itself"
        os.kill(server, signal.SIGCONT)
    finally:
        backend.teardown(ref)
    wait_until(lambda: not group_processes(local_state_dir), 30, what="the group's processes to end")


def test_the_fork_server_refuses_arguments_other_than_its_supervisor_group_and_run(capsys):
    from airflow_tf.runtime.forkserver import main

    for args in ([], ["x"], ["12", "--group", "g"], ["12", "group=g", "steps=3"]):
        assert main(args) == 2, args
        assert "usage: python -m airflow_tf.runtime.forkserver <supervisor pid> [group=<group> run=<run>]" in \
            capsys.readouterr().err


def test_the_fork_server_forks_with_one_thread_though_openblas_runs_a_pool_and_counts_any_other():
    """OpenBLAS stops its pool before a fork (its pthread_atfork handler), so the server, which
    imported NumPy, forks single-threaded, and Python (3.12 on) has nothing to warn of; a thread
    of anyone else is counted at the fork, which the server reports instead of forking tasks."""
    code = (
        "import threading, warnings\n"
        "import numpy\n"
        "from airflow_tf.runtime.forkserver import thread_count, threads_at_fork\n"
        "numpy.ones((256, 256)) @ numpy.ones((256, 256))\n"
        "print(thread_count(), threads_at_fork())\n"
        "stop = threading.Event()\n"
        "threading.Thread(target=stop.wait).start()\n"
        "with warnings.catch_warnings():  # Python 3.12 on warns of this fork: its count is what is shown\n"
        "    warnings.simplefilter('ignore', DeprecationWarning)\n"
        "    print(thread_count(), threads_at_fork())\n"
        "stop.set()\n"
    )
    env = dict(os.environ, OPENBLAS_NUM_THREADS="4")
    done = subprocess.run([sys.executable, "-W", FORK_WARNING_IS_ERROR, "-c", code], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (pool, at_fork), (with_thread, at_fork_with_thread) = (map(int, line.split()) for line in done.stdout.splitlines())
    assert pool > 1, "OpenBLAS runs its pool once NumPy has multiplied"
    assert at_fork == 1, "OpenBLAS stopped its pool for the fork"
    assert (with_thread, at_fork_with_thread) == (2, 2), "another thread is there at the fork, and counted"


@pytest.mark.slow
def test_the_fork_server_says_it_is_ready_only_once_it_forks_single_threaded_with_tensorflow_loaded(tmp_path):
    """The real server, TensorFlow and Keras loaded, with OpenBLAS's pool running and Python's
    warning about forking with threads made an error: it says it is ready (it checks that it has
    one thread at a fork before saying so; a warning would have ended it)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="4", PYTHONWARNINGS=FORK_WARNING_IS_ERROR)
    server = ForkServer(sys.executable, os.getpid(), env, preexec_fn=lambda: None)
    try:
        deadline = time.monotonic() + 300
        while not server.poll_ready():
            assert time.monotonic() < deadline, "the fork server did not load"
            time.sleep(0.1)
    finally:
        server.close()
