"""Several training steps per ``session.run`` in between-graph training, and the one session hook
that drives them (stop at the target step, the NaN policy, the checkpoint saver, the chief's
progress report).

Every ``session.run`` of a remote session pays a fixed cost (the hooks, the master's step setup,
one exchange per ps), a large part of a small model's step. A chain of K steps in the graph pays
it once: step ``i`` reads its own batch and the variables after step ``i - 1``'s update (each
step's ops run under a control dependency on the previous step's update), so K chained steps
learn exactly what K separate runs would. The graph holds a one-step call besides the chain:
near the target step (exactness), while the automatic choice measures the step time, and when
steps are slow enough that the fixed cost no longer matters."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import tensorflow as tf

from .logs import log
from .loop import AfterStep, run_after_step

AUTO_STEPS_PER_CALL = 8
"""K when ``steps_per_call`` is None and the steps are quick (measured here on the MLP of
bench/bench_keras_fit.py: 4 steps per call gave most of the gain, 8 a little more)."""
AUTO_PROBE_CALLS = 12
"""One-step calls measured before the automatic choice (the first, which registers the graph, is
not counted)."""
AUTO_CHAIN_BELOW_SECS = 0.1
"""Steps that take longer than this run one per call: the per-call cost (a few ms) is then a
few percent at most, and a short call keeps the step bound and progress fine-grained."""


@dataclass(frozen=True)
class Call:
    """One way to run training steps: ``train_op`` runs ``steps`` steps, ``losses`` is their
    ``[steps]`` losses, ``step_after`` the global step read after the last update."""

    steps: int
    train_op: tf.Operation
    losses: tf.Tensor
    step_after: tf.Tensor


def chain_steps(steps: int, one_step: Callable[[], tuple[tf.Tensor, tf.Operation]], global_step) -> Call:
    """``steps`` steps in sequence: ``one_step()`` builds a step (its batch, loss and update)
    and is called under a control dependency on the previous step's update, so that its
    variable reads see that update (and, as a step's update depends on its reads through the
    gradients, no read sees a later one)."""
    losses, train_op = [], None
    for _ in range(steps):
        with tf.control_dependencies([train_op] if train_op is not None else []):
            loss, train_op = one_step()
        losses.append(loss)
    assert train_op is not None, "a call runs at least one step"
    with tf.control_dependencies([train_op]):
        step_after = tf.identity(global_step.read_value() if hasattr(global_step, "read_value") else global_step)
        stacked = tf.stack(losses)
    return Call(steps, train_op, stacked, step_after)


class StepsPerCall:
    """Which :class:`Call` the next ``session.run`` makes: the chain while at least a chain of
    steps per trainer remains before ``target`` (other trainers step too, so a chain never
    carries the global step far past the target), else one step. With ``fixed`` None, one-step
    calls are timed first and the chain is taken when a step is quicker than
    :data:`AUTO_CHAIN_BELOW_SECS`."""

    def __init__(self, single: Call, chain: Call | None, *, target: int, trainers: int, fixed: int | None):
        self.single, self.chain = single, chain
        self._target, self._trainers = target, trainers
        self._use_chain: bool | None = None if fixed is None else chain is not None
        self._timed: list[float] = []
        self.by_op = {single.train_op: single, **({chain.train_op: chain} if chain is not None else {})}

    def next_op(self, step: int | None) -> tf.Operation:
        chain = self.chain
        if chain is None or not self._use_chain or step is None:
            return self.single.train_op
        return chain.train_op if self._target - step >= chain.steps * self._trainers else self.single.train_op

    def timed(self, call: Call, secs: float) -> None:
        """A call's duration: the automatic choice decides after :data:`AUTO_PROBE_CALLS`."""
        if self._use_chain is not None or self.chain is None or call is not self.single:
            return
        self._timed.append(secs)
        if len(self._timed) > AUTO_PROBE_CALLS:
            step = statistics.median(self._timed[1:])
            self._use_chain = step < AUTO_CHAIN_BELOW_SECS
            log(f"airflow-tf steps per call: {self.chain.steps if self._use_chain else 1} "
                f"(a step took {step * 1000:.1f} ms; automatic, set steps_per_call to choose)")


class TrainingHook(tf.compat.v1.train.SessionRunHook):
    """Around each call: fetches its losses and the global step after it, hands each step's
    (global step, loss) to the observers in order (the NaN policy first), runs the checkpoint
    saver (so a NaN step is never saved), and stops at the target step. ``reporters`` (the
    chief's progress) come last and end after the saver's end: their final report names the
    final checkpoint."""

    def __init__(self, global_step, target: int, calls: StepsPerCall, observers: Sequence[AfterStep], *,
                 saver: tf.compat.v1.train.SessionRunHook | None = None, reporters: Sequence[AfterStep] = ()):
        self._global_step = global_step
        self._target = target
        self._calls = calls
        self._observers = list(observers)
        self._saver = saver
        self._reporters = list(reporters)
        self.last_step: int | None = None
        self.sessions = 0
        self._started = 0.0

    def begin(self):
        if self._saver is not None:
            self._saver.begin()

    def after_create_session(self, session, coord):
        self.last_step = int(session.run(self._global_step))
        self.sessions += 1
        again = " (recreated: a step timed out or a ps was lost)" if self.sessions > 1 else ""
        log(f"airflow-tf session ready global_step={self.last_step} target_step={self._target}{again}")
        if self._saver is not None:
            self._saver.after_create_session(session, coord)
        for observer in (*self._observers, *self._reporters):
            observer.session_ready(self.last_step)
        if self.last_step >= self._target:
            coord.request_stop()

    def next_op(self) -> tf.Operation:
        return self._calls.next_op(self.last_step)

    def before_run(self, run_context):
        call = self._calls.by_op[run_context.original_args.fetches]
        fetches = {"losses": call.losses, "step": call.step_after}
        if self._saver is not None:
            saver_args = self._saver.before_run(run_context)
            fetches["saver"] = saver_args.fetches if saver_args is not None else []
        self._started = time.monotonic()
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        results = run_values.results
        self._calls.timed(self._calls.by_op[run_context.original_args.fetches], time.monotonic() - self._started)
        step_after, losses = int(results["step"]), [float(loss) for loss in results["losses"]]
        self.last_step = step_after
        # The global step after each of the call's steps (other trainers' steps in between
        # are counted in the last one).
        first = step_after - len(losses) + 1
        for i, loss in enumerate(losses):
            if run_after_step(self._observers, first + i, loss):
                run_context.request_stop()
                return
        if self._saver is not None:
            self._saver.after_run(run_context, tf.compat.v1.train.SessionRunValues(
                results=results["saver"], options=run_values.options, run_metadata=run_values.run_metadata))
        for i, loss in enumerate(losses):
            if run_after_step(self._reporters, first + i, loss):
                run_context.request_stop()
        if step_after >= self._target:
            run_context.request_stop()

    def end(self, session):
        if self._saver is not None:
            self._saver.end(session)
        step = int(session.run(self._global_step))
        for observer in (*self._observers, *self._reporters):
            observer.done(step)
