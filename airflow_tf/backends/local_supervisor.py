"""The supervisor of one local training group: ``python -m airflow_tf.backends.local_supervisor <group dir>``.

Started (detached) by :meth:`LocalBackend.launch`. It picks free ports on 127.0.0.1, starts
every task with its TF_CONFIG, applies the restart policies and the group's backoff limit,
restarts the whole group when a parameter server dies (the workers restore the latest
checkpoint by themselves), fails the group at its active deadline, follows the chief's
progress, writes the state file atomically, and stops tasks on teardown requests.

No orphans: every task is started with ``PR_SET_PDEATHSIG = SIGKILL`` from this (single-
threaded) process, so if the supervisor dies, even by SIGKILL, the kernel kills its tasks.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_tf.cluster import (
    GroupSpec, GroupStatus, Phase, TaskStatus, cluster_def, describe_exit, evaluate, is_retryable_exit,
    task_name, tf_config_json,
)
from airflow_tf.cluster.progress import describe, parse_progress

from .local import (
    STATE_DIR_ENV, STOP_GRACE, GroupDir, is_running, process_start_time, read_json, tail_text, write_json_atomic,
)

TICK = 0.25
"""Longest sleep between checks; child exits and teardown requests wake the loop at once."""
WAKE_SIGNALS = {signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
PR_SET_PDEATHSIG = 1
PROGRESS_TAIL_BYTES = 64 * 1024

_libc = ctypes.CDLL(None, use_errno=True)


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports nobody listens on right now (held together so none repeats)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def last_line(path: Path) -> str | None:
    lines = [line.strip() for line in tail_text(path, 20).splitlines() if line.strip()]
    return lines[-1] if lines else None


@dataclass
class Task:
    role: str
    index: int
    name: str
    restart_policy: str
    port: int = 0
    phase: Phase = Phase.PENDING
    restarts: int = 0
    exit_code: int | None = None
    reason: str | None = None
    proc: subprocess.Popen | None = None
    start_time: int | None = None
    deleted: bool = False

    def status(self) -> TaskStatus:
        return TaskStatus(self.role, self.index, self.name, self.phase, self.restarts, self.exit_code, self.reason)

    @property
    def terminal(self) -> bool:
        return self.proc is None and self.phase in (Phase.SUCCEEDED, Phase.FAILED)


class Supervisor:
    def __init__(self, group: GroupDir) -> None:
        self.group = group
        saved = read_json(group.spec)
        self.spec = GroupSpec.from_dict(saved["spec"])
        self.owner = saved.get("owner")
        self.tasks = [
            Task(role, index, task_name(self.spec.name, role, index), self.spec.roles[role].restart_policy)
            for role, index in self.spec.tasks()
        ]
        self.chief = next(t for t in self.tasks if (t.role, t.index) == self.spec.chief_task())
        self.restarts = 0
        self.failure: str | None = None
        self.progress: dict[str, Any] | None = None
        self.progress_size = -1
        self.started = time.monotonic()
        self.pid = os.getpid()
        self.start_time = process_start_time(self.pid)
        self.running = True
        self.last_written: Any = None

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, WAKE_SIGNALS)
        self.write_state()
        self.start(self.tasks, new_ports=True)
        self.write_state()
        while self.running:
            signum = signal.sigtimedwait(WAKE_SIGNALS, TICK)
            if signum is not None and signum.si_signo in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                self.shutdown(f"the supervisor received {signal.Signals(signum.si_signo).name}")
                break
            self.reap()
            self.serve_requests()
            self.check_deadline()
            self.check_owner()
            self.read_progress()
            if all(t.terminal or t.deleted for t in self.tasks):
                self.running = False
            self.write_state()
        self.write_state()

    # -- tasks ------------------------------------------------------------------------------
    def start(self, tasks: list[Task], new_ports: bool = False) -> None:
        if new_ports:
            for task, port in zip(tasks, free_ports(len(tasks))):
                task.port = port
        cluster = cluster_def(self.spec, lambda role, index: f"127.0.0.1:{self.task(role, index).port}")
        for task in tasks:
            self.launch(task, cluster)

    def task(self, role: str, index: int) -> Task:
        return next(t for t in self.tasks if t.role == role and t.index == index)

    def launch(self, task: Task, cluster: dict[str, list[str]]) -> None:
        role_spec = self.spec.roles[task.role]
        env = dict(os.environ, **role_spec.env)
        env.update(TF_CONFIG=tf_config_json(cluster, task.role, task.index), PYTHONUNBUFFERED="1",
                   AIRFLOW_TF_GROUP=self.spec.name, AIRFLOW_TF_TASK=task.name)
        log_path = self.group.log(task.role, task.index)
        with open(log_path, "ab") as log:
            if task.restarts:
                log.write(f"--- airflow-tf: restart {task.restarts} of {task.name} ---\n".encode())
                log.flush()
            command = self.spec.command(task.role, python=sys.executable)
            try:
                task.proc = subprocess.Popen(
                    command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, preexec_fn=_die_with_parent(self.pid),
                )
            except OSError as err:  # a command that does not exist cannot be retried into existence
                task.phase, task.proc = Phase.FAILED, None
                task.reason = f"cannot start {command[0]!r}: {err.strerror}; check roles.{task.role}.command"
                return
        task.start_time = process_start_time(task.proc.pid)
        task.phase, task.exit_code = Phase.RUNNING, None

    def stop(self, tasks: list[Task]) -> None:
        """SIGTERM, then SIGKILL after a short grace; returns when every one is reaped."""
        live = [t for t in tasks if t.proc is not None]
        for t in live:
            _kill_group(t.proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while any(t.proc.poll() is None for t in live) and time.monotonic() < deadline:
            time.sleep(0.01)
        for t in live:
            if t.proc.poll() is None:
                _kill_group(t.proc, signal.SIGKILL)
                t.proc.wait()
            t.exit_code, t.proc = t.proc.returncode, None

    def reap(self) -> None:
        for task in self.tasks:
            if task.proc is None or task.proc.poll() is None:
                continue
            code = task.proc.returncode
            task.proc, task.exit_code = None, code
            self.exited(task, code)

    def exited(self, task: Task, code: int) -> None:
        if code == 0:
            task.phase = Phase.SUCCEEDED  # a reason left from a restart still says why it restarted
            return
        why = describe_exit(code)
        line = last_line(self.group.log(task.role, task.index))
        if line:
            why += f"; last log line: {line}"
        if task.role == "ps" and self.succeeded():
            # Nothing needs a parameter server once training is done.
            task.phase, task.reason = Phase.SUCCEEDED, f"stopped after training finished ({why})"
            return
        if not is_retryable_exit(task.restart_policy, code):
            task.phase, task.reason = Phase.FAILED, f"{why} (restart policy {task.restart_policy})"
            return
        if self.restarts >= self.spec.backoff_limit:
            task.phase = Phase.FAILED
            task.reason = f"{why}; the group's backoff limit of {self.spec.backoff_limit} restart(s) is used up"
            return
        self.restarts += 1
        task.phase, task.reason = Phase.RESTARTING, why
        if task.role == "ps":
            # The variables lived on that ps: restart every unfinished task from the checkpoint.
            others = [t for t in self.tasks if t is not task and not t.deleted and t.phase is not Phase.SUCCEEDED]
            self.stop(others)
            group = [task, *others]
            for t in group:
                t.restarts += 1
                t.reason = f"group restarted: {task.name} {why}" if t is not task else why
            self.start(group, new_ports=True)
        else:
            task.restarts += 1
            self.start([task])

    def succeeded(self) -> bool:
        return evaluate(self.status(), self.spec.success_policy).succeeded

    # -- group-level events -----------------------------------------------------------------
    def shutdown(self, failure: str | None) -> None:
        """Stop every task; the group fails with ``failure`` unless it had already succeeded."""
        done = self.succeeded()
        live = [t for t in self.tasks if t.proc is not None]
        self.stop(live)
        for t in live:
            if t.role == "ps" and done:
                t.phase, t.reason = Phase.SUCCEEDED, "stopped after training finished"
            else:
                t.phase, t.reason = Phase.FAILED, f"stopped: {failure}"
        if failure and not done:
            self.failure = self.failure or failure
        self.running = False

    def check_deadline(self) -> None:
        limit = self.spec.active_deadline_seconds
        if limit is not None and self.running and time.monotonic() - self.started >= limit:
            self.shutdown(f"the active deadline of {limit:g} s passed ({describe(self.progress)}); "
                          "raise active_deadline_seconds or train for fewer steps")

    def check_owner(self) -> None:
        if self.owner and self.running and not is_running(self.owner["pid"], self.owner["start_time"]):
            self.shutdown(f"the launching process (pid {self.owner['pid']}) exited, so its group was stopped")

    def serve_requests(self) -> None:
        pending = sorted(self.group.requests.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for path in pending:
            answer = path.with_suffix(".done")
            if answer.exists():
                continue
            roles = read_json(path)["roles"]
            chosen = [t for t in self.tasks if not t.deleted and (roles is None or t.role in roles)]
            self.stop(chosen)
            for t in chosen:
                t.deleted = True
            if roles is None:
                self.running = False
            self.write_state()
            write_json_atomic(answer, {"deleted": [t.name for t in chosen]})

    def read_progress(self) -> None:
        path = self.group.log(self.chief.role, self.chief.index)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return
        if size == self.progress_size:
            return
        self.progress_size = size
        with open(path, "rb") as f:
            f.seek(max(0, size - PROGRESS_TAIL_BYTES))
            found = parse_progress(f.read().decode("utf-8", "replace"))
        if found:
            self.progress = found

    # -- state ------------------------------------------------------------------------------
    def status(self) -> GroupStatus:
        return GroupStatus(name=self.spec.name, tasks=[t.status() for t in self.tasks if not t.deleted],
                           failure=self.failure, progress=self.progress)

    def write_state(self) -> None:
        state = {
            "supervisor": {"pid": self.pid, "start_time": self.start_time,
                           "state": "running" if self.running else "exited"},
            "status": self.status().to_dict(),
            "processes": {
                t.name: {"pid": t.proc.pid, "start_time": t.start_time, "port": t.port}
                for t in self.tasks if t.proc is not None
            },
            "restarts": self.restarts,
        }
        if state != self.last_written:
            write_json_atomic(self.group.state, state)
            self.last_written = state


def _kill_group(proc: subprocess.Popen, signum: int) -> None:
    """Signal the task and anything it started (each task leads its own process group)."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass


def _die_with_parent(parent: int):
    def setup() -> None:
        # Runs in the forked child before exec: die when the supervisor dies.
        if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(70)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, WAKE_SIGNALS)

    return setup


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m airflow_tf.backends.local_supervisor <group directory>", file=sys.stderr)
        return 2
    group = GroupDir(Path(args[0]))
    if not group.exists():
        print(f"{group.spec} does not exist: not a group directory", file=sys.stderr)
        return 2
    # Detach: the launcher waits for this first process only; the daemon below is
    # reparented away from it and lives on in its own session.
    if os.fork():
        os._exit(0)
    os.environ.setdefault(STATE_DIR_ENV, str(group.path.parent))
    supervisor = Supervisor(group)
    try:
        supervisor.run()
    except BaseException:
        supervisor.shutdown("the supervisor crashed; see supervisor.log")
        supervisor.write_state()
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
