"""Parts of a between-graph training task's session: a Saver that never checkpoints non-finite
variables, the sync optimizer's setup, and a close that does not hold up the task's exit (the
hook around each call is :mod:`.steps`'s)."""

from __future__ import annotations

import threading

import tensorflow as tf

from .logs import log
from .loop import NanPolicy
from .saving import OneAtATimeSaverBuilder, all_finite
from .step_bound import StepBoundHook


class FiniteSaver(tf.compat.v1.train.Saver):
    """A Saver that asks the run's :class:`~.loop.NanPolicy` before each save: nothing after an
    ``on_nan="stop"``, never non-finite variables (checked by :func:`~.saving.all_finite`,
    evaluated where each variable lives)."""

    def __init__(self, var_list: dict, nan_policy: NanPolicy, **kwargs):
        # One variable of a ps written at a time, sharded by ps: a save costs a ps one variable (a table's
        # largest slice).
        super().__init__(var_list=var_list, builder=OneAtATimeSaverBuilder(), sharded=True, **kwargs)
        self._nan_policy = nan_policy
        self.step_bound: StepBoundHook | None = None
        """A :class:`~.step_bound.StepBoundHook` that bounds each save, or None."""
        variables = [v for value in var_list.values() for v in (value if isinstance(value, list) else [value])]
        self._all_finite = all_finite(variables)

    def save(self, sess, save_path, global_step=None, *args, **kwargs):
        if self.step_bound is None or sess is None:
            return self._save(sess, save_path, global_step, *args, **kwargs)
        with self.step_bound.bounding_save(sess) as bounded:
            return self._save(bounded, save_path, global_step, *args, **kwargs)

    def _save(self, sess, save_path, global_step=None, *args, **kwargs):
        step = int(sess.run(global_step)) if tf.is_tensor(global_step) else global_step
        if not self._nan_policy.may_save(step, lambda: bool(sess.run(self._all_finite))):
            return None
        return super().save(sess, save_path, global_step, *args, **kwargs)


class SyncReplicasHook(tf.compat.v1.train.SessionRunHook):
    """Sets up a ``SyncReplicasOptimizer`` session, as its own ``make_session_run_hook`` does,
    except that the chief's queue runner takes the cancellation at exit (its last step waits
    for gradients that no worker will send) as the end of training rather than an error."""

    def __init__(self, optimizer, is_chief: bool):
        self._optimizer = optimizer
        self._is_chief = is_chief
        self._queue_runner: tf.compat.v1.train.QueueRunner | None = None
        self._init_tokens_op = None

    def begin(self):
        optimizer = self._optimizer
        if self._is_chief:
            self._local_init_op = optimizer.chief_init_op
            runner = optimizer.get_chief_queue_runner()
            self._queue_runner = tf.compat.v1.train.QueueRunner(
                runner.queue, runner.enqueue_ops, runner.close_op, runner.cancel_op,
                queue_closed_exception_types=(tf.errors.OutOfRangeError, tf.errors.CancelledError),
            )
            self._init_tokens_op = optimizer.get_init_tokens_op(num_tokens=-1)
        else:
            self._local_init_op = optimizer.local_step_init_op

    def after_create_session(self, session, coord):
        uninitialized = session.run(self._optimizer.ready_for_local_init_op)
        if len(uninitialized):
            raise RuntimeError(f"variables not initialised on the ps tasks: {list(uninitialized)}")
        session.run(self._local_init_op)
        if self._is_chief:
            assert self._queue_runner is not None, "begin() makes the chief's queue runner"
            session.run(self._init_tokens_op)
            self._queue_runner.create_threads(session, coord=coord, daemon=True, start=True)


CLOSE_WAIT_SECS = 0.5
"""How long closing a trainer's session may take. Closing a session of the task's master waits
for its other tasks to drop their state, which took from a few ms to 38 s at the end of a run
(nothing left to wait for: the final checkpoint is written, the ps are about to be stopped)."""


class QuickCloseCreator(tf.compat.v1.train.SessionCreator):
    """Another creator's sessions, whose ``close`` gives up waiting after ``CLOSE_WAIT_SECS``:
    the close goes on in a daemon thread, and the task moves on to its exit (or, after a lost
    ps, to a new session)."""

    def __init__(self, creator: tf.compat.v1.train.SessionCreator, wait_secs: float = CLOSE_WAIT_SECS):
        self._creator = creator
        self._wait_secs = wait_secs

    def create_session(self):
        session = self._creator.create_session()
        close = session.close

        def quick_close():
            closing = threading.Thread(target=close, name="airflow-tf-session-close", daemon=True)
            closing.start()
            closing.join(self._wait_secs)
            if closing.is_alive():
                log(f"airflow-tf session close still waiting after {self._wait_secs:g} s; not waited for")

        session.close = quick_close
        return session
