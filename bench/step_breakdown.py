"""Where a between-graph worker step of bench_keras_fit.py's MLP goes: the same 1 ps + 1 worker
step (64 -> 512 -> 512 -> 10, batch 1024, SGD) built up part by part, each variant in a fresh
process with its own two ``tf.distribute.Server`` on loopback, the variants alternated
``--rounds`` times. Prints each run's ms per step and, per variant, the median over the bare
graph's.

Variants (``--only``, comma-separated):

- **bare**: hand-written weights, the batch drawn in the graph (no input pipeline);
- **keras**: the model as the runtime builds it (a Keras input per column, concatenated);
- **columns**: keras, its batch gathered from 64 in-memory columns, one gather per column;
- **matrix**: keras, its batch gathered as whole rows of one matrix and split into columns
  (what ``make_dataset(..., in_memory_bytes=...)`` does);
- **matrix-chain8**: matrix, 8 steps chained in one ``session.run``;
- **matrix-chain8-pushed**: matrix-chain8 with the variables on the worker, as a sole writer
  could keep them: the chain updates them there and copies them to the ps once at its end (the
  copy a checkpoint would be saved from), instead of each step reading them from the ps and
  pushing its update there;
- **matrix-intra2**: matrix, two threads per op;
- **matrix-xla**: matrix, the worker's step under ``tf.xla.experimental.jit_scope``.

Usage: ``.venv/bin/python bench/step_breakdown.py [--rounds 3] [--steps 800] [--only bare,columns,matrix]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import time

VARIANTS = ["bare", "keras", "columns", "matrix", "matrix-chain8", "matrix-chain8-pushed", "matrix-intra2",
            "matrix-xla"]
ROWS, COLUMNS, BATCH = 40_000, 64, 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _input(variant: str, tf, np):
    """The batch of one step: (features, labels); features a matrix (bare) or a dict of columns."""
    names = [f"f{i}" for i in range(COLUMNS)]
    if variant in ("bare", "keras"):
        x = tf.random.normal([BATCH, COLUMNS])
        y = tf.random.uniform([BATCH], maxval=10, dtype=tf.int64)
        return (x if variant == "bare" else dict(zip(names, tf.unstack(x, axis=1), strict=True))), y
    rng = np.random.default_rng(0)
    table = rng.normal(size=(ROWS, COLUMNS)).astype("float32")
    labels = tf.constant(rng.integers(0, 10, ROWS))
    if variant == "columns":
        columns = [tf.constant(table[:, i].copy()) for i in range(COLUMNS)]

        def gather(indices):
            return {n: tf.gather(c, indices) for n, c in zip(names, columns, strict=True)}, tf.gather(labels, indices)
    else:
        matrix = tf.constant(table)

        def gather(indices):
            rows = tf.unstack(tf.gather(matrix, indices), axis=1)
            return dict(zip(names, rows, strict=True)), tf.gather(labels, indices)
    ds = tf.data.Dataset.range(ROWS).shuffle(ROWS).repeat().batch(BATCH)
    ds = ds.map(gather, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)
    return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()


def _model(variant: str, tf, keras):
    """(forward function, its variables)."""
    if variant == "bare":
        w = [tf.compat.v1.get_variable(n, s) for n, s in (("w1", [COLUMNS, 512]), ("w2", [512, 512]), ("w3", [512, 10]))]
        return (lambda x: tf.nn.softmax(tf.nn.relu(tf.nn.relu(x @ w[0]) @ w[1]) @ w[2])), w
    inputs = [keras.Input((), name=f"f{i}") for i in range(COLUMNS)]
    x = keras.layers.Concatenate()([keras.ops.reshape(t, (-1, 1)) for t in inputs])
    for units in (512, 512):
        x = keras.layers.Dense(units, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x))
    return (lambda f: model([f[f"f{i}"] for i in range(COLUMNS)], training=True)), [
        w.value for w in model.trainable_weights]


def child(variant: str, steps: int) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    ports = free_port(), free_port()
    cluster = tf.train.ClusterSpec({"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]})
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=0) for job in ("ps", "worker")]
    chain = 8 if "chain8" in variant else 1
    pushed = variant.endswith("-pushed")
    with tf.Graph().as_default():
        # "-pushed": the model's variables on the worker, their copies on the ps.
        placement = "/job:worker/task:0" if pushed else tf.compat.v1.train.replica_device_setter(
            cluster=cluster, worker_device="/job:worker/task:0")
        with tf.compat.v1.device(placement):
            forward, variables = _model(variant, tf, keras)
        with tf.compat.v1.device("/job:ps/task:0"):
            copies = [tf.Variable(tf.zeros(v.shape), name=f"copy{i}") for i, v in enumerate(variables)] if pushed else []
        with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
                cluster=cluster, worker_device="/job:worker/task:0")):
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.05)
            train_op = None
            for _ in range(chain):
                with tf.control_dependencies([train_op] if train_op is not None else []):
                    features, labels = _input(variant, tf, np)
                    scope = tf.xla.experimental.jit_scope() if variant.endswith("xla") else contextlib.nullcontext()
                    with scope:
                        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, forward(features)))
                        gradients = optimizer.compute_gradients(loss, var_list=variables)
                    train_op = optimizer.apply_gradients(gradients)
            if copies:
                with tf.control_dependencies([train_op]):
                    train_op = tf.group(*(c.assign(v) for c, v in zip(copies, variables, strict=True)))
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=2 if variant.endswith("intra2") else 1,
                                          inter_op_parallelism_threads=2)
        config.device_filters.extend(["/job:ps", "/job:worker/task:0"])
        with tf.compat.v1.Session(servers[1].target, config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(5):
                session.run(train_op)
            calls = max(1, steps // chain)
            started = time.perf_counter()
            for _ in range(calls):
                session.run(train_op)
            print(json.dumps({"ms": (time.perf_counter() - started) * 1000 / (calls * chain)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--only", default=",".join(VARIANTS))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps)
        return
    variants = args.only.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--only: unknown variant(s) {', '.join(unknown)}; the variants are {', '.join(VARIANTS)}")
    measured: dict[str, list[float]] = {v: [] for v in variants}
    for round_ in range(args.rounds):
        for variant in variants:
            out = subprocess.run([sys.executable, __file__, "--child", variant, "--steps", str(args.steps)],
                                 capture_output=True, text=True, check=True,
                                 env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
            ms = json.loads(out.stdout.strip().splitlines()[-1])["ms"]
            measured[variant].append(ms)
            print(f"round {round_ + 1} {variant:14s} {ms:6.1f} ms/step", flush=True)
    bare = statistics.median(measured["bare"]) if "bare" in measured else None
    print(f"median (min-max) of {args.rounds} rounds:")
    for variant, runs in measured.items():
        ratio = f"  {statistics.median(runs) / bare:.2f}x bare" if bare else ""
        print(f"  {variant:14s} {statistics.median(runs):6.1f} ({min(runs):.1f}-{max(runs):.1f}) ms/step{ratio}")


if __name__ == "__main__":
    main()
