"""Towers: one worker with 2 devices against the same worker with 1 (the baseline), in the same
run, on the same global batch (the worker's batch, split in halves by the towers), the same MLP
and data, 1 ps + 1 worker on the local backend.

There is no GPU here: the towers are the worker's two CPU devices, which share the machine's
cores, so this measures what towers cost or gain on CPUs (the graph a GPU worker runs, with its
per-tower split and gradient average), not a GPU speed-up. On a GPU worker each tower gets a GPU.

Printed: examples/s of each (first progress line to the last), the time to the same loss, and
the ratio 2 devices / 1.

The two alternate ``--repeat`` times and the best run of each is kept: other load on the
machine only lowers figures.

Usage: ``.venv/bin/python bench/bench_towers.py [--workdir DIR] [--steps 400] [--batch-size 1024] [--repeat 2]``
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from bench_group import mlp_dataset
from bench_modes import time_to_loss, train_and_measure

from airflow_tf.backends.local import LocalBackend
from airflow_tf.cluster import TrainingConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=1024, help="the worker's batch (the global batch)")
    parser.add_argument("--loss", type=float, default=1.5, help="the loss both runs must reach")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each (best kept)")
    args = parser.parse_args()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="bench-towers-"))
    root.mkdir(parents=True, exist_ok=True)
    backend = LocalBackend(root / "groups")
    print(f"workdir {root}; {os.cpu_count()} CPU(s); load average {os.getloadavg()[0]:.1f}", flush=True)
    dataset = mlp_dataset(root)

    measured: dict[int, dict] = {}
    for attempt, devices in ((a, d) for a in range(args.repeat) for d in (1, 2)):
        config = TrainingConfig(dataset=dataset, run_dir=str(root / f"{devices}dev-{attempt}" / "run"),
                                model="mlp_classifier",
                                model_kwargs={"num_classes": 10, "hidden_units": [256, 256]},
                                batch_size=args.batch_size, steps=args.steps, learning_rate=0.05,
                                devices_per_worker=devices, log_every_secs=0.5, checkpoint_every_secs=600,
                                intra_op_threads=1, inter_op_threads=2)
        m = train_and_measure(backend, config, f"towers-{devices}-{attempt}", workers=1)
        if m["examples_per_sec"] > measured.get(devices, {}).get("examples_per_sec", 0):
            measured[devices] = m
        reached = time_to_loss(m, args.loss)
        print(f"{devices} device(s): {m['examples_per_sec']:8.0f} examples/s, loss <= {args.loss:g} after "
              f"{'never' if reached is None else f'{reached:.2f} s'} ({m['steps']} steps of {args.batch_size})",
              flush=True)
    ratio = measured[2]["examples_per_sec"] / measured[1]["examples_per_sec"]
    print(f"best of {args.repeat}: 2 devices / 1 device: examples/s {ratio:.2f}x", end="")
    one, two = time_to_loss(measured[1], args.loss), time_to_loss(measured[2], args.loss)
    print(f", time to loss {two / one:.2f}x" if one and two else "", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
