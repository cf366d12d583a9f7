"""The chief's report and the step bound, driven step by step. A real group cannot choose which
global steps its chief sees, so these feed a scripted sequence: the report (the loop's core,
:mod:`airflow_tf.runtime.loop`) takes plain values, and the step bound's hook a stand-in session
(``session.run`` returns the global step); the event files and logs are real."""

from __future__ import annotations

import re

import contextlib
import json
import time

import pytest
import tensorflow as tf

from airflow_tf.runtime import step_bound
from airflow_tf.runtime.loop import ProgressReport
from airflow_tf.serving.curves import read_scalars

EVERY = 20


class GlobalStep:
    """Stands in for a session: ``run`` returns the current global step, whatever is fetched."""

    def __init__(self, value: int):
        self.value = value

    def run(self, fetches):
        return self.value


@pytest.mark.parametrize("mode", ["between_graph", "coordinator"])
def test_a_summary_follows_every_multiple_the_global_step_crosses_even_in_a_jump(tmp_path, mode):
    # The chief's view of an async run: the other worker's steps make the global step jump
    # (here 21 -> 68 across 40 and 60). Between-graph training reports from its session hooks,
    # in the training graph; coordinator mode from its eager Python loop: the same points.
    seen = list(range(1, 22)) + [68] + list(range(69, 101))  # the global step after each of the chief's steps
    graph = tf.Graph().as_default() if mode == "between_graph" else contextlib.nullcontext()
    with graph:
        progress = ProgressReport(target=100, examples_per_step=32, run_dir=str(tmp_path), every_secs=3600,
                            summary_every_steps=EVERY, learning_rate=0.1)
        progress.session_ready(0)
        for step in seen:
            progress.after_step(step, 0.5)
        progress.done(100)
        tf.compat.v1.summary.FileWriterCache.clear()

    points = [step for step, _ in read_scalars(tmp_path)["loss"]]
    # The first step's report, then the chief's first step at or after 20, 40 and 60 (one point
    # at 68: the chief ran no step in between), 80 and 100.
    assert points == [1, 20, 68, 80, 100]
    assert json.loads((tmp_path / "progress.json").read_text())["done"]


def test_the_bound_follows_the_recent_steps_between_the_floor_and_the_cap():
    assert step_bound.step_bound([], cap_secs=300) == 300, "a session's first step has only the cap"
    assert step_bound.step_bound([0.004] * 50, cap_secs=300) == step_bound.STALL_FLOOR_SECS
    slow = [4.0] * 10 + [0.1]  # the median, not one quick step, sets the pace
    assert step_bound.step_bound(slow, cap_secs=300) == step_bound.STALL_MULTIPLE * 4.0
    assert step_bound.step_bound([60.0] * 5, cap_secs=300) == 300, "never beyond operation_timeout_secs"
    assert step_bound.step_bound([0.004], cap_secs=5) == 5, "a cap below the floor wins"


def test_a_step_past_its_bound_is_logged_then_its_recovery_counted(capsys, monkeypatch):
    monkeypatch.setattr(step_bound, "WATCH_INTERVAL_SECS", 0.05)
    hook = step_bound.StepBoundHook(None, cap_secs=0.3)
    hook.begin()
    session = GlobalStep(41)
    hook.after_create_session(session, None)
    context = tf.compat.v1.train.SessionRunContext(None, session)
    args = hook.before_run(context)
    assert args.options.timeout_in_ms == 300, "the step carries its bound to TensorFlow"
    hook.after_run(context, tf.compat.v1.train.SessionRunValues(41, None, None))

    hook.before_run(context)  # this step never returns: TensorFlow cancels it at the bound
    deadline = time.monotonic() + 10
    while "airflow-tf step stuck" not in (out := capsys.readouterr().out):
        assert time.monotonic() < deadline, "the watcher never logged the stuck step"
        time.sleep(0.05)
    assert "the step after global step 41 has run 0 s, past its bound of 0.3 s" in out
    session.value = 42
    hook.after_create_session(session, None)  # the session recreated
    out = capsys.readouterr().out
    assert "stalled step recovered: the step after global step 41: it ran past its bound of 0.3 s" in out
    assert "recreated at global step 42" in out
    assert hook.stalls == [{"global_step": 41, "what": "step", "bound_secs": 0.3, "lost_secs": hook.stalls[0]["lost_secs"],
                            "cause": "it ran past its bound of 0.3 s and TensorFlow cancelled it"}]


def bounded_session(hook, step_fn, *more_hooks, creator=None):
    """A real MonitoredSession (in-process TensorFlow) running ``step_fn`` in a py_function each
    step, with ``hook`` first as in training. Use the session inside ``graph.as_default()``: a
    recreated session builds its scaffold in the default graph."""
    graph = tf.Graph()
    with graph.as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        hook._global_step = global_step
        step = tf.py_function(step_fn, [], tf.float32)
        with tf.control_dependencies([step]):
            train_op = tf.compat.v1.assign_add(global_step, 1)
        return graph, tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=[hook, *more_hooks]), train_op


class AbortsSecondStep(tf.compat.v1.train.SessionRunHook):
    """Raises, inside the second step's run, the AbortedError TensorFlow reports for a refused
    repeated request id (a real group cannot be made to repeat one on demand)."""

    def __init__(self):
        self.runs = 0

    def before_run(self, run_context):
        self.runs += 1
        if self.runs == 2:
            raise tf.errors.AbortedError(None, None, "From /job:worker/replica:0/task:1:\nThe same RunGraph (Worker) "
                                         "request was received twice. step_id: 1234")


class FailsOnceMore(tf.compat.v1.train.ChiefSessionCreator):
    """A session creator whose second session fails once (a ps still unreachable): MonitoredSession
    logs that error too and tries again."""

    def __init__(self):
        super().__init__()
        self.created = 0

    def create_session(self):
        self.created += 1
        if self.created == 2:
            raise tf.errors.UnavailableError(None, None, "Socket closed")
        return super().create_session()


def test_a_recovered_session_names_the_error_tensorflow_reported(capsys):
    """MonitoredSession discards a session on an AbortedError, logging the error at INFO only;
    the recovery line names it (not a later failure to create the new session). TensorFlow's own
    log (its logger's handlers, here one more) still shows errors only."""
    import logging

    shown: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: shown.append(record.getMessage())  # type: ignore[method-assign]
    tf.get_logger().addHandler(handler)
    step_bound.quiet_tensorflow_logs()
    tf.get_logger().warning("a compat.v1 warning")
    logging.getLogger("tensorflow.child").info("a child logger's line")
    tf.get_logger().error("an error TensorFlow reports")
    hook = step_bound.StepBoundHook(None, cap_secs=60)
    graph, session, train_op = bounded_session(hook, lambda: 0.0, AbortsSecondStep(), creator=FailsOnceMore())
    with graph.as_default(), session:
        for _ in range(3):
            session.run(train_op)
    tf.get_logger().removeHandler(handler)
    out = capsys.readouterr()
    (line,) = [ln for ln in out.out.splitlines() if "stalled step recovered" in ln]
    # The step it names is the global step last read before the abort: 0 on TensorFlow 2.21, 1 on
    # 2.19, which reads it after the first step's increment.
    named = re.search(r"the step after global step (\d+): TensorFlow aborted it after", line)
    assert named and int(named[1]) in (0, 1), line
    assert "a task refused a repeat of a RunGraph request id" in line, line
    assert hook.stalls[0]["global_step"] == int(named[1]) and "repeat of a RunGraph request id" in hook.stalls[0]["cause"]
    assert shown == ["an error TensorFlow reports"], "TensorFlow's INFO and WARNING lines stay out of the task log"


def test_a_step_tensorflow_cannot_cancel_ends_the_task_one_bound_after_its_cancel(capsys, monkeypatch):
    """A step whose work ignores cancellation (a sleeping py_function: TensorFlow's timeout fires,
    yet the run waits for it) is logged as not cancelled at twice its bound, and the task is
    ended (here the ending is recorded instead, and releases the step)."""
    import threading

    monkeypatch.setattr(step_bound, "WATCH_INTERVAL_SECS", 0.05)
    release = threading.Event()
    escaped: list[float] = []
    hook = step_bound.StepBoundHook(None, cap_secs=1.0)
    hook.escape = lambda: (escaped.append(time.monotonic()), release.set())
    graph, session, train_op = bounded_session(hook, lambda: (release.wait(60), 0.0)[1])
    start = time.monotonic()
    with graph.as_default(), session:
        try:
            session.run(train_op)
        except tf.errors.DeadlineExceededError:
            pass  # the step's own timeout, reported once its work returned
    assert escaped, "the uncancellable step never ended the task"
    assert 2.0 <= escaped[0] - start < 30, f"ended {escaped[0] - start:.1f} s after the step began"
    out = capsys.readouterr().out
    assert "airflow-tf step stuck: the step after global step 0 has run 1 s, past its bound of 1 s" in out, out
    (line,) = [ln for ln in out.splitlines() if "airflow-tf step not cancelled" in ln]
    assert "after TensorFlow was told to cancel it: TensorFlow cannot cancel it" in line
    assert "refused a repeated RunGraph request id" in line
    assert "The task exits now to be restarted" in line


class SlowRecreation(tf.compat.v1.train.ChiefSessionCreator):
    """A session creator whose second session takes ``secs`` (a ps that is still coming back)."""

    def __init__(self, secs: float):
        super().__init__()
        self.secs, self.created = secs, 0

    def create_session(self):
        self.created += 1
        if self.created == 2:
            time.sleep(self.secs)
        return super().create_session()


def test_a_cancelled_step_whose_new_session_takes_long_does_not_end_the_task(capsys, monkeypatch):
    """A step TensorFlow cancelled did return: the session's recreation may then wait (for a ps
    coming back) well past twice the bound without the task being ended."""
    import airflow_tf.runtime.training  # noqa: F401  (a cancelled step recovers like a lost ps)

    monkeypatch.setattr(step_bound, "WATCH_INTERVAL_SECS", 0.05)
    step_bound.quiet_tensorflow_logs()
    escaped: list[float] = []
    steps: list[int] = []
    hook = step_bound.StepBoundHook(None, cap_secs=1.0)
    hook.escape = lambda: escaped.append(time.monotonic())

    def step():
        steps.append(1)
        if len(steps) == 2:
            time.sleep(1.5)  # past the 1 s bound: TensorFlow cancels the step when this returns
        return 0.0

    graph, session, train_op = bounded_session(hook, step, creator=SlowRecreation(3.0))
    with graph.as_default(), session:
        for _ in range(3):
            session.run(train_op)
    out = capsys.readouterr().out
    assert not escaped, "a step that returned ended the task while its session was recreated"
    assert "step not cancelled" not in out
    (line,) = [ln for ln in out.splitlines() if "stalled step recovered" in ln]
    assert "it ran past its bound of 1 s and TensorFlow cancelled it" in line, line


class HeldSession(tf.compat.v1.train.ChiefSessionCreator):
    """A session creator whose session number ``held`` waits until ``release`` is set or
    ``hold_secs`` pass: the connections to a ps that moved hang without an error."""

    def __init__(self, held: int, release, hold_secs: float):
        super().__init__()
        self.held, self.release, self.hold_secs, self.created = held, release, hold_secs, 0

    def create_session(self):
        self.created += 1
        if self.created == self.held:
            self.release.wait(self.hold_secs)
        return super().create_session()


@pytest.mark.parametrize("session", ["first", "again"])
@pytest.mark.parametrize("answers", [True, False], ids=["answers-there", "not-answering-yet"])
def test_a_task_without_a_session_while_its_ps_answers_at_a_new_address_ends(capsys, monkeypatch, answers, session):
    """The ps's name resolves to a new address (a stand-in for the cluster DNS following a pod that
    moved; the health question is real, to a real TensorFlow server) while the task waits for its
    first session, or once its step is cut and the session is made again. A ps answering there
    while the task stays without a session for the grace ends the task, to be restarted with new
    connections; a ps not answering yet (still starting) does not."""
    import threading

    import airflow_tf.runtime.training  # noqa: F401  (a cancelled step recovers like a lost ps)
    from airflow_tf.backends.local.processes import free_ports

    monkeypatch.setattr(step_bound, "WATCH_INTERVAL_SECS", 0.05)
    monkeypatch.setattr(step_bound, "MOVED_CHECK_SECS", 0.1)
    monkeypatch.setattr(step_bound, "MOVED_GRACE_SECS", 1.0)
    step_bound.quiet_tensorflow_logs()
    server = tf.distribute.Server.create_local_server()
    address = server.target.removeprefix("grpc://") if answers else f"localhost:{free_ports(1)[0]}"
    moved, release = threading.Event(), threading.Event()
    monkeypatch.setattr(step_bound, "resolve", lambda _: frozenset({"10.201.3.7" if moved.is_set() else "10.201.2.5"}))
    escaped: list[float] = []
    steps: list[int] = []
    hook = step_bound.StepBoundHook(None, cap_secs=1.0, waits_on={"ps:0": address})
    hook.escape = lambda: (escaped.append(time.monotonic()), release.set())

    def step():
        steps.append(1)
        if session == "again" and len(steps) == 2:
            moved.set()
            time.sleep(1.5)  # past the 1 s bound: TensorFlow cancels the step when this returns
        return 0.0

    if session == "first":
        threading.Timer(0.5, moved.set).start()  # after the hook's begin() looked the ps up
    creator = HeldSession(1 if session == "first" else 2, release, 60 if answers else 4)
    graph, monitored, train_op = bounded_session(hook, step, creator=creator)
    with graph.as_default(), monitored:
        for _ in range(3):
            monitored.run(train_op)
    out = capsys.readouterr().out
    if not answers:
        assert not escaped and "session not made" not in out, out
        return
    assert escaped, "the task whose ps answers elsewhere was not ended"
    (line,) = [ln for ln in out.splitlines() if "airflow-tf session not made" in ln]
    assert "ps:0 moved from 10.201.2.5 to 10.201.3.7 and answers there, yet 1 s on this task has no session" in line
    assert "The task exits now to be restarted" in line, line


@pytest.mark.parametrize("pid_one", [False, True], ids=["process", "pid-1-of-its-namespace"])
def test_ending_the_task_ends_it_so_that_it_is_restarted_as_a_lost_task(pid_one):
    """At once (the stuck step holds TensorFlow's threads), with 137, which the ExitCode restart
    policy retries. Also as PID 1 of its own PID namespace, as the task runs in a container: the
    kernel ignores a SIGKILL PID 1 sends itself, which once left a task that meant to end running."""
    import os
    import shutil
    import subprocess
    import sys

    from airflow_tf.cluster import is_retryable_exit

    code = "from airflow_tf.runtime.step_bound import exit_for_restart; print('last words', flush=True); exit_for_restart()"
    command = [sys.executable, "-c", code]
    if pid_one:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            pytest.fail("a PID namespace needs root and util-linux's unshare (scripts/test-deps)")
        command = ["unshare", "--pid", "--fork", "--", sys.executable, "-c", f"import os; assert os.getpid() == 1; {code}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 137 and "last words" in done.stdout, (done.returncode, done.stderr[-2000:])
    assert is_retryable_exit("ExitCode", done.returncode)
