"""Embedding tables on the parameter servers: a click model (two string ids -> ``Hashing`` ->
``Embedding(rows, dim)`` each -> a small dense head, Adagrad, 2 ps + 2 async workers on the
local backend), for tables of 1k, 1M and 4M rows, against baselines measured in the same run:

- **whole table (baseline)**: the same model with Keras's own lookup (the table read whole
  and gathered on the worker, the table whole on one ps): what the group did before;
- **on the ps (ours)**: the same model as users write it; airflow-tf shards each table over
  the ps tasks and looks the rows up there;
- **Keras fit**: the same model and optimizer in one process, ``model.fit`` on the same data.

Prints examples/s (median of the progress reports after start-up, a checkpoint written every 10 s),
each ps's peak resident memory (VmHWM, checkpoint writes included) and its resident memory at
the end of the run, and bytes moved per step (the loopback traffic of the group's private network
namespace, both directions, divided by the global steps). Goals: the 1M table at >= 0.7x the 1k
table's examples/s; the largest ps of the 4M x 32 table at <= its share (tables and Adagrad
slots / ps count) + 25 %; ahead of Keras fit on the 1M table.

Usage: ``.venv/bin/python bench/bench_embeddings.py [--seconds 20] [--tables 1k,1m,4m] [--skip-baseline-4m]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from airflow_tf.backends.local import LocalBackend
from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.data import prepare_dataset
from airflow_tf.data.samples import write_clicks_csv

MODEL = '''
import keras


class KerasLookup(keras.layers.Embedding):
    """Keras's own lookup, kept as it is (a layer with its own call keeps Keras's path)."""

    def call(self, inputs):
        return super().call(inputs)


def build(rows, dim, whole_table=False):
    layer = KerasLookup if whole_table else keras.layers.Embedding
    user = keras.Input((), dtype="string", name="user")
    item = keras.Input((), dtype="string", name="item")
    u = layer(rows, dim)(keras.layers.Hashing(rows)(user))
    i = layer(rows, dim)(keras.layers.Hashing(rows)(item))
    x = keras.layers.Dense(32, activation="relu")(keras.layers.Concatenate()([u, i]))
    return keras.Model({"user": user, "item": item}, keras.layers.Dense(1, activation="sigmoid")(x))
'''

TABLES = {"1k": (1_024, 16), "1m": (1_048_576, 16), "4m": (4_194_304, 32)}
BATCH = 256
CHECKPOINT_EVERY_SECS = TrainingConfig.checkpoint_every_secs
"""Checkpoints as users get them (every 10 s): a ps's peak is reached while one is written, so the
measured seconds (at least 15) hold at least one."""


def group_pids(group: str) -> dict[str, int]:
    """``{"ps-0": pid, ...}`` of the group's runtime processes (by the task name in their environment)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                runtime = b"airflow_tf.runtime" in f.read()
        except OSError:
            continue
        name = env.get(b"AIRFLOW_TF_TASK", b"").decode()
        if runtime and name.startswith(group + "-"):
            found[name[len(group) + 1:]] = int(entry)
    return found


def rss_mib(pid: int, field: str = "VmHWM") -> float:
    """The process's peak (``VmHWM``) or current (``VmRSS``) resident memory."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def loopback_bytes(pid: int) -> int:
    """Bytes received on the loopback of the process's network namespace (each byte sent there is received there)."""
    with open(f"/proc/{pid}/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[0])
    return 0


def train(backend: LocalBackend, dataset: str, root: Path, label: str, rows: int, dim: int, whole_table: bool,
          seconds: float) -> dict:
    name = f"emb-{label}-{'whole' if whole_table else 'ps'}"
    config = TrainingConfig(dataset=dataset, run_dir=str(root / name), model="bench_click_model:build",
                            model_kwargs={"rows": rows, "dim": dim, "whole_table": whole_table},
                            loss="binary_crossentropy", optimizer="adagrad", learning_rate=0.05, batch_size=BATCH,
                            steps=10_000_000, log_every_secs=1.0, checkpoint_every_secs=CHECKPOINT_EVERY_SECS,
                            ps_memory_limit="64Gi")
    spec = GroupSpec.for_training(name, config, ps=2, workers=2)
    ref = backend.launch(spec)
    rates, traffic, started = {}, [], time.monotonic()
    try:
        deadline = None
        while deadline is None or time.monotonic() < deadline:
            status = backend.status(ref)
            if status.failure or any(t.phase.value == "Failed" for t in status.tasks):
                raise RuntimeError(f"{name} failed: {status.failure or [t.reason for t in status.tasks]}; "
                                   f"see {backend.log_path(ref, 'worker', 0)}")
            progress = status.progress
            if progress and progress["global_step"] not in rates:
                rates[progress["global_step"]] = progress["examples_per_sec"]
                pids = group_pids(name)
                if "ps-0" in pids:
                    traffic.append((progress["global_step"], loopback_bytes(pids["ps-0"])))
                if deadline is None and len(rates) == 3:
                    deadline = time.monotonic() + seconds
            if deadline is None and time.monotonic() - started > 600:
                raise RuntimeError(f"{name}: no steady training after 600 s")
            time.sleep(0.2)
        pids = group_pids(name)
        peaks = {task: rss_mib(pid) for task, pid in sorted(pids.items()) if task.startswith("ps")}
        now = {task: rss_mib(pid, "VmRSS") for task, pid in sorted(pids.items()) if task.startswith("ps")}
    finally:
        backend.teardown(ref)
    steady = [rate for _, rate in sorted(rates.items())[3:]] or list(rates.values())
    (s0, b0), (s1, b1) = traffic[2] if len(traffic) > 3 else traffic[0], traffic[-1]
    return {"rate": statistics.median(steady), "ps_peak_mib": peaks, "ps_rss_mib": now,
            "bytes_per_step": (b1 - b0) / (s1 - s0) if s1 > s0 else float("nan")}


KERAS_FIT = '''
import sys, time, json
import keras
sys.path.insert(0, sys.argv[1])
from bench_click_model import build
from airflow_tf.data import make_dataset
rows, dim, seconds, dataset = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
model = build(rows, dim)
model.compile(optimizer=keras.optimizers.Adagrad(0.05), loss="binary_crossentropy")
data = make_dataset(dataset, "train", %d, epochs=None, shuffle=True, seed=0)
times = []
class Clock(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        times.append(time.monotonic())
model.fit(data, steps_per_epoch=20, epochs=3, verbose=0, callbacks=[Clock()])  # warm-up
times.clear(); start = time.monotonic()
epochs = 0
while time.monotonic() - start < seconds:
    model.fit(data, steps_per_epoch=20, epochs=1, verbose=0)
    epochs += 1
print(json.dumps({"rate": epochs * 20 * %d / (time.monotonic() - start)}))
''' % (BATCH, BATCH)


def keras_fit(root: Path, dataset: str, rows: int, dim: int, seconds: float) -> float:
    import json

    out = subprocess.run([sys.executable, "-c", KERAS_FIT, str(root / "code"), str(rows), str(dim), str(seconds), dataset],
                         capture_output=True, text=True, check=False, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if out.returncode != 0:
        raise RuntimeError(f"keras fit failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["rate"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="steady-state seconds per run (at least 15, so that a checkpoint is written in them)")
    parser.add_argument("--tables", default="1k,1m,4m", help="tables to run, of " + ",".join(TABLES))
    parser.add_argument("--skip-baseline-4m", action="store_true",
                        help="skip the whole-table baseline of the 4M table (minutes for a few steps)")
    args = parser.parse_args()
    if args.seconds < 15:
        parser.error("--seconds must be at least 15: the peak memory is reached while a checkpoint is written")
    root = Path(args.workdir or tempfile.mkdtemp(prefix="bench-embeddings-"))
    (root / "code").mkdir(parents=True, exist_ok=True)
    (root / "code" / "bench_click_model.py").write_text(MODEL)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root / "code"), os.environ.get("PYTHONPATH")) if p)
    backend = LocalBackend(root / "groups")
    print(f"workdir {root}; {os.cpu_count()} CPU(s); load average {os.getloadavg()[0]:.1f} "
          "(figures are only meaningful on an otherwise idle machine)", flush=True)
    csv = write_clicks_csv(root / "clicks.csv", rows=200_000, users=5_000_000, items=5_000_000, seed=0)
    dataset = prepare_dataset(csv, root / "datasets", name="clicks", label="clicked", shards=4,
                              string_columns=["user", "item"])["dataset_uri"]
    results = {}
    for label in args.tables.split(","):
        rows, dim = TABLES[label]
        for whole in (True, False):
            if whole and label == "4m" and args.skip_baseline_4m:
                continue
            result = train(backend, dataset, root, label, rows, dim, whole, args.seconds)
            results[(label, whole)] = result
            peaks = ", ".join(f"{task} {mib:,.0f} MiB (now {result['ps_rss_mib'][task]:,.0f})"
                              for task, mib in result["ps_peak_mib"].items())
            print(f"{label:>3} rows x {dim:>2} {'whole table (baseline)' if whole else 'on the ps (ours)      '}: "
                  f"{result['rate']:9,.0f} examples/s  peak RSS {peaks}  "
                  f"{result['bytes_per_step'] / 2**20:9.3f} MiB moved/step", flush=True)
        if (label, True) in results:
            ratio = results[(label, False)]["rate"] / results[(label, True)]["rate"]
            print(f"{label:>3}: ours / whole table {ratio:.2f}x examples/s", flush=True)
        if label == "1m":
            fit = keras_fit(root, dataset, rows, dim, args.seconds)
            ours = results[(label, False)]["rate"]
            print(f" 1m Keras fit (1 process, Adagrad): {fit:9,.0f} examples/s; ours / fit {ours / fit:.2f}x  "
                  f"(goal > 1: {'met' if ours > fit else 'MISSED'})", flush=True)
    if ("1k", False) in results and ("1m", False) in results:
        ratio = results[("1m", False)]["rate"] / results[("1k", False)]["rate"]
        print(f"ours: 1M table / 1k table {ratio:.2f}x examples/s (goal >= 0.7x: {'met' if ratio >= 0.7 else 'MISSED'})")
    if ("4m", False) in results:
        rows, dim = TABLES["4m"]
        share = 2 * rows * dim * 4 * 2 / 2 / 2**20  # two tables + their Adagrad accumulators, over 2 ps
        small = results.get(("1k", False), {}).get("ps_peak_mib", {})
        largest = max(results[("4m", False)]["ps_peak_mib"].values())
        steady = max(results[("4m", False)]["ps_rss_mib"].values())
        if not small:
            print(f"ours 4M x 32: largest ps peak {largest:,.0f} MiB, while training {steady:,.0f} MiB; share "
                  f"{share:,.0f} MiB (the goal needs the 1k table's ps as the base: run with --tables 1k,4m)")
        else:
            base = max(small.values())
            goal = base + share * 1.25
            print(f"ours 4M x 32: largest ps peak {largest:,.0f} MiB, while training {steady:,.0f} MiB; share "
                  f"{share:,.0f} MiB over a 1k-table ps of {base:,.0f} MiB; goal <= {goal:,.0f} MiB: peak "
                  f"{'met' if largest <= goal else 'MISSED'}, while training {'met' if steady <= goal else 'MISSED'}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
