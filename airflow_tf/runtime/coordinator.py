"""Coordinator mode: the chief drives the whole group (TF2 ``ParameterServerStrategy``).

The workers and ps tasks run plain ``tf.distribute.Server``s (see :mod:`.task`); the chief builds
the model and the optimizer under ``strategy.scope()`` (their variables land on the ps tasks),
creates the input pipeline on every worker, and schedules training steps on whichever worker is
free (``ClusterCoordinator.schedule``). Updates are asynchronous. The user contract is the
between-graph mode's: the same model function and loss, checkpoints in the run directory in the
same name-based format (evaluation and export read them unchanged), and the same loop core
(:mod:`.loop`): restore or warm start, the NaN policy, progress lines and summaries, here fed each
scheduled function's global step and mean loss.

Faults: a worker that dies has its steps re-run on the others and rejoins when it is back
(``ClusterCoordinator`` does both). A ps that dies takes the variables with it: the chief restarts
its own process, which restores the newest checkpoint once the ps is reachable again."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from airflow_tf.cluster.training import TrainingConfig
from airflow_tf.data import make_dataset

from .embeddings import refuse_sliced_tables_in_coordinator_mode
from .errors import ModelError, TaskConfigError
from .logs import log
from .loop import (KEEP_CHECKPOINTS, AfterStep, NanPolicy, ProgressReport, Start, placement, prepare_run_dir,
                   restore_refused, run_after_step, starting_point, target_step, task_result)
from .models import build_model, checkpoint_weights, compute_loss, latest_checkpoint, resolve_loss, weight_key
from .optimizers import make_optimizer
from .task import Task

STEPS_PER_CLOSURE = 10
"""Training steps one scheduled function runs on a worker when ``steps_per_call`` is None: scheduling a function costs a round
trip to the worker, which a small model's step would otherwise spend most of its time on."""
MAX_CHUNK_CLOSURES = 500
"""Functions scheduled between two joins; the chief reports and checkpoints between chunks."""
RESTARTS_ENV = "AIRFLOW_TF_COORDINATOR_RESTARTS"
MAX_RESTARTS = 5
"""Restarts of the chief after losing a ps, before it gives up (the ps may be gone for good)."""


def coordinator_cluster(task: Task) -> dict[str, list[str]]:
    """The jobs ``ParameterServerStrategy`` drives: the evaluator is not one of them."""
    return {job: addresses for job, addresses in task.cluster.items() if job in ("chief", "worker", "ps")}


def coordinator_checkpoint_variables(model, optimizer, global_step) -> dict[str, tf.Variable]:
    """The checkpoint's names: the model's weights as between-graph training names them (see
    :func:`.models.weight_key`), so evaluation and export read either mode's checkpoints."""
    named = {weight_key(i, w): w.value for i, w in enumerate(model.weights)}
    named["global_step"] = global_step
    for i, variable in enumerate(optimizer.variables):
        if variable.path.endswith("learning_rate"):  # an option of the run, not state: never restored
            continue
        named[f"optimizer/{i:03d}_{variable.path.replace('/', '_')}"] = variable.value
    return named


def _all_finite(variables: dict[str, tf.Variable]) -> bool:
    return all(np.isfinite(v.numpy()).all() for v in variables.values() if v.dtype.is_floating)


def _restore(start: Start, model, saver) -> None:
    """Restores every variable from the run's own checkpoint, or the model's weights from the
    warm start's (:func:`.loop.starting_point` decided which, and checked it)."""
    if start.resume_from:
        try:
            saver.restore(None, start.resume_from)
        except tf.errors.NotFoundError as exc:
            raise restore_refused(start.resume_from, exc) from None
    elif start.warm_from:
        model.set_weights(checkpoint_weights(start.warm_from, model))


def _check_topology(config: TrainingConfig, workers: int) -> None:
    if not workers:
        raise ModelError("coordinator mode needs at least one worker task to run the steps on")
    if config.devices_per_worker not in (None, 1):
        raise TaskConfigError(
            f"devices_per_worker={config.devices_per_worker}: in coordinator mode the strategy makes one tower "
            "per GPU of each worker by itself; leave devices_per_worker unset, or use mode='between_graph'"
        )


def _after_closures(observers: list[AfterStep], losses: list[tuple[int, float]], step: int) -> bool:
    """Feeds a chunk's ``(steps, mean loss)`` per scheduled function to the loop's observers, as
    one step each reaching the global step where its function ended; whether one stopped training.
    ``step`` is the global step after the chunk."""
    reached = step - sum(steps for steps, _ in losses)
    for steps, loss in losses:
        reached += steps
        if run_after_step(observers, reached, loss):
            return True
    return False


# PLR0915: the strategy's closures (dataset_fn, worker_steps) and the scheduling loop share the
# setup's locals (model, optimizer, global step, iterator); the restore is the helper above.
def train_with_coordinator(config: TrainingConfig, task: Task, schema) -> dict:  # noqa: PLR0915
    """The chief's loop: schedule steps until the global step reaches the target."""
    cluster = coordinator_cluster(task)
    workers = len(cluster.get("worker", []))
    _check_topology(config, workers)
    target = target_step(config, config.batch_size)
    resume_from = prepare_run_dir(config.run_dir, is_chief=True)

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    keras.utils.set_random_seed(config.seed)
    with strategy.scope():
        model = build_model(config, schema)
        refuse_sliced_tables_in_coordinator_mode(model, config.min_slice_bytes)
        optimizer = make_optimizer(config)
        optimizer.build(model.trainable_variables)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    loss_fn = resolve_loss(config, schema)
    variables = coordinator_checkpoint_variables(model, optimizer, global_step)
    saver = tf.compat.v1.train.Saver(var_list=variables, max_to_keep=KEEP_CHECKPOINTS, save_relative_paths=True)

    start = starting_point(config, model, resume_from)
    _restore(start, model, saver)

    def dataset_fn():
        # One shard of the training data per worker: each worker pulls from its own.
        shards = [make_dataset(config.dataset, "train", config.batch_size, num_shards=workers, shard_index=i,
                               epochs=None, shuffle=True, seed=config.seed) for i in range(workers)]
        if workers == 1:
            return shards[0]
        index = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64)
        return tf.data.Dataset.choose_from_datasets(shards, tf.data.Dataset.from_tensors(index).repeat())

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    trainable = [w.value for w in model.trainable_weights]

    @tf.function
    def worker_steps(iterator, steps):
        """``steps`` training steps on one worker; their mean loss."""
        def replica_step(features, labels):
            with tf.GradientTape() as tape:
                loss = compute_loss(loss_fn, labels, model(features, training=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, trainable), model.trainable_weights, strict=True))
            global_step.assign_add(1)
            return loss

        total = tf.constant(0.0)
        for _ in tf.range(steps):
            per_replica = strategy.run(replica_step, args=next(iterator))
            total += tf.cast(strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None), tf.float32)
        return total / tf.cast(steps, tf.float32)

    log(f"airflow-tf variables {placement(variables)}")
    step = int(global_step.numpy())
    log(f"airflow-tf train role={task.type} index={task.index} chief=True mode=coordinator "
        f"workers={workers} target_step={target} start={start}")
    log(f"airflow-tf session ready global_step={step} target_step={target}")

    nan_policy = NanPolicy(config.on_nan)
    progress = ProgressReport(target=target, examples_per_step=config.batch_size, run_dir=config.run_dir,
                        every_secs=config.log_every_secs, summary_every_steps=config.summary_every_steps,
                        learning_rate=config.learning_rate)
    observers: list[AfterStep] = [nan_policy, progress]
    for observer in observers:
        observer.session_ready(step)
    prefix = os.path.join(config.run_dir, "model.ckpt")

    def save(step: int) -> None:
        if latest_checkpoint(config.run_dir) != f"{prefix}-{step}" and \
                nan_policy.may_save(step, lambda: _all_finite(variables)):
            saver.save(None, prefix, global_step=step)

    save(step)  # as between-graph training does: a run has a checkpoint to fall back on from its start
    saved_at, chunk = time.monotonic(), 2  # the first chunk is small: the first report comes early
    while step < target:
        began = time.monotonic()
        scheduled: list[tuple[int, Any]] = []  # (steps, the closure's remote value)
        for _ in range(chunk):
            steps = min(config.steps_per_call or STEPS_PER_CLOSURE, target - step - sum(k for k, _ in scheduled))
            if steps <= 0:
                break
            scheduled.append((steps, coordinator.schedule(worker_steps, args=(iterator, tf.constant(steps)))))
        coordinator.join()
        step = int(global_step.numpy())
        if _after_closures(observers, [(k, float(r.fetch())) for k, r in scheduled], step):
            break
        # Aim a chunk at one log interval, so the report keeps its pace.
        per_closure = (time.monotonic() - began) / len(scheduled)
        chunk = max(1, min(MAX_CHUNK_CLOSURES, int(config.log_every_secs / max(per_closure, 1e-6))))
        if time.monotonic() - saved_at >= config.checkpoint_every_secs:
            save(step)
            saved_at = time.monotonic()
    save(step)  # the final checkpoint (none after on_nan=stop)
    for observer in observers:
        observer.done(int(global_step.numpy()))
    tf.compat.v1.summary.FileWriterCache.clear()
    return task_result(task, step, nan_policy, progress, config.run_dir)


def run_chief(config: TrainingConfig, task: Task, schema) -> dict:
    """:func:`train_with_coordinator`; when a ps is lost (its variables with it), restart this process so that it
    reconnects and restores the newest checkpoint."""
    try:
        return train_with_coordinator(config, task, schema)
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as exc:
        restarts = int(os.environ.get(RESTARTS_ENV, "0"))
        reason = " ".join(str(exc.message).split())[:200]
        if restarts >= MAX_RESTARTS:
            raise
        log(f"airflow-tf coordinator lost a ps task ({type(exc).__name__}: {reason}); restarting from the "
            f"latest checkpoint (restart {restarts + 1} of at most {MAX_RESTARTS})")
        os.environ[RESTARTS_ENV] = str(restarts + 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "airflow_tf.runtime", *sys.argv[1:]])
        raise  # not reached
