"""A bound on every training step taken from the run's own step times: a step that runs far
longer than the recent ones is treated as stuck, TensorFlow cancels it, and the session is
recreated (see :mod:`.training`), instead of waiting for the fixed ``operation_timeout_secs``.

The bound is ``max(STALL_FLOOR_SECS, STALL_MULTIPLE x the median of the last RECENT_STEPS
steps)``, never more than ``operation_timeout_secs`` (the user's cap, also the bound of a
session's first step, which registers its graphs on every task and has no history yet). It is
passed to each step as ``RunOptions.timeout_in_ms``, so TensorFlow itself abandons the step.
The chief's checkpoint saves read every variable from the ps, so they are bounded the same way
by the recent saves' times.

One stuck step TensorFlow cannot cancel: a RunGraph request refused as a repeat ("The same
RunGraph (Worker) request was received twice") by this task's own worker before the request to
the ps was sent. TensorFlow 2.21 draws a step's request ids from a generator seeded with 32 random
bits in a thread created for that step, so ids repeat within a long run; the master's cancel then
misses the ps call, whose partition waits for ever (bench/README.md, ``request_id_repeats.py``).
A step still running one more bound after its cancel is such a step: the task logs it and
exits, to be restarted like any lost task. Every other recovery's log line names the
error TensorFlow reported, which :data:`RECOVERED_ERRORS` keeps from MonitoredSession's log.

A task that cannot make its session because a ps moved exits the same way. TensorFlow keeps a
task's connections to its peers for the task's whole life; when a ps is replaced at a new
address (a pod moved off a node cut from the pod network), the connections to the old one can
hang without an error, since the cut drops packets instead of refusing them. Once every ps that
moved answers its health question at its new address, and the task still has no session
:data:`MOVED_GRACE_SECS` later (its first, or one made again after a failed step), it exits: a
new process connects to the new address."""

from __future__ import annotations

import logging
import os
import signal
import socket
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import tensorflow as tf
from tensorflow.python.client.session import SessionInterface

from airflow_tf.cluster.spec import DEFAULT_HEALTH_TIMEOUT, HEALTH_ANSWERED

from .logs import log

STALL_FLOOR_SECS = 30.0
"""No step is cut shorter than this: a loaded machine, a checkpoint on the ps or a slow worker
in sync mode can stretch one step to seconds without anything being stuck."""
STALL_MULTIPLE = 20.0
RECENT_STEPS = 200
WATCH_INTERVAL_SECS = 1.0
MOVED_GRACE_SECS = 60.0
"""How long a task may still have no session once every ps that moved answers at its new
address: one replaced where the old address refuses connections takes the session within seconds
(gRPC looks a name up again at most every 30 s)."""
MOVED_CHECK_SECS = 5.0
"""How often a task waiting for its session looks its ps up again."""
REPEATED_REQUEST = "received twice"
"""TensorFlow's refusal of a repeated request id ("The same RunGraph (Worker) request was received twice")."""


class RecoveredErrors(logging.Filter):
    """A filter for TensorFlow's Python logger: passes ERROR and above only (the compat.v1 APIs
    warn on every use), and keeps the error of each session MonitoredSession discards and
    recreates, which it logs at INFO ("An error was raised ... Error: %s"), for the recovery's
    log line. The logger must be at INFO for these records to be made."""

    def __init__(self):
        super().__init__()
        self._first: BaseException | None = None
        self.count = 0
        """Sessions discarded so far: a change means the running step has returned (with an error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        if (isinstance(record.msg, str) and record.msg.startswith("An error was raised") and record.args
                and isinstance(record.args, tuple) and isinstance(record.args[-1], BaseException)):
            if self._first is None:  # the error that discarded the session, not a later retry's
                self._first = record.args[-1]
            self.count += 1
        return False

    def take(self) -> BaseException | None:
        """The error that discarded the session since the last call (once), or None."""
        first, self._first = self._first, None
        return first


RECOVERED_ERRORS = RecoveredErrors()


def quiet_tensorflow_logs() -> None:
    """TensorFlow's Python logger shows errors only, and feeds :data:`RECOVERED_ERRORS`."""
    logger = tf.get_logger()
    logger.setLevel(logging.INFO)
    # On its handlers too: a child logger's records reach them without the logger's filters.
    for filtered in (logger, *logger.handlers):
        if RECOVERED_ERRORS not in filtered.filters:
            filtered.addFilter(RECOVERED_ERRORS)


def describe_error(error: BaseException) -> str:
    """Why TensorFlow abandoned a session, in a few words and its own first line."""
    text = str(getattr(error, "message", error)).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip() and not line.startswith("From ")), "")
    if REPEATED_REQUEST in text:
        return ("a task refused a repeat of a RunGraph request id (TensorFlow's request ids repeat within long "
                "runs: a known TensorFlow fault, docs/reference/faults.md)")
    if isinstance(error, tf.errors.UnavailableError):
        return f"a task could not be reached (a parameter server lost or restarted): {first[:200]}"
    return f"{type(error).__name__}: {first[:200]}"


EXIT_FOR_RESTART = 128 + signal.SIGKILL
"""The code a task ends with to be restarted: what a container runtime reports for a killed
process (137), which the ``ExitCode`` restart policy retries like any lost task."""


def exit_for_restart() -> None:
    """Ends this task at once, without the clean exit its stuck step's TensorFlow threads would
    hold up; the supervisor or Kubernetes restarts it like a lost task. Not by a signal to itself:
    in a container the task is PID 1, which the kernel shields from its own SIGKILL."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_FOR_RESTART)


def resolve(address: str) -> frozenset[str]:
    """The IP addresses ``host:port`` resolves to now; none when its name does not resolve (a
    replaced pod not yet created)."""
    host, _, port = address.rpartition(":")
    try:
        found = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return frozenset()
    return frozenset(str(info[4][0]) for info in found)


def step_bound(recent_secs: Sequence[float], cap_secs: float, steps: int = 1) -> float:
    """Seconds one call of ``steps`` steps may take, given the durations of the recent steps."""
    if not recent_secs:
        return cap_secs
    return min(cap_secs, max(STALL_FLOOR_SECS, STALL_MULTIPLE * steps * statistics.median(recent_secs)))


def describe_bound(recent_secs: Sequence[float], cap_secs: float, steps: int = 1) -> str:
    bound = step_bound(recent_secs, cap_secs, steps)
    if not recent_secs:
        return f"{bound:g} s (operation_timeout_secs, the first step of a session)"
    median = statistics.median(recent_secs)
    per_call = f" x {steps} steps per call" if steps > 1 else ""
    return (f"{bound:g} s (max of the {STALL_FLOOR_SECS:g} s floor and {STALL_MULTIPLE:g} x the median "
            f"{median:.3g} s of the last {len(recent_secs)} steps{per_call}, at most "
            f"operation_timeout_secs={cap_secs:g})")


class BoundedSession(SessionInterface):
    """A session whose every ``run`` carries a timeout (for code that calls ``run`` itself, such
    as ``Saver.save``)."""

    def __init__(self, session, timeout_secs: float):
        self._session = session
        self._timeout_ms = max(1, round(timeout_secs * 1000))

    @property
    def graph(self):
        return self._session.graph

    @property
    def sess_str(self):
        return self._session.sess_str

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        bounded = tf.compat.v1.RunOptions()
        if options is not None:
            bounded.CopyFrom(options)
        bounded.timeout_in_ms = self._timeout_ms
        return self._session.run(fetches, feed_dict, options=bounded, run_metadata=run_metadata)

    def partial_run_setup(self, fetches, feeds=None):
        raise NotImplementedError("partial runs are not bounded")

    def partial_run(self, handle, fetches, feed_dict=None):
        raise NotImplementedError("partial runs are not bounded")


class StepBoundHook(tf.compat.v1.train.SessionRunHook):
    """Bounds each step of this task (first in the hook list, so its clock spans the step).

    A thread logs ``airflow-tf step stuck ...`` when a step passes its bound (TensorFlow cancels
    it at that moment); when the recreated session is ready, ``airflow-tf stalled step
    recovered ...`` names the step, the cause and the time lost, and :attr:`stalls` records it
    for the progress report. A step that has not returned a whole bound after its cancel is one
    TensorFlow cannot cancel: ``airflow-tf step not cancelled ...``, then :attr:`escape`."""

    def __init__(self, global_step, cap_secs: float, waits_on: dict[str, str] | None = None):
        self._global_step = global_step
        self._cap = cap_secs
        self._waits_on = dict(waits_on or {})
        """The tasks a step waits on (``ps:0`` -> ``host:port``): asked their health question when
        a step is stuck, so its log line names the one that does not answer."""
        self._recent: deque[float] = deque(maxlen=RECENT_STEPS)
        self._recent_saves: deque[float] = deque(maxlen=RECENT_STEPS)
        self._lock = threading.Lock()
        self._fresh = True
        """The next step is a session's first: bounded by the cap only, and not a typical step."""
        self._started: float | None = None
        self._bound = cap_secs
        self._bound_text = ""
        self._warned = False
        self._what = "step"
        self._last_step: int | None = None
        self._escaped = False
        self._errors_before = 0
        """RECOVERED_ERRORS.count when the step began: once it moves, the step has returned and
        MonitoredSession is recreating the session (which may wait for a ps), nothing to end."""
        self.steps_of: Callable[[object], int] = lambda fetches: 1
        """How many training steps a ``session.run`` of these fetches makes (see :mod:`.steps`):
        its bound is that many steps', and the recent steps are its time divided by them."""
        self._steps = 1
        self.escape = exit_for_restart
        """Called when a step outlives its cancel by a whole bound (TensorFlow cannot cancel it)."""
        self.stalls: list[dict] = []
        """One entry per recovered step: ``{"global_step", "bound_secs", "lost_secs", "cause"}``."""
        self._made_with: dict[str, frozenset[str]] = {}
        """The addresses each task in ``waits_on`` resolved to when the session was made (or,
        before the first session, when the task began)."""
        self._session_up = False
        """A session was made and no step has failed since (else one is being made)."""
        self._looked_up = 0.0
        self._moved_since: float | None = None
        """Since when every ps answers at a new address while the session is being recreated."""

    def begin(self):
        self._made_with = {task: resolve(address) for task, address in self._waits_on.items()}
        threading.Thread(target=self._watch, name="airflow-tf-step-bound", daemon=True).start()

    def after_create_session(self, session, coord):
        self._made_with = {task: resolve(address) for task, address in self._waits_on.items()}
        self._moved_since, self._session_up = None, True
        step = int(session.run(self._global_step))
        with self._lock:
            started, warned, bound, what = self._started, self._warned, self._bound, self._what
            self._started, self._fresh = None, True
        error = RECOVERED_ERRORS.take()
        if started is None:
            self._last_step = step
            return
        lost = time.monotonic() - started
        after = self._last_step if self._last_step is not None else step
        if warned:
            cause = f"it ran past its bound of {bound:g} s and TensorFlow cancelled it"
        elif error is not None:
            cause = f"TensorFlow aborted it after {lost:.1f} s: {describe_error(error)}"
        else:
            cause = f"TensorFlow aborted it after {lost:.1f} s (a parameter server was lost or restarted)"
        self.stalls.append({"global_step": after, "what": what, "bound_secs": bound, "lost_secs": round(lost, 1),
                            "cause": cause})
        log(f"airflow-tf stalled step recovered: the {what} after global step {after}: {cause}; "
            f"the session was recreated at global step {step}, {lost:.1f} s after the {what} began")
        self._last_step = step

    def before_run(self, run_context):
        fresh = self._fresh
        args = run_context.original_args
        self._steps = max(1, self.steps_of(args.fetches)) if args is not None else 1
        bound = self._cap if fresh else step_bound(self._recent, self._cap, self._steps)
        with self._lock:
            self._started, self._bound, self._what = time.monotonic(), bound, "step"
            self._warned = self._escaped = False
            self._errors_before = RECOVERED_ERRORS.count
            self._bound_text = "" if not fresh else describe_bound((), self._cap)
        options = tf.compat.v1.RunOptions(timeout_in_ms=max(1, round(bound * 1000)))
        return tf.compat.v1.train.SessionRunArgs(self._global_step, options=options)

    def after_run(self, run_context, run_values):
        with self._lock:
            assert self._started is not None, "before_run started this step's clock"
            took = time.monotonic() - self._started
            self._started = None
            if not self._fresh:
                self._recent.append(took / self._steps)
        self._fresh = False
        self._last_step = int(run_values.results)

    @contextmanager
    def bounding_save(self, session) -> Iterator[BoundedSession]:
        """``session`` bounded for one checkpoint save, by the recent saves as steps are by
        the recent steps. A save that fails leaves its start recorded, for the recovery's line."""
        recent = tuple(self._recent_saves)
        bound = step_bound(recent, self._cap)
        with self._lock:
            self._started, self._bound, self._what = time.monotonic(), bound, "checkpoint save"
            self._warned = self._escaped = False
            self._errors_before = RECOVERED_ERRORS.count
            self._bound_text = describe_bound(recent, self._cap).replace(" steps", " saves").replace(
                "the first step of a session", "the first save")
        yield BoundedSession(session, bound)
        with self._lock:
            self._recent_saves.append(time.monotonic() - self._started)
            self._started = None

    def _watch(self) -> None:
        while True:
            time.sleep(WATCH_INTERVAL_SECS)
            with self._lock:
                if self._escaped:
                    continue
                if self._started is not None and RECOVERED_ERRORS.count != self._errors_before:
                    self._session_up = False  # the step returned with an error: the session is being made again
                made = self._session_up
            if not made and (moved := self._moved_away()):
                log(f"airflow-tf session not made: {moved}, yet {MOVED_GRACE_SECS:g} s on this task has no "
                    "session: its connections still lead to the old address (TensorFlow keeps them for the "
                    "task's life). The task exits now to be restarted, to connect to the new one")
                with self._lock:
                    self._escaped = True
                self.escape()
                continue
            with self._lock:
                if self._started is None or self._escaped:
                    continue
                ran = time.monotonic() - self._started
                if ran < self._bound or (self._warned and ran < 2 * self._bound):
                    continue
                # Told to cancel a whole bound ago, and the step has not returned.
                escape = self._warned and RECOVERED_ERRORS.count == self._errors_before
                if self._warned and not escape:
                    continue
                self._escaped = escape
                self._warned = True
                how = self._bound_text or describe_bound(tuple(self._recent), self._cap, self._steps)
                what, bound = self._what, self._bound
            if escape:
                log(f"airflow-tf step not cancelled: the {what} after global step {self._last_step} is still running "
                    f"{ran:.0f} s after it began, {ran - bound:.0f} s after TensorFlow was told to cancel it: "
                    "TensorFlow cannot cancel it (the known cause: this task refused a repeated RunGraph request id "
                    "before the step's request to the ps was sent, and the ps waits for ever; docs/reference/faults.md). "
                    "The task exits now to be restarted")
                self.escape()
                continue
            log(f"airflow-tf step stuck: the {what} after global step {self._last_step} has run {ran:.0f} s, "
                f"past its bound of {how}; it is cancelled and the session recreated{self._silent_tasks()}")

    def _moved_away(self) -> str | None:
        """While the session is being made: once every ps it waits on has answered its
        health question at an address other than the one the session was made with, for
        :data:`MOVED_GRACE_SECS`, the moves (``ps:0 moved from 10.0.1.5 to 10.0.2.7 and answers
        there``); else None. Looked up every :data:`MOVED_CHECK_SECS`."""
        now = time.monotonic()
        if not self._made_with or now - self._looked_up < MOVED_CHECK_SECS:
            return None
        self._looked_up = now
        moves = {task: (self._made_with[task], new) for task, address in self._waits_on.items()
                 if (new := resolve(address)) and self._made_with.get(task) and not new & self._made_with[task]}
        if moves:
            from .health import ask  # gRPC only, once a ps moved

            answers = ask([self._waits_on[task] for task in moves], DEFAULT_HEALTH_TIMEOUT)
            if not all(answers[self._waits_on[task]].startswith(HEALTH_ANSWERED) for task in moves):
                moves = {}
        if not moves:
            self._moved_since = None
            return None
        if self._moved_since is None:
            self._moved_since = now
        if now - self._moved_since < MOVED_GRACE_SECS:
            return None
        return ", ".join(f"{task} moved from {', '.join(sorted(old))} to {', '.join(sorted(new))} and answers there"
                         for task, (old, new) in moves.items())

    def _silent_tasks(self) -> str:
        """``; waiting on ps:0 (... no answer within 5 s)``: which task the stuck step waits on."""
        if not self._waits_on:
            return ""
        from .health import ask  # gRPC only, once a step is stuck

        answers = ask(list(self._waits_on.values()), DEFAULT_HEALTH_TIMEOUT)
        silent = [f"{task} ({address} {answers[address]})" for task, address in self._waits_on.items()
                  if not answers[address].startswith(HEALTH_ANSWERED)]
        if not silent:
            return f"; every ps answers its health question ({', '.join(self._waits_on)})"
        return f"; waiting on {', '.join(silent)}"
