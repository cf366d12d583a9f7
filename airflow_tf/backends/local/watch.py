"""What the local supervisor holds to watch its running tasks, each with one job: the
:class:`ProgressWatchdog` (a training task with no progress for ``progress_timeout`` is
replaced) and the :class:`HealthQuestions` (a task that stops answering is killed and replaced).
Neither stops or restarts a task itself: each calls the supervisor's ``replace``, which stops
the task and restarts it under its restart policy, as for any exit."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable

from airflow_tf.cluster import GroupSpec, Phase
from airflow_tf.cluster.spec import HEALTH_ANSWERED, HEALTH_STARTUP_SECS, HealthBounds

from .processes import STOP_GRACE, TaskProcess, cpu_ticks, kill_group

STARTUP_ALLOWANCE = 30.0
"""Seconds the health asker may take to start (Python and gRPC on a loaded machine) before its
question is dropped unjudged."""

Replace = Callable[[TaskProcess, float], None]
"""The supervisor's ``replace(task, grace)``: stop ``task`` (SIGKILL after ``grace`` seconds) and
treat its end as an exit, restarted under its restart policy."""


class ProgressWatchdog:
    """Replaces a training task with no progress for ``progress_timeout`` seconds. Once the chief
    reports steps, its global step must change; the other trainers, which report no steps of their
    own, and a chief still starting up must use CPU time (a stopped process, or one blocked for
    good, uses none)."""

    def __init__(self, spec: GroupSpec, tasks: list[TaskProcess], chief: TaskProcess, replace: Replace) -> None:
        self.spec, self.tasks, self.chief, self.replace = spec, tasks, chief, replace

    def note_chief_steps(self, step: int | None) -> None:
        """Mark the chief as stepping once its global step (``step``) moved since it (re)started."""
        chief = self.chief
        if chief.proc is not None and not chief.stepping and step is not None and step != chief.start_step:
            chief.stepping, chief.progress_mark = True, None

    def check(self, step: int | None) -> None:
        """Replace the stalled trainers, ``step`` being the chief's last global step."""
        timeout = self.spec.progress_timeout
        if timeout is None:
            return
        now = time.monotonic()
        trainers = [t for t in self.tasks if t.role in self.spec.training_roles() and t.proc is not None]
        self._note_progress(trainers, step, now)
        for task in self._stalled(trainers, now, timeout):
            task.stalled = True
            self.replace(task, STOP_GRACE)

    @staticmethod
    def _note_progress(trainers: list[TaskProcess], step: int | None, now: float) -> None:
        """Stamp each trainer whose mark moved: the chief's global step once it steps, else CPU time."""
        for task in trainers:
            mark = step if task.stepping else cpu_ticks(task.proc.pid) if task.proc is not None else None
            if mark is not None and mark != task.progress_mark:
                task.progress_mark, task.last_progress = mark, now

    def _stalled(self, trainers: list[TaskProcess], now: float, timeout: float) -> list[TaskProcess]:
        """The trainers without progress for ``timeout``. Others first: a stalled worker also
        stalls the chief's global step in sync mode, so the chief's clock restarts with theirs."""
        stalled = [t for t in trainers if t is not self.chief and now - t.last_progress >= timeout]
        if not stalled and self.chief in trainers and now - self.chief.last_progress >= timeout:
            stalled = [self.chief]
        if stalled and self.chief not in stalled:
            self.chief.last_progress = now
        return stalled


class HealthQuestions:
    """Asks every running ps and worker its health question (:mod:`airflow_tf.runtime.health`,
    in a child process, so the supervisor's loop never waits on a task), one question at a time
    every ``health_timeout`` seconds. A task that has answered once and then leaves
    ``HEALTH_FAILURES`` questions in a row unanswered is stuck: it is killed (SIGKILL: a stopped
    or wedged process may never handle SIGTERM) and replaced under its restart policy, a ps with
    the rest of its group, like a lost task."""

    def __init__(self, spec: GroupSpec, tasks: list[TaskProcess], chief: TaskProcess, bounds: HealthBounds,
                 *, child_setup: Callable[[], Callable[[], None]], replace: Replace) -> None:
        self.spec, self.tasks, self.chief, self.bounds = spec, tasks, chief, bounds
        self.child_setup, self.replace = child_setup, replace
        self.asking: tuple[subprocess.Popen, float, dict[str, tuple[TaskProcess, int]]] | None = None
        """The question under way: its process, when it was asked, whom (by address, with the pid asked)."""
        self.next_question = 0.0

    @property
    def asker_pid(self) -> int | None:
        """The pid of the process asking the question under way (the supervisor's child)."""
        return self.asking[0].pid if self.asking is not None else None

    def check(self) -> None:
        """Judge the answers of the question under way once it is answered; ask the next when due."""
        now = time.monotonic()
        if self.asking is not None:
            proc, asked, whom = self.asking
            if proc.poll() is None:
                # The asker itself may start slowly on a loaded machine: it is not the tasks' fault.
                if now - asked > self.bounds.timeout_secs + STARTUP_ALLOWANCE:
                    self.close()
                return
            self.asking = None
            output, _ = proc.communicate()
            answers = dict(line.split(" ", 1) for line in output.splitlines() if " " in line)
            for address, (task, pid) in whom.items():
                if task.proc is not None and task.proc.pid == pid and address in answers:
                    self._judge(task, answers[address])
        if now < self.next_question:
            return
        whom = {f"127.0.0.1:{t.port}": (t, t.proc.pid) for t in self.tasks
                if t.proc is not None and t.phase is Phase.RUNNING and self.spec.answers_health(t.role)}
        if not whom:
            return
        self.next_question = now + self.bounds.period_secs
        command = self.spec.health_command(list(whom), python=sys.executable)
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=self.child_setup())  # noqa: PLW1509
        self.asking = (proc, now, whom)

    def _judge(self, task: TaskProcess, answer: str) -> None:
        """Count one answer of ``task`` (``answered in 0.004 s`` or why not); replace it once stuck."""
        if answer.startswith(HEALTH_ANSWERED):
            task.answered, task.unanswered = True, 0
            return
        bounds = self.bounds
        if self._serving(task):
            task.unanswered += 1
            if task.unanswered < bounds.failures:
                return
            task.stuck = (f"stuck: its TensorFlow server left {task.unanswered} health questions in a row unanswered "
                          f"(last: {answer}; each has {bounds.timeout_secs:g} s, one every "
                          f"{bounds.period_secs:g} s, health_timeout), so it was killed and restarted")
        else:
            # Still starting, its server perhaps not listening yet: starting (importing
            # TensorFlow) uses CPU time; a task stopped or blocked before its first answer uses none.
            ticks = cpu_ticks(task.proc.pid) if task.proc is not None else None
            task.unanswered = 0 if ticks != task.start_ticks else task.unanswered + 1
            task.start_ticks = ticks
            starting = time.monotonic() - task.started
            if task.unanswered < bounds.failures and starting < HEALTH_STARTUP_SECS:
                return
            idle = f"used no CPU time for {task.unanswered} questions in a row" if task.unanswered else (
                f"did not answer within {HEALTH_STARTUP_SECS:g} s")
            task.stuck = (f"stuck while starting: it never answered its health question and {idle} "
                          f"(last: {answer}; health_timeout {bounds.timeout_secs:g} s), so it was killed "
                          "and restarted")
        print(f"{task.name} {task.stuck}", flush=True)
        self.replace(task, 0)

    def _serving(self, task: TaskProcess) -> bool:
        """Whether ``task``'s server is known to serve: it answered a health question, or the
        chief trains, which its own server and every ps serve for. On a loaded machine a chief may
        reach its first checkpoint before its first answer; it is not starting any more then."""
        return task.answered or (self.chief.stepping and (task is self.chief or task.role == "ps"))

    def close(self) -> None:
        """Drop the question under way, its asker killed and reaped."""
        if self.asking is not None:
            proc = self.asking[0]
            kill_group(proc, signal.SIGKILL)
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            self.asking = None
