"""The click model of bench_embeddings.py as a TensorFlow user writes it without airflow-tf: the
baseline ``tf-partitioned`` there (issue 37).

TF1 style, between-graph, async: each table is a ``tf.compat.v1.get_variable`` split by
``fixed_size_partitioner(ps count)`` under ``replica_device_setter``; ``tf.nn.embedding_lookup``
on the partitioned variable gathers on the ps holding each part; the string ids are hashed as
Keras's ``Hashing`` does (``to_hash_bucket_fast``); a dense head (32 relu, 1 logit); TensorFlow's
``AdagradOptimizer`` (its accumulators created beside each part, on its ps); one
``session.run`` per step in a ``MonitoredTrainingSession`` that checkpoints every
``--checkpoint-secs``; each worker streams its own files of the prepared TFRecords. Thread
settings are TensorFlow's defaults; the device filters are the ones TensorFlow's distributed
guide sets for between-graph training.

``task`` runs the one task ``TF_CONFIG`` names; this part imports nothing of airflow-tf. Every
worker appends to ``<run dir>/progress-<index>.jsonl`` every ``--report-secs``: the global step,
the examples/s it moved by since the previous line and the mean loss of this worker's steps in
between (the measure the runtime's own progress report takes).

``group`` is the bench's launcher: it moves itself into a private network namespace (loopback
only, as the local backend's groups run), takes free ports there and starts the ps and worker
tasks with their ``TF_CONFIG``; they die with it. It writes ``<run dir>/pids.json`` and runs
until it receives SIGTERM, which it passes on to its tasks.

Usage: ``python bench/tf_partitioned_click.py group --rows R --dim D --batch B --run-dir DIR FILE...``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("group", "task"))
    parser.add_argument("files", nargs="+", help="the train split's TFRecord files (shared out by worker)")
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--dim", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--checkpoint-secs", type=float, default=10.0)
    parser.add_argument("--report-secs", type=float, default=1.0)
    parser.add_argument("--loss-on", choices=("logits", "probabilities"), default="logits",
                        help="logits: sigmoid_cross_entropy_with_logits, as a TensorFlow user writes it; "
                             "probabilities: Keras's binary_crossentropy of the sigmoid, as airflow-tf's model computes it")
    return parser.parse_args(argv)


# -- the TensorFlow program -------------------------------------------------------------------
def input_batches(tf, files: list[str], batch: int):
    spec = {"user": tf.io.FixedLenFeature([], tf.string), "item": tf.io.FixedLenFeature([], tf.string),
            "clicked": tf.io.FixedLenFeature([], tf.int64)}
    data = (tf.data.TFRecordDataset(files).shuffle(10_000).repeat().batch(batch)
            .map(lambda records: tf.io.parse_example(records, spec), num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))
    return tf.compat.v1.data.make_one_shot_iterator(data).get_next()


def click_model(tf, features, rows: int, dim: int, ps_count: int):
    """The logits of each example: both ids' rows concatenated, through the dense head."""
    v1 = tf.compat.v1
    looked_up = []
    for name in ("user", "item"):
        table = v1.get_variable(f"{name}_embedding", [rows, dim],
                                initializer=v1.random_uniform_initializer(-0.05, 0.05),  # Keras Embedding's
                                partitioner=v1.fixed_size_partitioner(ps_count))
        ids = tf.strings.to_hash_bucket_fast(features[name], rows)
        looked_up.append(tf.nn.embedding_lookup(table, ids))
    x = tf.concat(looked_up, axis=1)
    for name, width, activation in (("hidden", 32, tf.nn.relu), ("logit", 1, tf.identity)):
        kernel = v1.get_variable(f"{name}/kernel", [x.shape[1], width], initializer=v1.glorot_uniform_initializer())
        bias = v1.get_variable(f"{name}/bias", [width], initializer=v1.zeros_initializer())
        x = activation(tf.matmul(x, kernel) + bias)
    return tf.squeeze(x, axis=1)


def run_task(args: argparse.Namespace) -> None:
    import tensorflow as tf

    config = json.loads(os.environ["TF_CONFIG"])
    cluster = tf.train.ClusterSpec(config["cluster"])
    kind, index = config["task"]["type"], int(config["task"]["index"])
    device = f"/job:{kind}/task:{index}"
    session_config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", device])
    server = tf.distribute.Server(cluster, job_name=kind, task_index=index,
                                  config=None if kind == "ps" else session_config)
    if kind == "ps":
        server.join()
    is_chief = index == 0
    with tf.Graph().as_default():
        with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(cluster=cluster, worker_device=device)):
            global_step = tf.compat.v1.train.get_or_create_global_step()
            features = input_batches(tf, args.files[index::args.workers], args.batch)
            logits = click_model(tf, features, args.rows, args.dim, cluster.num_tasks("ps"))
            labels = tf.cast(features["clicked"], tf.float32)
            if args.loss_on == "logits":
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
            else:
                import keras

                loss = tf.reduce_mean(keras.losses.binary_crossentropy(labels[:, None], tf.sigmoid(logits)[:, None]))
            # Keras's Adagrad starts its accumulators at 0.1 too.
            optimizer = tf.compat.v1.train.AdagradOptimizer(args.learning_rate, initial_accumulator_value=0.1)
            train_op = optimizer.minimize(loss, global_step=global_step)
        report = progress_hook(tf, global_step, loss, args.batch, args.report_secs,
                                os.path.join(args.run_dir, f"progress-{index}.jsonl"))
        with tf.compat.v1.train.MonitoredTrainingSession(
                master=server.target, is_chief=is_chief, checkpoint_dir=args.run_dir if is_chief else None,
                save_checkpoint_secs=args.checkpoint_secs, config=session_config, hooks=[report]) as session:
            while not session.should_stop():
                session.run(train_op)


def progress_hook(tf, global_step, loss, batch: int, every_secs: float, path: str):
    """A session hook: every ``every_secs``, one JSON line with the global step, the examples/s
    since the last line (from the global step) and this worker's mean loss in between."""

    class ProgressReport(tf.compat.v1.train.SessionRunHook):
        def __init__(self):
            self.fetches = tf.compat.v1.train.SessionRunArgs({"step": global_step, "loss": loss})
            self.since, self.since_step, self.losses = None, 0, []

        def before_run(self, run_context):
            return self.fetches

        def after_run(self, run_context, run_values):
            now, step = time.time(), int(run_values.results["step"])
            self.losses.append(float(run_values.results["loss"]))
            if self.since is not None and now - self.since < every_secs:
                return
            rate = (step - self.since_step) * batch / (now - self.since) if self.since is not None else 0.0
            line = {"global_step": step, "time": now, "examples_per_sec": rate,
                    "loss": sum(self.losses) / len(self.losses)}
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")
            self.since, self.since_step, self.losses = now, step, []

    return ProgressReport()


# -- the bench's launcher ---------------------------------------------------------------------
def run_group(args: argparse.Namespace, argv: list[str]) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from airflow_tf.backends.local.network import isolate_network
    from airflow_tf.backends.local.processes import free_ports

    refused = isolate_network()  # before any thread starts
    if refused:
        print(f"no private network namespace ({refused}); the tasks listen on this machine's loopback", flush=True)
    os.makedirs(args.run_dir, exist_ok=True)
    ports = iter(free_ports(args.ps + args.workers))
    cluster = {"ps": [f"127.0.0.1:{next(ports)}" for _ in range(args.ps)],
               "worker": [f"127.0.0.1:{next(ports)}" for _ in range(args.workers)]}
    task_argv = [sys.executable, os.path.abspath(__file__), "task", *argv[1:]]
    tasks = {}
    for kind, addresses in cluster.items():
        for index in range(len(addresses)):
            env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}}),
                   "TF_CPP_MIN_LOG_LEVEL": "2"}
            with open(os.path.join(args.run_dir, f"{kind}-{index}.log"), "ab") as log:
                tasks[f"{kind}-{index}"] = subprocess.Popen(task_argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                                            stderr=subprocess.STDOUT, preexec_fn=_die_with_launcher)
    with open(os.path.join(args.run_dir, "pids.json"), "w") as f:
        json.dump({name: proc.pid for name, proc in tasks.items()}, f)

    def stop(signum, frame):
        for proc in tasks.values():
            proc.kill()
        for proc in tasks.values():
            proc.wait()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        for name, proc in tasks.items():
            if proc.poll() is not None:  # a task ended: the group is broken; the bench sees it exit
                print(f"{name} exited with {proc.returncode}", flush=True)
                stop(None, None)
        time.sleep(0.5)


def _die_with_launcher() -> None:
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


if __name__ == "__main__":
    parsed = options()
    if parsed.mode == "group":
        run_group(parsed, sys.argv[1:])
    else:
        run_task(parsed)
