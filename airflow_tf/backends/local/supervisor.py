"""The supervisor of one local training group: ``python -m airflow_tf.backends.local.supervisor <group dir>``.

Started (detached) by :meth:`LocalBackend.launch`. It picks free ports on 127.0.0.1, starts
every task with its TF_CONFIG, applies the restart policies and the backoff limits,
restarts the whole group when a parameter server dies (the workers restore the latest
checkpoint by themselves), fails the group at its active deadline, follows the chief's
progress, writes the state file atomically, and stops tasks on teardown requests.

No orphans: every task is started with ``PR_SET_PDEATHSIG = SIGKILL`` from this (single-
threaded) process, so if the supervisor dies, even by SIGKILL, the kernel kills its tasks.

The trainers are forked by the group's fork server (:mod:`.forkserver`), which loads
TensorFlow once for all of them and their restarts; the supervisor is their subreaper, so they
are its children as the tasks it starts itself are. While the server loads, the supervisor's loop
goes on (the ps run, teardowns are answered); the trainers start once it says it is ready.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_tf.cluster import (
    GroupSpec,
    GroupStatus,
    Phase,
    cluster_def,
    group_outcome,
    is_retryable_exit,
    task_failure_reason,
    task_name,
    tf_config_json,
)
from airflow_tf.cluster.names import GROUP_ENV, RUN_ENV, TASK_ENV
from airflow_tf.cluster.progress import describe, parse_progress
from airflow_tf.cluster.status import GROUP_RESTARTED, OutcomeCode, ReasonCode
from airflow_tf.cluster.spec import TASK_TEMPORARY_DIRECTORY, TRAINERS_ON_THIS_MACHINE
from airflow_tf.files import read_json

from .files import STATE_DIR_ENV, GroupDir, archive_logs, tail_text, write_group_file
from .forkserver import ForkedProcess, ForkServer, ForkServerError, forkable
from .network import isolate_network, isolation_warning
from .processes import (
    STOP_GRACE,
    TaskProcess,
    die_with_parent,
    free_ports,
    is_running,
    kill_group,
    process_start_time,
    remove_temporary_directory,
    temporary_directory,
)
from .watch import HealthQuestions, ProgressWatchdog

TICK = 0.25
"""Longest sleep between checks; child exits and teardown requests wake the loop at once."""
WAKE_SIGNALS = {signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
PR_SET_CHILD_SUBREAPER = 36
PROGRESS_TAIL_BYTES = 64 * 1024

_libc = ctypes.CDLL(None, use_errno=True)


class Supervisor:
    def __init__(self, group: GroupDir) -> None:
        self.group = group
        saved = read_json(group.spec)
        self.spec = GroupSpec.from_dict(saved["spec"])
        self.isolation: dict[str, Any] = {"network": "shared", "warning": None}
        self.done_at: float | None = None
        self.tasks = [
            TaskProcess(role, index, task_name(self.spec.name, role, index), self.spec.roles[role].restart_policy)
            for role, index in self.spec.tasks()
        ]
        self.chief = next(t for t in self.tasks if (t.role, t.index) == self.spec.chief_task())
        self.restarts = 0
        self.failure: str | None = None
        self.failure_code: OutcomeCode | None = None
        self.progress: dict[str, Any] | None = None
        self.progress_size = -1
        self.started = time.monotonic()
        self.pid = os.getpid()
        self.start_time = process_start_time(self.pid)
        self.running = True
        self.last_written: Any = None
        # What watches the running tasks; each replaces a task it finds stalled or stuck.
        self.watchdog = ProgressWatchdog(self.spec, self.tasks, self.chief, self.replace)
        bounds = self.spec.health_bounds()
        self.health = None if bounds is None else HealthQuestions(
            self.spec, self.tasks, self.chief, bounds, child_setup=self.child_setup, replace=self.replace)
        self.forkserver: ForkServer | None = None
        self.waiting: list[tuple[TaskProcess, dict[str, list[str]]]] = []
        """Tasks to fork once the fork server has loaded (the loop goes on meanwhile)."""

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, WAKE_SIGNALS)
        if self.spec.isolate_network:
            refused = isolate_network()
            self.isolation = {"network": "shared" if refused else "private",
                              "warning": isolation_warning(self.spec.name, refused) if refused else None}
            print(self.isolation["warning"] or "network: private namespace, loopback only", flush=True)
        self.write_state()
        # The tasks the fork server forks, and whatever a task leaves behind, are reparented here.
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if any(forkable(self.spec, role) for role in self.spec.roles):
            self.forkserver = ForkServer(sys.executable, self.pid, dict(os.environ, PYTHONUNBUFFERED="1"),
                                         self.child_setup(), group=self.spec.name, run=self.spec.run_name())
        self.start(self.tasks, new_ports=True)
        self.write_state()
        while self.running:
            signum = signal.sigtimedwait(WAKE_SIGNALS, TICK)
            if signum is not None and signum.si_signo in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                self.shutdown(f"the supervisor received {signal.Signals(signum.si_signo).name}",
                              OutcomeCode.SUPERVISOR_LOST)
                break
            self.reap()
            self.launch_waiting()
            self.serve_requests()
            self.check_deadline()
            self.check_owner()
            self.read_progress()
            self.watch()
            self.stop_when_done()
            if all(t.terminal or t.deleted for t in self.tasks):
                self.running = False
            self.write_state()
        if self.health is not None:
            self.health.close()
        if self.forkserver is not None:
            self.forkserver.close()
        self.write_state()
        archive_logs(self.group.path)

    def watch(self) -> None:
        step = (self.progress or {}).get("global_step")
        self.watchdog.note_chief_steps(step)
        if self.running:
            self.watchdog.check(step)
        if self.running and self.health is not None:
            self.health.check()

    # -- tasks ------------------------------------------------------------------------------
    def start(self, tasks: list[TaskProcess], new_ports: bool = False) -> None:
        if new_ports:
            for task, port in zip(tasks, free_ports(len(tasks)), strict=True):
                task.port = port
        cluster = cluster_def(self.spec, lambda role, index: f"127.0.0.1:{self.task(role, index).port}")
        # The steps a stopped chief logged last count as where the new tasks start from; read
        # later, they would look like steps of the new chief, taken as serving before it answers.
        self.read_progress()
        for task in tasks:
            if self.forkserver is not None and forkable(self.spec, task.role) and not self.forkserver.ready:
                self.waiting.append((task, cluster))
            else:
                self.launch(task, cluster)
        self.launch_waiting()

    def launch_waiting(self) -> None:
        """Start the tasks that wait for the fork server once it has loaded, or by themselves
        once it has failed."""
        if not self.waiting:
            return
        if self.forkserver is not None:
            try:
                if not self.forkserver.poll_ready():
                    return
            except ForkServerError as err:
                self.drop_forkserver(err)
        waiting, self.waiting = self.waiting, []
        for task, cluster in waiting:
            if not task.deleted:
                self.launch(task, cluster)

    def task(self, role: str, index: int) -> TaskProcess:
        return next(t for t in self.tasks if t.role == role and t.index == index)

    def launch(self, task: TaskProcess, cluster: dict[str, list[str]]) -> None:
        role_spec = self.spec.roles[task.role]
        env = dict(os.environ, **role_spec.env)
        env.update({"TF_CONFIG": tf_config_json(cluster, task.role, task.index), "PYTHONUNBUFFERED": "1",
                    GROUP_ENV: self.spec.name, RUN_ENV: self.spec.run_name(), TASK_ENV: task.name})
        # Every task of the group runs on this machine: the trainers share its cores.
        env[TRAINERS_ON_THIS_MACHINE] = str(self.spec.replicas("worker") + self.spec.replicas("chief"))
        task.temporary = temporary_directory(env.get("TMPDIR"))
        if task.temporary:  # TensorFlow's files there (autograph's) go even when the task is killed
            env["TMPDIR"] = env[TASK_TEMPORARY_DIRECTORY] = task.temporary
        log_path = self.group.log(task.role, task.index)
        with open(log_path, "ab") as log:
            if task.restarts:
                log.write(f"--- airflow-tf: restart {task.restarts} of {task.name} ---\n".encode())
                log.flush()
            command = self.spec.command(task.role, python=sys.executable)
            task.proc = self.fork(task, env, log_path)
            try:
                task.proc = task.proc or subprocess.Popen(
                    command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    # The supervisor is single-threaded, and PR_SET_PDEATHSIG can only be set in the child.
                    start_new_session=True, preexec_fn=self.child_setup(),  # noqa: PLW1509
                )
            except OSError as err:  # a command that does not exist cannot be retried into existence
                task.phase = Phase.FAILED
                self.ended(task, None)
                task.reason = f"cannot start {command[0]!r}: {err.strerror}; check roles.{task.role}.command"
                return
        task.start_time = process_start_time(task.proc.pid)
        task.phase, task.exit_code = Phase.RUNNING, None
        task.start_step = (self.progress or {}).get("global_step")
        task.last_progress, task.progress_mark, task.stepping, task.stalled = time.monotonic(), None, False, False
        task.answered, task.unanswered, task.stuck = False, 0, None
        task.started, task.start_ticks = time.monotonic(), None

    def child_setup(self) -> Callable[[], None]:
        return die_with_parent(self.pid, WAKE_SIGNALS)

    def fork(self, task: TaskProcess, env: dict[str, str], log_path: Path) -> ForkedProcess | None:
        """``task`` forked by the group's fork server, or None when it starts by itself."""
        if self.forkserver is None or not forkable(self.spec, task.role):
            return None
        assert self.spec.training is not None  # forkable: it runs the runtime
        try:
            return self.forkserver.fork(self.spec.training.to_args(), env, log_path, f"{task.role}-{task.index}")
        except ForkServerError as err:
            self.drop_forkserver(err)
            return None

    def drop_forkserver(self, err: ForkServerError) -> None:
        print(f"the fork server failed ({err}): tasks start by themselves from now on", flush=True)
        if self.forkserver is not None:
            self.forkserver.close()
            self.forkserver = None

    def stop(self, tasks: list[TaskProcess], grace: float = STOP_GRACE) -> None:
        """SIGTERM, then SIGKILL after ``grace`` (at once for 0); returns when every one is reaped."""
        live = [(t, t.proc) for t in tasks if t.proc is not None]
        for _, proc in live if grace else ():
            kill_group(proc, signal.SIGTERM)
            kill_group(proc, signal.SIGCONT)  # a stopped process handles SIGTERM only once continued
        deadline = time.monotonic() + grace
        while any(proc.poll() is None for _, proc in live) and time.monotonic() < deadline:
            time.sleep(0.01)
        for t, proc in live:
            if proc.poll() is None:
                kill_group(proc, signal.SIGKILL)
                proc.wait()
            self.ended(t, proc.returncode)

    def replace(self, task: TaskProcess, grace: float = STOP_GRACE) -> None:
        """Stop ``task`` (a watch found it stalled or stuck) and restart it under its restart
        policy, as if it had exited."""
        self.stop([task], grace)
        assert task.exit_code is not None  # stop() reaped it
        self.exited(task, task.exit_code)

    def reap(self) -> None:
        for task in self.tasks:
            if task.proc is None or task.proc.poll() is None:
                continue
            code = task.proc.returncode
            assert code is not None
            self.ended(task, code)
            self.exited(task, code)
        self.reap_orphans()

    def ended(self, task: TaskProcess, code: int | None) -> None:
        """``task``'s process is gone (reaped), with exit code ``code``: so are its temporary files."""
        task.proc, task.exit_code = None, code
        remove_temporary_directory(task.temporary)
        task.temporary = None

    def reap_orphans(self) -> None:
        """Reap what exited here without being one of ours (a process a task started and left
        behind, reparented to this subreaper); ours are reaped by their handles."""
        ours = {t.proc.pid for t in self.tasks if t.proc is not None}
        ours.update(pid for pid in (self.health.asker_pid if self.health else None,
                                    self.forkserver.proc.pid if self.forkserver else None) if pid is not None)
        while True:
            try:
                exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if exited is None or exited.si_pid in ours:
                return
            os.waitpid(exited.si_pid, 0)

    def exited(self, task: TaskProcess, code: int) -> None:
        if code == 0:
            task.phase = Phase.SUCCEEDED  # a reason left from a restart still says why it restarted
            return
        if task.stuck:
            why, task.code = task.stuck, ReasonCode.STUCK
        elif task.stalled:
            why, task.code = f"no progress for {self.spec.progress_timeout:g} s (stopped by the watchdog)", \
                ReasonCode.NO_PROGRESS
        else:
            why, task.code = task_failure_reason(code, tail_text(self.group.log(task.role, task.index), 20)), None
        if task.role == "ps" and self.succeeded():
            # Nothing needs a parameter server once training is done.
            task.phase, task.reason = Phase.SUCCEEDED, f"stopped after training finished ({why})"
            return
        if not is_retryable_exit(task.restart_policy, code):
            task.phase, task.reason = Phase.FAILED, f"{why} (restart policy {task.restart_policy})"
            return
        spent = self.restart_budget_spent(task)
        if spent:
            task.phase, task.reason = Phase.FAILED, f"{why}; {spent}"
            return
        self.restarts += 1
        task.failures += 1
        task.phase, task.reason = Phase.RESTARTING, why
        if task.role == "ps":
            # The variables lived on that ps: restart every unfinished task from the checkpoint.
            others = [t for t in self.tasks if t is not task and not t.deleted and t.phase is not Phase.SUCCEEDED]
            self.stop(others)
            group = [task, *others]
            for t in group:
                t.restarts += 1
                t.reason = f"{GROUP_RESTARTED}{task.name} {why}" if t is not task else why
                t.code = ReasonCode.GROUP_RESTARTED if t is not task else t.code
            self.start(group, new_ports=True)
        else:
            task.restarts += 1
            self.start([task])

    def restart_budget_spent(self, task: TaskProcess) -> str | None:
        """Why ``task`` may not restart again, or None: its own ``backoff_limit`` (per task, as
        on Kubernetes), else the group's ``group_backoff_limit`` (all tasks together)."""
        if task.failures >= self.spec.backoff_limit:
            return f"its backoff limit of {self.spec.backoff_limit} restart(s) is used up (backoff_limit, per task)"
        limit = self.spec.group_backoff_limit
        if limit is not None and self.restarts >= limit:
            return f"the group's backoff limit of {limit} restart(s) is used up (group_backoff_limit)"
        return None

    def succeeded(self) -> bool:
        return group_outcome(self.status(), self.spec.success_policy).succeeded

    # -- group-level events -----------------------------------------------------------------
    def shutdown(self, failure: str | None, code: OutcomeCode) -> None:
        """Stop every task; the group fails with ``failure`` (of kind ``code``) unless it had already succeeded."""
        done = self.succeeded()
        live = [t for t in self.tasks if t.proc is not None]
        self.stop(live)
        live += [t for t, _ in self.waiting]  # never started: they end with the group
        self.waiting = []
        for t in live:
            if t.role == "ps" and done:
                t.phase, t.reason = Phase.SUCCEEDED, "stopped after training finished"
            else:
                t.phase, t.reason = Phase.FAILED, f"stopped: {failure}"
        if failure and not done and not self.failure:
            self.failure, self.failure_code = failure, code
        self.running = False

    def check_deadline(self) -> None:
        limit = self.spec.active_deadline_seconds
        if limit is not None and self.running and time.monotonic() - self.started >= limit:
            self.shutdown(f"the active deadline of {limit:g} s passed ({describe(self.progress)}); "
                          "raise active_deadline_seconds or train for fewer steps", OutcomeCode.DEADLINE_EXCEEDED)

    def check_owner(self) -> None:
        """Until the group is handed over (``owner.json`` null), it ends with its launcher."""
        owner = read_json(self.group.owner, missing_ok=True)
        if not owner or not self.running or is_running(owner["pid"], owner["start_time"]):
            return
        if read_json(self.group.owner, missing_ok=True) == owner:  # not handed over just before the owner exited
            self.shutdown(f"the launching process (pid {owner['pid']}) exited before handing the group over, "
                          "so its group was stopped", OutcomeCode.LAUNCHER_EXITED)

    def stop_when_done(self) -> None:
        """Once no training task runs any more, or the group has failed for good, stop what
        still runs after ``ps_grace_seconds``: the parameter servers (and an evaluator, and in
        coordinator mode the workers) never exit by themselves, workers of a failed group train
        for nothing, and nobody else may come to stop them."""
        if not self.running:
            return
        training = self.spec.training_roles()
        outcome = group_outcome(self.status(), self.spec.success_policy)
        failed = outcome.done and not outcome.succeeded
        if not failed and any(t.role in training and not t.terminal and not t.deleted for t in self.tasks):
            return
        now = time.monotonic()
        self.done_at = self.done_at or now
        live = [t for t in self.tasks if t.proc is not None]
        if not live or now - self.done_at < self.spec.ps_grace_seconds:
            return
        if any(t.role in training for t in live) and not self.failure:
            # Said for the group as a whole: stopped workers must not look like the cause.
            self.failure, self.failure_code = f"{outcome.reason}; the rest of the group was stopped", outcome.code
        self.stop(live)
        grace = self.spec.ps_grace_seconds
        for t in live:
            if t.role in training:
                t.phase, t.reason = Phase.FAILED, "stopped by the supervisor: the group had failed"
            else:
                t.phase = Phase.SUCCEEDED
                t.reason = (f"stopped by the supervisor {grace:g} s after the group failed" if failed else
                            f"stopped by the supervisor {grace:g} s after the workers finished")

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
            write_group_file(answer, {"deleted": [t.name for t in chosen]})

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
                           failure=self.failure, failure_code=self.failure_code, progress=self.progress)

    def write_state(self) -> None:
        state = {
            "supervisor": {"pid": self.pid, "start_time": self.start_time,
                           "state": "running" if self.running else "exited"},
            "status": self.status().to_dict(),
            "processes": {
                t.name: {"pid": t.proc.pid, "start_time": t.start_time, "port": t.port, "temporary": t.temporary}
                for t in self.tasks if t.proc is not None
            },
            "restarts": self.restarts,
            "isolation": self.isolation,
        }
        if state != self.last_written:
            write_group_file(self.group.state, state)
            self.last_written = state


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m airflow_tf.backends.local.supervisor <group directory>", file=sys.stderr)
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
        supervisor.shutdown("the supervisor crashed; see supervisor.log", OutcomeCode.SUPERVISOR_LOST)
        supervisor.write_state()
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
