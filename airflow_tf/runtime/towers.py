"""Towers: several devices of one worker train on shares of its batch (in-graph replication
inside between-graph replication).

Each tower runs the model on its share of the worker's batch on its own device; the towers'
gradients are averaged on the worker and applied once, to the variables on the ps tasks. The
average is weighted by each tower's share, so for a mean loss the update equals the one a
single device computes on the whole batch: towers change where the work runs, not what is
learnt. Devices are the worker's GPUs; without GPUs, ``devices_per_worker`` CPU devices (the
same graph, runnable anywhere: tests and benchmarks use it)."""

from __future__ import annotations

import tensorflow as tf

from .errors import TaskConfigError


def gpu_count() -> int:
    return len(tf.config.list_physical_devices("GPU"))


def tower_count(devices_per_worker: int | None, gpus: int) -> int:
    """``devices_per_worker``, or the worker's GPUs (at least 1) when it is None."""
    if devices_per_worker is None:
        return max(1, gpus)
    if 0 < gpus < devices_per_worker:
        raise TaskConfigError(
            f"devices_per_worker={devices_per_worker} but this worker has {gpus} GPU(s): ask for at most "
            f"{gpus} towers, or give the worker more GPUs (resources.limits['nvidia.com/gpu'])"
        )
    return devices_per_worker


def cpu_devices_needed(devices_per_worker: int | None) -> int | None:
    """CPU devices the worker's server must expose for its towers (None: the default one)."""
    towers = tower_count(devices_per_worker, gpu_count())
    return towers if towers > 1 and gpu_count() < towers else None


def tower_devices(worker_device: str, devices_per_worker: int | None) -> list[str]:
    """``/job:worker/task:0/device:GPU:0``, ... one per tower (CPU devices without GPUs)."""
    gpus = gpu_count()
    towers = tower_count(devices_per_worker, gpus)
    kind = "GPU" if gpus >= towers and gpus else "CPU"
    return [f"{worker_device}/device:{kind}:{i}" for i in range(towers)]


def split_batch(tensor, towers: int) -> list:
    """``towers`` consecutive shares of a batch, as even as possible (batch sizes vary)."""
    size = tf.shape(tensor)[0]
    bounds = [size * i // towers for i in range(towers + 1)]
    return [tensor[bounds[i]:bounds[i + 1]] for i in range(towers)]


def towers_train_op(model, features, labels, forward, loss_of, *, optimizer, global_step, var_list,
                    cluster, devices: list[str]):
    """The batch's loss and the train op of ``len(devices)`` towers sharing ``model``.

    ``forward(model, features) -> (predictions, state_updates)`` runs the model in training
    mode, ``loss_of(labels, predictions)`` is the batch's mean loss. Every tower's ops run on
    its device; the variables stay where they are (on the ps). Returns ``(loss, train_op)``."""
    if isinstance(features, dict):
        # Every feature splits into len(devices) shares, and each share has every feature.
        shares = [dict(zip(features, parts, strict=True)) for parts in
                  zip(*(split_batch(features[name], len(devices)) for name in features), strict=True)]
    else:
        shares = split_batch(features, len(devices))
    cluster, label_shares = tf.train.ClusterSpec(cluster), split_batch(labels, len(devices))
    losses, weights, tower_grads, updates = [], [], [], []
    for device, share, label_share in zip(devices, shares, label_shares, strict=True):
        setter = tf.compat.v1.train.replica_device_setter(cluster=cluster, worker_device=device)
        with tf.compat.v1.device(setter), tf.name_scope(f"tower_{device.rsplit(':', 1)[-1]}"):
            predictions, state_updates = forward(model, share)
            loss = loss_of(label_share, predictions)
            grads = optimizer.compute_gradients(loss, var_list=var_list)
        losses.append(loss)
        weights.append(tf.cast(tf.shape(label_share)[0], loss.dtype))
        tower_grads.append([g for g, _ in grads])
        updates += state_updates
    # Each tower's gradient is of its share's mean loss: weighting by the share gives the
    # gradient of the whole batch's mean loss. An empty share (a batch smaller than the number
    # of towers) has a NaN mean loss and weighs nothing.
    total = tf.add_n(weights)

    def average(values):
        if isinstance(values[0], tf.IndexedSlices):  # embedding rows: the towers' rows side by side, still sparse
            return tf.IndexedSlices(
                tf.concat([tf.math.multiply_no_nan(v.values, tf.cast(w / total, v.values.dtype))
                           for v, w in zip(values, weights, strict=True)], axis=0),
                tf.concat([v.indices for v in values], axis=0), values[0].dense_shape)
        return tf.add_n([tf.math.multiply_no_nan(v, tf.cast(w, v.dtype)) for v, w in zip(values, weights, strict=True)]) / \
            tf.cast(total, values[0].dtype)

    # compute_gradients gives one gradient (or None) per variable of var_list, on every tower.
    averaged = [(None if per_tower[0] is None else average(per_tower), variable)
                for per_tower, variable in zip(zip(*tower_grads, strict=True), var_list, strict=True)]
    loss = average(losses)
    return loss, tf.group(optimizer.apply_gradients(averaged, global_step=global_step), *updates)
