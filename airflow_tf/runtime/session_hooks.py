"""TensorFlow session hooks (``SessionRunHook``) of a training task: stopping at the target step, stopping or failing on a
non-finite loss (and never checkpointing non-finite variables), and the chief's progress report
(log lines, ``progress.json``, TensorBoard scalars)."""

from __future__ import annotations

import math
import os
import time

import tensorflow as tf

from airflow_tf.cluster.progress import PROGRESS_FILE, format_progress
from airflow_tf.files import write_json

from .errors import NonFiniteError
from .logs import log
from .step_bound import StepBoundHook



class StopAtTargetHook(tf.compat.v1.train.SessionRunHook):
    """Stop when the global step reaches ``target``, including before the first step (a task
    restarted after the target was reached then does no extra step)."""

    def __init__(self, global_step, target: int):
        self._global_step = global_step
        self._target = target
        self.last_step: int | None = None
        self.sessions = 0

    def after_create_session(self, session, coord):
        self.last_step = int(session.run(self._global_step))
        self.sessions += 1
        again = " (recreated: a step timed out or a ps was lost)" if self.sessions > 1 else ""
        log(f"airflow-tf session ready global_step={self.last_step} target_step={self._target}{again}")
        if self.last_step >= self._target:
            coord.request_stop()

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        # The fetched value may predate this run's update: re-read only when it is close.
        self.last_step = int(run_values.results) + 1
        if self.last_step >= self._target:
            self.last_step = int(run_context.session.run(self._global_step))
            if self.last_step >= self._target:
                run_context.request_stop()


class NonFiniteLossHook(tf.compat.v1.train.SessionRunHook):
    """Checks every step's loss. A NaN/inf loss fails the task (``on_nan="fail"``: raised before
    the checkpoint saver's turn, so nothing more is saved) or stops it (``"stop"``: the saver then
    writes nothing more, not even the final save, since weights can still be finite while the
    loss is not). :class:`FiniteSaver` also refuses non-finite variables themselves."""

    def __init__(self, global_step, loss, on_nan: str, saver: FiniteSaver | None = None):
        self._global_step = global_step
        self._loss = loss
        self._on_nan = on_nan
        self._saver = saver
        self.stopped: str | None = None
        """Why the task stopped early (``on_nan="stop"``), or None."""

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs({"step": self._global_step, "loss": self._loss})

    def after_run(self, run_context, run_values):
        loss = float(run_values.results["loss"])
        if math.isfinite(loss):
            return
        value = "NaN" if math.isnan(loss) else "inf"
        reason = f"loss became {value} at global step {int(run_values.results['step']) + 1}"
        if self._on_nan == "fail":
            raise NonFiniteError(reason)
        self.stopped = reason
        log(f"airflow-tf {reason}: stopping (on_nan=stop); the last finite checkpoint is kept")
        if self._saver is not None:
            self._saver.stop_saving(reason)
        run_context.request_stop()


class FiniteSaver(tf.compat.v1.train.Saver):
    """A Saver that never writes a checkpoint of non-finite variables: it checks them first
    (``all_finite``, a boolean op over every floating-point variable) and then fails the task
    (``on_nan="fail"``) or skips the save, logging it (``"stop"``)."""

    def __init__(self, var_list: dict, on_nan: str, **kwargs):
        super().__init__(var_list=var_list, **kwargs)
        self._on_nan = on_nan
        self._stopped: str | None = None
        self.step_bound: StepBoundHook | None = None
        """A :class:`~.step_bound.StepBoundHook` that bounds each save, or None."""
        variables = [v for value in var_list.values() for v in (value if isinstance(value, list) else [value])]
        checks = []
        for variable in variables:
            if variable.dtype.base_dtype.is_floating:
                with tf.compat.v1.colocate_with(variable):  # checked where it lives: one bool travels, not the table
                    checks.append(tf.reduce_all(tf.math.is_finite(variable)))
        self._all_finite = tf.reduce_all(tf.stack(checks) if checks else tf.constant([True]))

    def stop_saving(self, reason: str) -> None:
        """No more checkpoints from now on: the training diverged (``reason``)."""
        self._stopped = reason

    def save(self, sess, save_path, global_step=None, *args, **kwargs):
        if self.step_bound is None or sess is None:
            return self._save(sess, save_path, global_step, *args, **kwargs)
        with self.step_bound.bounding_save(sess) as bounded:
            return self._save(bounded, save_path, global_step, *args, **kwargs)

    def _save(self, sess, save_path, global_step=None, *args, **kwargs):
        if self._stopped:
            log(f"airflow-tf not checkpointed: {self._stopped} (on_nan=stop)")
            return None
        if not sess.run(self._all_finite):
            step = int(sess.run(global_step)) if tf.is_tensor(global_step) else global_step
            reason = f"variables became NaN/inf at global step {step} (the loss diverged); not checkpointed"
            if self._on_nan == "fail":
                raise NonFiniteError(reason)
            log(f"airflow-tf {reason} (on_nan=stop); the last finite checkpoint is kept")
            return None
        return super().save(sess, save_path, global_step, *args, **kwargs)


class Window:
    """Losses and the global step since a point in time: the mean loss and the group's
    throughput over it."""

    def __init__(self, now: float, step: int):
        self.start, self.step = now, step
        self.losses: list[float] = []

    def close(self, now: float, step: int, examples_per_step: int) -> tuple[float | None, float | None]:
        """(mean loss, examples/s) since the start; starts the next window at (now, step)."""
        rate = (step - self.step) * examples_per_step / (now - self.start) if now > self.start and step > self.step \
            else None
        loss = math.fsum(self.losses) / len(self.losses) if self.losses else None  # NaN shows a diverged run
        self.start, self.step, self.losses = now, step, []
        return loss, rate


class ProgressHook(tf.compat.v1.train.SessionRunHook):
    """The chief's report: a log line and ``progress.json`` at the first step, then every
    ``every_secs`` seconds; TensorBoard scalars (loss, examples/s, learning rate) at each report
    and every ``summary_every_steps`` global steps, so a short run's curve has many points.

    Throughput is the group's, from the global step's rate: every global step consumes
    ``examples_per_step`` examples (one batch, or ``replicas_to_aggregate`` batches in sync mode)."""

    def __init__(self, global_step, loss, *, target: int, examples_per_step: int, run_dir: str, every_secs: float,
                 summary_every_steps: int, learning_rate: float, step_bound=None):
        self._global_step = global_step
        self._loss = loss
        self._target = target
        self._examples_per_step = examples_per_step
        self._run_dir = run_dir
        self._every_secs = every_secs
        self._summary_every_steps = summary_every_steps
        self._learning_rate = learning_rate
        self._step_bound = step_bound
        """The chief's :class:`~.step_bound.StepBoundHook`: its recovered stalls are reported."""
        self.last_loss: float | None = None
        self._report: Window | None = None
        self._summary: Window | None = None
        self._rate = 0.0
        self._first = True

    def after_create_session(self, session, coord):
        now, step = time.monotonic(), int(session.run(self._global_step))
        self._report, self._summary = Window(now, step), Window(now, step)
        self._first = True

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs({"step": self._global_step, "loss": self._loss})

    def _windows(self) -> tuple[Window, Window]:
        """The report's and the summary's windows, which :meth:`after_create_session` opens."""
        assert self._report is not None and self._summary is not None, "after_create_session runs first"
        return self._report, self._summary

    def after_run(self, run_context, run_values):
        loss = float(run_values.results["loss"])
        report, summary = self._windows()
        report.losses.append(loss)
        summary.losses.append(loss)
        step, now = int(run_values.results["step"]) + 1, time.monotonic()
        if self._first or now - report.start >= self._every_secs:
            self._first = False
            self.report(step, now)
        elif step // self._summary_every_steps > summary.step // self._summary_every_steps:
            self.summarize(step, now)

    def end(self, session):
        # Runs after the checkpoint saver's end (hooks end in order), so the final checkpoint exists.
        checkpoint = tf.train.latest_checkpoint(self._run_dir)
        self.report(int(session.run(self._global_step)), time.monotonic(), done=True, checkpoint=checkpoint)

    def report(self, step: int, now: float, done: bool = False, **extra) -> None:
        loss, rate = self._windows()[0].close(now, step, self._examples_per_step)
        self.last_loss = loss if loss is not None else self.last_loss
        self._rate = rate if rate is not None else self._rate
        steps_per_sec = self._rate / self._examples_per_step
        eta = max(0, self._target - step) / steps_per_sec if steps_per_sec > 0 else None
        stalls = list(self._step_bound.stalls) if self._step_bound is not None else []
        log(format_progress(step, self._target, self._rate, self.last_loss, eta, stalls=len(stalls)))
        report = {
            "global_step": step, "target_step": self._target,
            "percent": round(100.0 * min(step, self._target) / self._target, 2),
            "examples_per_sec": round(self._rate, 2), "eta_seconds": eta,
            "loss": self.last_loss if self.last_loss is not None and math.isfinite(self.last_loss) else None,
            "done": done, "time": time.time(), "stalls": stalls, **extra,
        }
        write_json(os.path.join(self._run_dir, PROGRESS_FILE), report, fsync=False)  # rewritten often
        self.summarize(step, now, flush=done)

    def summarize(self, step: int, now: float, flush: bool = False) -> None:
        """TensorBoard scalars over the steps since the last ones (the same event files feed
        serving's training_curve.png)."""
        loss, rate = self._windows()[1].close(now, step, self._examples_per_step)
        if loss is None and flush:
            # The final point: other workers may have taken the last steps, after the chief's last
            # point; the curve still ends at the final global step, with the chief's latest loss.
            loss = self.last_loss
        values = [tf.compat.v1.Summary.Value(tag="learning_rate", simple_value=self._learning_rate)]
        if rate is not None:
            values.append(tf.compat.v1.Summary.Value(tag="examples_per_sec", simple_value=rate))
        if loss is not None:
            values.append(tf.compat.v1.Summary.Value(tag="loss", simple_value=loss))
        writer = tf.compat.v1.summary.FileWriterCache.get(self._run_dir)
        writer.add_summary(tf.compat.v1.Summary(value=values), step)
        if flush:
            writer.flush()


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
