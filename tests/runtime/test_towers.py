"""Towers: two devices of one worker train on halves of its batch, gradients averaged, variables
on a ps. No GPU here: the worker's server exposes two CPU devices, which is the same graph."""

from __future__ import annotations

import socket

import keras
import numpy as np
import pytest
import tensorflow as tf
from serving_check import export_and_serve_elsewhere

from airflow_tf.runtime.errors import TaskConfigError
from airflow_tf.runtime.models import compute_loss
from airflow_tf.runtime.towers import tower_count, tower_devices, towers_train_op
from airflow_tf.runtime.training import training_forward

pytestmark = pytest.mark.slow

STEPS = 5
BATCH = 48


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """A real ps and worker over gRPC on loopback, in this process (a TensorFlow server cannot be
    stopped; they end with the test process). The worker has two CPU devices."""
    spec = tf.train.ClusterSpec({"ps": [f"localhost:{free_port()}"], "worker": [f"localhost:{free_port()}"]})
    tf.distribute.Server(spec, job_name="ps", task_index=0, start=True)
    worker = tf.distribute.Server(spec, job_name="worker", task_index=0, start=True,
                                  config=tf.compat.v1.ConfigProto(device_count={"CPU": 2}))
    return spec, worker.target


def train_steps(cluster, towers: int, batch: int = BATCH):
    """STEPS steps of a small network on one fixed batch; returns (losses, weights, graph)."""
    spec, target = cluster
    rng = np.random.default_rng(3)
    x = rng.uniform(-2, 2, (batch, 3)).astype(np.float32)
    y = (x @ np.array([2.0, -1.0, 0.5], np.float32) + 10.0 + rng.normal(0, 0.1, batch)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        setter = tf.compat.v1.train.replica_device_setter(cluster=spec, worker_device="/job:worker/task:0")
        with tf.compat.v1.device(setter):
            global_step = tf.compat.v1.train.get_or_create_global_step()
            model = keras.Sequential([
                keras.Input((3,)),
                keras.layers.Dense(8, activation="tanh", kernel_initializer=keras.initializers.RandomNormal(seed=1)),
                keras.layers.Dense(1, kernel_initializer=keras.initializers.RandomNormal(seed=2)),
            ])
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.05)
            var_list = [w.value for w in model.trainable_weights]
            features, labels = tf.constant(x), tf.constant(y)
            loss_of = lambda labels, predictions: compute_loss(keras.losses.get("mse"), labels, predictions)  # noqa: E731
            if towers == 1:  # what a worker without towers runs (runtime/training.py)
                predictions, _ = training_forward(model, features)
                loss = loss_of(labels, predictions)
                train_op = optimizer.minimize(loss, global_step=global_step, var_list=var_list)
            else:
                devices = tower_devices("/job:worker/task:0", towers)
                loss, train_op = towers_train_op(model, features, labels, training_forward, loss_of,
                                                 optimizer=optimizer, global_step=global_step, var_list=var_list,
                                                 cluster=spec, devices=devices)
        assert all(v.device.startswith("/job:ps/task:0") for v in tf.compat.v1.global_variables())
        with tf.compat.v1.Session(target, graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            losses = [session.run([loss, train_op])[0] for _ in range(STEPS)]
            weights = session.run(var_list)
            assert session.run(global_step) == STEPS
    return losses, weights, graph


def test_two_towers_learn_what_one_device_learns_on_the_same_batch(cluster):
    one_losses, one_weights, _ = train_steps(cluster, towers=1)
    two_losses, two_weights, graph = train_steps(cluster, towers=2)

    # Each tower ran on its own device (the session fails if a device does not exist).
    devices = {op.device.rsplit("/", 1)[-1] for op in graph.get_operations() if op.name.startswith("tower_")}
    assert {"device:CPU:0", "device:CPU:1"} <= devices, devices
    assert one_losses[-1] < one_losses[0], "the single-device run did not learn"
    np.testing.assert_allclose(two_losses, one_losses, rtol=1e-5)
    for two, one in zip(two_weights, one_weights):
        np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)


def test_a_batch_smaller_than_the_towers_trains_like_one_device(cluster):
    """One example for two towers: the empty share weighs nothing (its NaN mean loss included)."""
    one_losses, one_weights, _ = train_steps(cluster, towers=1, batch=1)
    two_losses, two_weights, _ = train_steps(cluster, towers=2, batch=1)
    assert np.isfinite(two_losses).all()
    np.testing.assert_allclose(two_losses, one_losses, rtol=1e-5)
    for two, one in zip(two_weights, one_weights):
        np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)


def test_tower_count_follows_the_gpus_unless_set():
    assert tower_count(None, gpus=0) == 1
    assert tower_count(None, gpus=4) == 4
    assert tower_count(2, gpus=0) == 2  # CPU towers
    assert tower_count(2, gpus=4) == 2
    with pytest.raises(TaskConfigError, match=r"has 1 GPU\(s\)"):
        tower_count(2, gpus=1)
    with pytest.raises(TaskConfigError, match=r"devices_per_worker=4 but this worker has 2 GPU\(s\)"):
        tower_count(4, gpus=2)


def test_a_worker_with_two_towers_trains_the_seed_line_with_variables_on_the_ps(linear_dataset, train,
                                                                                   tmp_path_factory):
    run = train("rt-towers", linear_dataset, tmp_path_factory.mktemp("towers") / "run", workers=1,
                devices_per_worker=2, steps=300)
    assert run.succeeded, run.report
    (started,) = run.lines("worker-0", "airflow-tf train ")
    assert "towers=2" in started
    (placed,) = run.lines("worker-0", "airflow-tf variables ")
    assert "/job:ps/task:0=" in placed and "/job:worker" not in placed
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run.run_dir)))
    w, b = (float(reader.get_tensor(name).squeeze()) for name in ("model/000_kernel", "model/001_bias"))
    assert abs(w - 2.0) < 0.1 and abs(b - 10.0) < 0.1, f"learned y = {w:.3f}x + {b:.3f}"
    export_and_serve_elsewhere(run.run_dir, linear_dataset, run.config, tmp_path_factory.mktemp("towers-served"))
