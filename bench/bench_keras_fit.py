"""A 1 ps + 1 worker group against single-process Keras ``model.fit`` at equal cores, in the
same run: the same MLP (64 -> 512 -> 512 -> 10, SGD, batch 1024) on the same 40,000 rows, the
same number of steps, on the machine's cores (nothing pinned, as a new user would run either).

Contenders, alternated ``--rounds`` times:

- **keras**: ``model.fit`` on the rows in memory (a NumPy matrix), in a fresh process; its rate
  is timed between batch ends inside the one ``fit`` (windows of ``--window`` seconds, the first
  epoch left out);
- **group-1-step-streaming**: ``airflow-tf``'s group with ``steps_per_call=1`` and
  ``in_memory_input_bytes=0`` (one ``session.run`` per step, the TFRecord pipeline);
- **group**: the group with its defaults (several steps per call, the share in memory);
- **group-intra1**: the same with one thread per op in each task (the default before threads
  followed the role: now a lone worker on 2 cores runs 2);
- **group@COMMIT** (with ``--baseline COMMIT``): the group with its defaults as an earlier commit
  runs it, from a temporary worktree of that commit (``history.py``), to measure a change in
  the same run as the code before it.

A group's rate is the median of its chief's progress windows (``log_every_secs=1``), the first
two left out. Prints each round (with its slowest and fastest window), then per contender the
median and the spread (min-max) of the rates, the final losses (Keras: its last epoch's mean; a
group: its last progress window's), and each group's median rate over Keras's, and its rate over
Keras's round by round. Each group's run also shows the time from its chief's last progress
line to its exit line.

Usage: ``.venv/bin/python bench/bench_keras_fit.py [--rounds 3] [--steps 1200] [--only keras,group]
[--baseline COMMIT] [--workdir DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import history
from bench_group import mlp_dataset
from bench_modes import progress_lines, stamp_of

from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.wait import run_group
from airflow_tf.cluster import GroupSpec, TrainingConfig

BATCH = 1024
LEARNING_RATE = 0.05
HIDDEN = [512, 512]

KERAS_FIT = '''
import json, sys, time
import numpy as np
import keras

npz, steps, batch, lr, window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
data = np.load(npz)
x = np.stack([data[f"f{i}"] for i in range(64)], axis=1).astype("float32")
y = data["label"]
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512, activation="relu"),
                          keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(lr), loss="sparse_categorical_crossentropy")
per_epoch = -(-len(x) // batch)
ends = []


class Clock(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        ends.append(time.perf_counter())


history = model.fit(x, y, batch_size=batch, epochs=max(2, steps // per_epoch), verbose=0, callbacks=[Clock()])
rates, start = [], per_epoch  # the first epoch (tracing, warm-up) left out
for i in range(per_epoch + 1, len(ends)):
    if ends[i] - ends[start] >= window:
        examples = sum(min(batch, len(x) - (k % per_epoch) * batch) for k in range(start + 1, i + 1))
        rates.append(examples / (ends[i] - ends[start]))
        start = i
print(json.dumps({"rates": rates, "loss": history.history["loss"][-1], "steps": len(ends)}))
'''


def keras_fit(npz: Path, steps: int, window: float) -> dict:
    out = subprocess.run([sys.executable, "-c", KERAS_FIT, str(npz), str(steps), str(BATCH), str(LEARNING_RATE),
                          str(window)], capture_output=True, text=True, check=True,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {"rate": statistics.median(result["rates"]), "windows": window_range(result["rates"]),
            "loss": result["loss"], "steps": result["steps"]}


def window_range(rates: list[float]) -> str:
    """The slowest and the fastest window of one run, in thousands of examples/s."""
    return f"{min(rates) / 1000:.0f}k-{max(rates) / 1000:.0f}k"


def group(backend: LocalBackend, dataset: str, run_dir: Path, steps: int, **options) -> dict:
    config = TrainingConfig(dataset=dataset, run_dir=str(run_dir), model="mlp_classifier",
                            model_kwargs={"num_classes": 10, "hidden_units": HIDDEN}, batch_size=BATCH,
                            learning_rate=LEARNING_RATE, steps=steps, log_every_secs=1.0,
                            checkpoint_every_secs=600, **options)
    name = run_dir.name
    spec = GroupSpec.for_training(name, config, ps=1, workers=1)
    logs_dir = run_dir.parent / f"{name}-logs"
    result = run_group(backend, spec, logs_dir=logs_dir)
    if not result.outcome.succeeded:
        raise RuntimeError(f"{name} failed: {result.report}")
    (log,) = list(logs_dir.rglob("*worker-0.log"))
    text = log.read_text()
    _, lines = progress_lines(text)
    rates = [progress["examples_per_sec"] for _, progress in lines[2:-1]]  # the final report spans the exit
    (exit_line,) = [line for line in text.splitlines() if "airflow-tf task exit" in line]
    return {"rate": statistics.median(rates), "windows": window_range(rates), "loss": lines[-1][1]["loss"],
            "steps": lines[-1][1]["global_step"],
            "exit_secs": stamp_of(exit_line) - lines[-1][0]}


def group_of_commit(tree: Path, dataset: str, run_dir: Path, steps: int) -> dict:
    """:func:`group` with its defaults, run by a child that imports airflow_tf from ``tree`` (its
    tasks inherit the ``PYTHONPATH`` that puts the tree first)."""
    child = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child-group", json.dumps([dataset, str(run_dir), steps])],
                           cwd=tree, env=history.environment(tree), capture_output=True, text=True)
    if child.returncode:
        raise RuntimeError(f"the baseline's group failed:\n{child.stderr[-3000:]}")
    result = json.loads(child.stdout.strip().splitlines()[-1])
    history.check_imported_from(tree, result.pop("imported_from"))
    return result


CONTENDERS = {
    "keras": None,
    "group-1-step-streaming": {"steps_per_call": 1, "in_memory_input_bytes": 0},
    "group": {},
    "group-intra1": {"intra_op_threads": 1},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1200, help="training steps of every contender")
    parser.add_argument("--window", type=float, default=1.0, help="seconds per Keras rate window")
    parser.add_argument("--only", default=None, help="comma-separated contenders to run (default: all)")
    parser.add_argument("--baseline", metavar="COMMIT", default=None,
                        help="also run the group as COMMIT runs it (contender group@COMMIT)")
    parser.add_argument("--child-group", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_group:  # the baseline's group, in its commit's tree
        dataset, run_dir, steps = json.loads(args.child_group)
        result = group(LocalBackend(Path(run_dir).parent / "groups"), dataset, Path(run_dir), steps)
        print(json.dumps({**result, "imported_from": history.imported_from()}))
        return
    with history.checkout(args.baseline) if args.baseline else nullcontext() as tree:
        compare(args, tree)


def compare(args: argparse.Namespace, tree: Path | None) -> None:
    root = Path(args.workdir or tempfile.mkdtemp(prefix="bench-keras-fit-"))
    root.mkdir(parents=True, exist_ok=True)
    backend = LocalBackend(root / "groups")
    print(f"workdir {root}; {os.cpu_count()} CPU(s); load average {os.getloadavg()[0]:.1f}", flush=True)
    dataset = mlp_dataset(root)
    contenders = {k: v for k, v in CONTENDERS.items() if not args.only or k in args.only.split(",")}
    baseline = f"group@{args.baseline}" if tree is not None else None
    if baseline:
        contenders[baseline] = {}
    measured: dict[str, list[dict]] = {name: [] for name in contenders}
    for round_ in range(args.rounds):
        for i, (name, options) in enumerate(contenders.items()):
            started = time.monotonic()
            if options is None:
                m = keras_fit(root / "mlp.npz", args.steps, args.window)
            elif name == baseline:
                assert tree is not None
                m = group_of_commit(tree, dataset, root / f"run-{round_}-{i}", args.steps)
            else:
                m = group(backend, dataset, root / f"run-{round_}-{i}", args.steps, **options)
            measured[name].append(m)
            exit_secs = f", last progress line -> exit line {m['exit_secs']:.2f} s" if "exit_secs" in m else ""
            print(f"round {round_ + 1} {name:24s} {m['rate']:8.0f} examples/s (windows {m['windows']})  "
                  f"final loss {m['loss']:.4f}  "
                  f"({m['steps']} steps, {time.monotonic() - started:.0f} s{exit_secs})", flush=True)
    print(f"median (min-max) of {args.rounds} rounds:")
    keras_rate = statistics.median(m["rate"] for m in measured["keras"]) if "keras" in measured else None
    for name, runs in measured.items():
        rates = [m["rate"] for m in runs]
        ratio = ""
        if keras_rate and name != "keras":
            # Each round's contenders ran minutes apart at most: their ratio suffers less from
            # the machine's other load than rates taken across rounds.
            rounds = [m["rate"] / k["rate"] for m, k in zip(runs, measured["keras"], strict=True)]
            ratio = (f"  {statistics.median(rates) / keras_rate:.2f}x keras; per round "
                     f"{', '.join(f'{r:.2f}' for r in rounds)}x (median {statistics.median(rounds):.2f}x)")
        print(f"  {name:24s} {statistics.median(rates):8.0f} ({min(rates):.0f}-{max(rates):.0f}) examples/s  "
              f"final loss {statistics.median(m['loss'] for m in runs):.4f}{ratio}", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
