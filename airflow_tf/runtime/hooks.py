"""Session hooks of a training task: stopping at the target step, and the chief's progress
report (log lines, ``progress.json``, TensorBoard scalars)."""

from __future__ import annotations

import json
import math
import os
import tempfile
import time

import tensorflow as tf

from airflow_tf.cluster.progress import format_progress

from .task import log

PROGRESS_FILE = "progress.json"


def write_json_atomic(path: str, data: dict) -> None:
    """Readers of ``path`` see the previous report or this one, never a partial file."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".progress.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class StopAtTarget(tf.compat.v1.train.SessionRunHook):
    """Stop when the global step reaches ``target``, including before the first step (a task
    restarted after the target was reached then does no extra step)."""

    def __init__(self, global_step, target: int):
        self._global_step = global_step
        self._target = target
        self.last_step: int | None = None

    def after_create_session(self, session, coord):
        self.last_step = int(session.run(self._global_step))
        log(f"airflow-tf session ready global_step={self.last_step} target_step={self._target}")
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


class ProgressHook(tf.compat.v1.train.SessionRunHook):
    """The chief's report: the first step at once, then every ``every_secs`` seconds.

    Throughput is the group's, from the global step's rate: every global step consumes
    ``examples_per_step`` examples (one batch, or ``replicas_to_aggregate`` batches in sync mode)."""

    def __init__(self, global_step, loss, target: int, examples_per_step: int, run_dir: str, every_secs: float):
        self._global_step = global_step
        self._loss = loss
        self._target = target
        self._examples_per_step = examples_per_step
        self._run_dir = run_dir
        self._every_secs = every_secs
        self._losses: list[float] = []
        self.last_loss: float | None = None
        self._last_report: tuple[float, int] | None = None
        self._rate = 0.0
        self._first = True

    def after_create_session(self, session, coord):
        self._last_report = (time.monotonic(), int(session.run(self._global_step)))
        self._first = True

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs({"step": self._global_step, "loss": self._loss})

    def after_run(self, run_context, run_values):
        self._losses.append(float(run_values.results["loss"]))
        now = time.monotonic()
        if self._first or now - self._last_report[0] >= self._every_secs:
            self._first = False
            self.report(int(run_values.results["step"]) + 1, now)

    def end(self, session):
        # Runs after the checkpoint saver's end (hooks end in order), so the final checkpoint exists.
        checkpoint = tf.train.latest_checkpoint(self._run_dir)
        self.report(int(session.run(self._global_step)), time.monotonic(), done=True, checkpoint=checkpoint)

    def report(self, step: int, now: float, done: bool = False, **extra) -> None:
        then, then_step = self._last_report
        if now > then and step > then_step:
            self._rate = (step - then_step) * self._examples_per_step / (now - then)
        self._last_report = (now, step)
        if self._losses:
            self.last_loss = math.fsum(self._losses) / len(self._losses)  # NaN shows a diverged run
            self._losses = []
        steps_per_sec = self._rate / self._examples_per_step
        eta = max(0, self._target - step) / steps_per_sec if steps_per_sec > 0 else None
        log(format_progress(step, self._target, self._rate, self.last_loss, eta))
        report = {
            "global_step": step, "target_step": self._target,
            "percent": round(100.0 * min(step, self._target) / self._target, 2),
            "examples_per_sec": round(self._rate, 2), "eta_seconds": eta,
            "loss": self.last_loss if self.last_loss is not None and math.isfinite(self.last_loss) else None,
            "done": done, "time": time.time(), **extra,
        }
        write_json_atomic(os.path.join(self._run_dir, PROGRESS_FILE), report)
        values = [tf.compat.v1.Summary.Value(tag="examples_per_sec", simple_value=self._rate)]
        if self.last_loss is not None:
            values.append(tf.compat.v1.Summary.Value(tag="loss", simple_value=self.last_loss))
        writer = tf.compat.v1.summary.FileWriterCache.get(self._run_dir)
        writer.add_summary(tf.compat.v1.Summary(value=values), step)
        if done:
            writer.flush()


class SyncReplicasHook(tf.compat.v1.train.SessionRunHook):
    """Sets up a ``SyncReplicasOptimizer`` session, as its own ``make_session_run_hook`` does,
    except that the chief's queue runner takes the cancellation at exit (its last step waits
    for gradients that no worker will send) as the end of training rather than an error."""

    def __init__(self, optimizer, is_chief: bool):
        self._optimizer = optimizer
        self._is_chief = is_chief
        self._queue_runner = None
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
            session.run(self._init_tokens_op)
            self._queue_runner.create_threads(session, coord=coord, daemon=True, start=True)
