"""The local supervisor's watch over its running tasks: the progress watchdog (a training task
with no progress for ``progress_timeout`` is restarted) and the health questions (a task that
stops answering is killed and restarted)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from airflow_tf.cluster import GroupSpec, Phase
from airflow_tf.cluster.spec import HEALTH_ANSWERED, HEALTH_STARTUP_SECS, HealthBounds

from .processes import STOP_GRACE, TaskProcess, cpu_ticks, kill_group

STARTUP_ALLOWANCE = 30.0
"""Seconds the health asker may take to start (Python and gRPC on a loaded machine) before its
question is dropped unjudged."""


class TaskWatch:
    """The supervisor's checks of its running tasks (a part of :class:`Supervisor`)."""

    spec: GroupSpec
    tasks: list[TaskProcess]
    chief: TaskProcess
    running: bool
    progress: dict[str, Any] | None
    pid: int
    health: HealthBounds | None
    asking: tuple[subprocess.Popen, float, dict[str, tuple[TaskProcess, int]]] | None
    """The health question under way: its process, when it was asked, whom (by address, with the pid asked)."""
    next_question: float

    def stop(self, tasks: list[TaskProcess], grace: float = STOP_GRACE) -> None:
        raise NotImplementedError

    def exited(self, task: TaskProcess, code: int) -> None:
        raise NotImplementedError

    def child_setup(self) -> Callable[[], None]:
        """The ``preexec_fn`` of a process the supervisor starts."""
        raise NotImplementedError

    def check_progress(self) -> None:
        """Restart (under its restart policy) a training task with no progress for
        ``progress_timeout`` seconds. Once the chief reports steps, its global step must change;
        the other trainers, which report no steps of their own, and a chief still starting up
        must use CPU time (a stopped process, or one blocked for good, uses none)."""
        timeout = self.spec.progress_timeout
        if timeout is None or not self.running:
            return
        now = time.monotonic()
        trainers = [t for t in self.tasks if t.role in self.spec.training_roles() and t.proc is not None]
        self.note_progress(trainers, now)
        for task in self.stalled(trainers, now, timeout):
            task.stalled = True
            self.stop([task])
            assert task.exit_code is not None  # stop() reaped it
            self.exited(task, task.exit_code)

    def note_chief_steps(self) -> None:
        """Mark the chief as stepping once its global step moved since it (re)started."""
        step, chief = (self.progress or {}).get("global_step"), self.chief
        if chief.proc is not None and not chief.stepping and step is not None and step != chief.start_step:
            chief.stepping, chief.progress_mark = True, None

    def note_progress(self, trainers: list[TaskProcess], now: float) -> None:
        """Stamp each trainer whose mark moved: the chief's global step once it steps, else CPU time."""
        step = (self.progress or {}).get("global_step")
        for task in trainers:
            mark = step if task.stepping else cpu_ticks(task.proc.pid) if task.proc is not None else None
            if mark is not None and mark != task.progress_mark:
                task.progress_mark, task.last_progress = mark, now

    def stalled(self, trainers: list[TaskProcess], now: float, timeout: float) -> list[TaskProcess]:
        """The trainers without progress for ``timeout``. Others first: a stalled worker also
        stalls the chief's global step in sync mode, so the chief's clock restarts with theirs."""
        stalled = [t for t in trainers if t is not self.chief and now - t.last_progress >= timeout]
        if not stalled and self.chief in trainers and now - self.chief.last_progress >= timeout:
            stalled = [self.chief]
        if stalled and self.chief not in stalled:
            self.chief.last_progress = now
        return stalled

    def check_health(self) -> None:
        """Ask every running ps and worker its health question (:mod:`airflow_tf.runtime.health`,
        in a child process, so this loop never waits on a task), one question at a time every
        ``health_timeout`` seconds. A task that has answered once and then leaves
        ``HEALTH_FAILURES`` questions in a row unanswered is stuck: it is killed (SIGKILL: a
        stopped or wedged process may never handle SIGTERM) and restarted under its restart
        policy, a ps with the rest of its group, like a lost task."""
        if self.health is None or not self.running:
            return
        now = time.monotonic()
        if self.asking is not None:
            proc, asked, whom = self.asking
            if proc.poll() is None:
                # The asker itself may start slowly on a loaded machine: it is not the tasks' fault.
                if now - asked > self.health.timeout_secs + STARTUP_ALLOWANCE:
                    self.stop_asking()
                return
            self.asking = None
            output, _ = proc.communicate()
            answers = dict(line.split(" ", 1) for line in output.splitlines() if " " in line)
            for address, (task, pid) in whom.items():
                if task.proc is not None and task.proc.pid == pid and address in answers:
                    self.judge(task, answers[address])
        if now < self.next_question:
            return
        whom = {f"127.0.0.1:{t.port}": (t, t.proc.pid) for t in self.tasks
                if t.proc is not None and t.phase is Phase.RUNNING and self.spec.answers_health(t.role)}
        if not whom:
            return
        self.next_question = now + self.health.period_secs
        command = self.spec.health_command(list(whom), python=sys.executable)
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=self.child_setup())  # noqa: PLW1509
        self.asking = (proc, now, whom)

    def judge(self, task: TaskProcess, answer: str) -> None:
        """Count one answer of ``task`` (``answered in 0.004 s`` or why not); replace it once stuck."""
        assert self.health is not None
        if answer.startswith(HEALTH_ANSWERED):
            task.answered, task.unanswered = True, 0
            return
        if self.serving(task):
            task.unanswered += 1
            if task.unanswered < self.health.failures:
                return
            task.stuck = (f"stuck: its TensorFlow server left {task.unanswered} health questions in a row unanswered "
                          f"(last: {answer}; each has {self.health.timeout_secs:g} s, one every "
                          f"{self.health.period_secs:g} s, health_timeout), so it was killed and restarted")
        else:
            # Still starting, its server perhaps not listening yet: starting (importing
            # TensorFlow) uses CPU time; a task stopped or blocked before its first answer uses none.
            ticks = cpu_ticks(task.proc.pid) if task.proc is not None else None
            task.unanswered = 0 if ticks != task.start_ticks else task.unanswered + 1
            task.start_ticks = ticks
            starting = time.monotonic() - task.started
            if task.unanswered < self.health.failures and starting < HEALTH_STARTUP_SECS:
                return
            idle = f"used no CPU time for {task.unanswered} questions in a row" if task.unanswered else (
                f"did not answer within {HEALTH_STARTUP_SECS:g} s")
            task.stuck = (f"stuck while starting: it never answered its health question and {idle} "
                          f"(last: {answer}; health_timeout {self.health.timeout_secs:g} s), so it was killed "
                          "and restarted")
        print(f"{task.name} {task.stuck}", flush=True)
        self.stop([task], grace=0)
        assert task.exit_code is not None  # stop() reaped it
        self.exited(task, task.exit_code)

    def serving(self, task: TaskProcess) -> bool:
        """Whether ``task``'s server is known to serve: it answered a health question, or the
        chief trains, which its own server and every ps serve for. On a loaded machine a chief may
        reach its first checkpoint before its first answer; it is not starting any more then."""
        return task.answered or (self.chief.stepping and (task is self.chief or task.role == "ps"))

    def stop_asking(self) -> None:
        if self.asking is not None:
            proc = self.asking[0]
            kill_group(proc, signal.SIGKILL)
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            self.asking = None
