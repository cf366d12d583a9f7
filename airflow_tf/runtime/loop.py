"""The training loop's core, one for both modes: between-graph training (:mod:`.training`, whose
TensorFlow session hooks call it) and coordinator mode (:mod:`.coordinator`, whose Python loop
calls it directly).

- Where a run starts: the run directory's newest intact checkpoint (:func:`prepare_run_dir`),
  else the weights to warm-start from, else new (:func:`starting_point`).
- How far it goes: :func:`target_step`.
- What follows each step, fed plain values (the global step after it, the loss it computed):
  an :class:`AfterStep` protocol, which the NaN policy (:class:`NanPolicy`, ``on_nan``) and the
  chief's progress report with its TensorBoard summaries (:class:`ProgressReport`) implement.
- Whether a checkpoint may be written: :meth:`NanPolicy.may_save` (never NaN/inf variables).
- What the task's exit line reports: :func:`task_result`."""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import tensorflow as tf

from airflow_tf.cluster.progress import PROGRESS_FILE, format_progress
from airflow_tf.cluster.training import TrainingConfig
from airflow_tf.data import count_examples
from airflow_tf.files import write_json

from .errors import ModelError, NonFiniteError, TaskConfigError
from .logs import log
from .models import check_checkpoint, latest_checkpoint, resolve_checkpoint
from .task import Task

KEEP_CHECKPOINTS = 5
CORRUPT_SUFFIX = ".corrupt"


class AfterStep(Protocol):
    """What runs on a training task around its steps. ``step`` is always the global step: where
    a session is ready (again, after a recovery), after a step (``loss`` is that step's), at the
    end of training."""

    def session_ready(self, step: int) -> None: ...

    def after_step(self, step: int, loss: float) -> bool:
        """True when training must stop now."""
        ...

    def done(self, step: int) -> None: ...


def run_after_step(observers: Sequence[AfterStep], step: int, loss: float) -> bool:
    """Each observer's :meth:`~AfterStep.after_step` in order, up to the first that stops training;
    whether one did."""
    return any(observer.after_step(step, loss) for observer in observers)


def target_step(config: TrainingConfig, examples_per_step: int) -> int:
    """``steps``, or ``epochs`` passes over the training split (counted in ``_SUCCESS``)."""
    if config.steps is not None:
        return int(config.steps)
    assert config.epochs is not None, "TrainingConfig refuses a config with neither steps nor epochs"
    examples = count_examples(config.dataset, "train")
    if examples <= 0:
        raise TaskConfigError(f"dataset {config.dataset} has no training examples; epochs cannot be counted")
    return max(1, math.ceil(config.epochs * examples / examples_per_step))


def placement(variables: dict[str, tf.Variable | list[tf.Variable]]) -> str:
    """``/job:ps/task:0=global_step,model/001_bias /job:ps/task:1=model/000_kernel``; a sliced
    variable appears on each ps that holds a slice of it."""
    by_device: dict[str, list[str]] = defaultdict(list)
    for name, value in sorted(variables.items()):
        for variable in value if isinstance(value, list) else [value]:
            device = tf.DeviceSpec.from_string(variable.device)
            by_device[f"/job:{device.job}/task:{device.task}"].append(name)
    return " ".join(f"{device}={','.join(dict.fromkeys(names))}" for device, names in sorted(by_device.items()))


def checkpoint_is_intact(prefix: str) -> str | None:
    """None when every tensor of the checkpoint reads back (index and data, checksums included),
    else what is wrong with it."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except (tf.errors.OpError, IndexError, ValueError, RuntimeError) as exc:
        # The checkpoint reader raises plain IndexError/ValueError/RuntimeError for C++ statuses
        # (a truncated data file: "Read less bytes than requested").
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    return None


def recover_checkpoints(run_dir: str) -> None:
    """Make the newest intact checkpoint the run's latest: newer ones that do not read back (a
    data file truncated by a full disk or a killed copy) get their files renamed with a
    ``.corrupt`` suffix (kept, for inspection) and are logged. Refuses a run directory whose
    checkpoints are all unreadable rather than silently starting over."""
    state = tf.train.get_checkpoint_state(run_dir)
    if state is None:
        return
    prefixes = list(dict.fromkeys([*state.all_model_checkpoint_paths, state.model_checkpoint_path]))
    prefixes = [p if os.path.isabs(p) else os.path.join(run_dir, p) for p in prefixes]
    skipped = []
    while prefixes:
        problem = checkpoint_is_intact(prefixes[-1])
        if problem is None:
            break
        prefix = prefixes.pop()
        for path in tf.io.gfile.glob(prefix + ".*"):
            if not path.endswith(CORRUPT_SUFFIX):
                os.replace(path, path + CORRUPT_SUFFIX)
        skipped.append(prefix)
        log(f"airflow-tf checkpoint {prefix} is unreadable ({problem}); skipped, its files renamed *{CORRUPT_SUFFIX}")
    if not skipped:
        return
    if not prefixes:
        raise ModelError(f"no checkpoint in {run_dir} reads back (skipped {', '.join(skipped)}); restore the run "
                         "directory from a backup, or train into a new run_dir")
    names = [os.path.basename(p) for p in prefixes]  # relative, as the Saver writes them: the run dir can move
    tf.compat.v1.train.update_checkpoint_state(run_dir, names[-1], all_model_checkpoint_paths=names)
    log(f"airflow-tf resuming from the newest intact checkpoint {prefixes[-1]}")


def prepare_run_dir(run_dir: str, is_chief: bool) -> str | None:
    """The checkpoint this run resumes from, decided once before anything is restored: the
    chief (the one task that writes checkpoints) creates the run directory and sets unreadable
    checkpoints aside first (:func:`recover_checkpoints`)."""
    if is_chief:
        os.makedirs(run_dir, exist_ok=True)
        recover_checkpoints(run_dir)
    return latest_checkpoint(run_dir) if os.path.isdir(run_dir) else None


@dataclass(frozen=True)
class Start:
    """Where the chief's training starts: the run's own checkpoint (``resume_from``: every
    variable, the global step included), the weights of another run (``warm_from``: the model's
    weights only, steps counted from zero), or neither (new variables)."""

    resume_from: str | None = None
    warm_from: str | None = None

    def __str__(self) -> str:
        if self.resume_from:
            return f"restoring {self.resume_from}"
        return f"weights from {self.warm_from}" if self.warm_from else "new"


def starting_point(config: TrainingConfig, model, resume_from: str | None) -> Start:
    """The chief's :class:`Start`; the checkpoint it reads is checked against ``model`` first
    (a checkpoint of another model is refused naming the weight)."""
    if resume_from:
        check_checkpoint(resume_from, model)
        return Start(resume_from=resume_from)
    if config.warm_start_from:
        warm_from = resolve_checkpoint(config.warm_start_from)
        check_checkpoint(warm_from, model)
        return Start(warm_from=warm_from)
    return Start()


def restore_refused(resume_from: str, exc: tf.errors.NotFoundError) -> ModelError:
    """The error for a run's checkpoint that lacks a variable this run has (an optimizer slot)."""
    return ModelError(
        f"cannot restore {resume_from}: {exc.message.splitlines()[0]}. It was written by a run with other options "
        "(mode, optimizer or model); train into a new run_dir, or use that run's options"
    )


class NanPolicy:
    """``on_nan``: a NaN/inf loss fails the task (``"fail"``: :class:`NonFiniteError`, raised before
    anything more is saved) or stops it (``"stop"``: nothing is checkpointed from then on, not
    even the final save, since weights can still be finite while the loss is not). Variables that
    became NaN/inf are never checkpointed (:meth:`may_save`)."""

    def __init__(self, on_nan: str):
        self.on_nan = on_nan
        self.stopped: str | None = None
        """Why the task stopped early (``on_nan="stop"``), or None."""

    def session_ready(self, step: int) -> None:
        pass

    def after_step(self, step: int, loss: float) -> bool:
        if math.isfinite(loss):
            return False
        reason = f"loss became {'NaN' if math.isnan(loss) else 'inf'} at global step {step}"
        if self.on_nan == "fail":
            raise NonFiniteError(reason)
        self.stopped = reason
        log(f"airflow-tf {reason}: stopping (on_nan=stop); the last finite checkpoint is kept")
        return True

    def done(self, step: int) -> None:
        pass

    def may_save(self, step: int, all_finite: Callable[[], bool]) -> bool:
        """Whether the checkpoint of ``step`` may be written; ``all_finite`` says whether every
        floating-point variable is finite (asked only when it matters)."""
        if self.stopped:
            log(f"airflow-tf not checkpointed: {self.stopped} (on_nan=stop)")
            return False
        if all_finite():
            return True
        reason = f"variables became NaN/inf at global step {step} (the loss diverged); not checkpointed"
        if self.on_nan == "fail":
            raise NonFiniteError(reason)
        log(f"airflow-tf {reason} (on_nan=stop); the last finite checkpoint is kept")
        return False


class Window:
    """Losses and the global step since a point in time: the mean loss and the group's
    throughput over it."""

    def __init__(self, now: float, step: int):
        self.since, self.step = now, step
        self.losses: list[float] = []

    def close(self, now: float, step: int, examples_per_step: int) -> tuple[float | None, float | None]:
        """(mean loss, examples/s) since the start; starts the next window at (now, step)."""
        rate = (step - self.step) * examples_per_step / (now - self.since) if now > self.since and step > self.step \
            else None
        loss = math.fsum(self.losses) / len(self.losses) if self.losses else None  # NaN shows a diverged run
        self.since, self.step, self.losses = now, step, []
        return loss, rate


class ProgressReport:
    """The chief's report: a log line and ``progress.json`` at the first step, then every
    ``every_secs`` seconds; TensorBoard scalars (loss, examples/s, learning rate) at each report
    and every ``summary_every_steps`` global steps, so a short run's curve has many points.

    Throughput is the group's, from the global step's rate: every global step consumes
    ``examples_per_step`` examples (one batch, or ``replicas_to_aggregate`` batches in sync mode).
    ``stalls`` lists the recovered stuck steps to report (see :mod:`.step_bound`)."""

    def __init__(self, *, target: int, examples_per_step: int, run_dir: str, every_secs: float,
                 summary_every_steps: int, learning_rate: float, stalls: Callable[[], list[dict]] = list):
        self._target = target
        self._examples_per_step = examples_per_step
        self._run_dir = run_dir
        self._every_secs = every_secs
        self._summary_every_steps = summary_every_steps
        self._learning_rate = learning_rate
        self._stalls = stalls
        self.last_loss: float | None = None
        self._report: Window | None = None
        self._summary: Window | None = None
        self._rate = 0.0
        self._first = True

    def session_ready(self, step: int) -> None:
        if tf.executing_eagerly():
            # Events go through a TF1 FileWriter, which can only be created in graph mode; once
            # cached, it writes in eager mode too. (In graph mode it holds the training graph.)
            with tf.Graph().as_default():
                tf.compat.v1.summary.FileWriterCache.get(self._run_dir)
        now = time.monotonic()
        self._report, self._summary = Window(now, step), Window(now, step)
        self._first = True

    def _windows(self) -> tuple[Window, Window]:
        """The report's and the summary's windows, which :meth:`session_ready` opens."""
        assert self._report is not None and self._summary is not None, "session_ready() runs first"
        return self._report, self._summary

    def after_step(self, step: int, loss: float) -> bool:
        report, summary = self._windows()
        report.losses.append(loss)
        summary.losses.append(loss)
        now = time.monotonic()
        if self._first or now - report.since >= self._every_secs:
            self._first = False
            self.report(step, now)
        elif step // self._summary_every_steps > summary.step // self._summary_every_steps:
            self.summarize(step, now)
        return False

    def done(self, step: int) -> None:
        """The final report; in between-graph training it runs after the checkpoint saver's
        end (hooks end in order), so the final checkpoint exists."""
        checkpoint = tf.train.latest_checkpoint(self._run_dir)
        self.report(step, time.monotonic(), done=True, checkpoint=checkpoint)

    def report(self, step: int, now: float, done: bool = False, **extra) -> None:
        loss, rate = self._windows()[0].close(now, step, self._examples_per_step)
        self.last_loss = loss if loss is not None else self.last_loss
        self._rate = rate if rate is not None else self._rate
        steps_per_sec = self._rate / self._examples_per_step
        eta = max(0, self._target - step) / steps_per_sec if steps_per_sec > 0 else None
        stalls = list(self._stalls())
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


def task_result(task: Task, step: int | None, nan_policy: NanPolicy, progress: ProgressReport | None,
                run_dir: str) -> dict:
    """What the task's exit line reports (``airflow-tf task exit``, see :func:`.logs.log_exit`);
    the chief's names the final loss and checkpoint."""
    result: dict = {"role": task.type, "index": task.index, "status": "succeeded", "global_step": step}
    if nan_policy.stopped:
        result.update(status="stopped", reason=repr(f"{nan_policy.stopped} (on_nan=stop)"))
    if progress is not None:
        result["loss"] = progress.last_loss
        result["checkpoint"] = latest_checkpoint(run_dir)
    return result
