"""Coordinator mode against between-graph replication (the baseline), in the same run: the same
model, data, batch size, step count and 1 ps + 2 workers on the local backend (coordinator
mode adds its chief process, which schedules the steps).

Printed for each: examples/s over the training (from the chief's ``session ready`` line, when
training starts, to its last progress line), seconds from that start until a reported loss
reaches ``--loss`` ("time to the same loss"), and launch -> group done; then the ratios
coordinator / between-graph.

The two modes alternate ``--repeat`` times and the best run of each is kept: other load on the
machine only lowers figures.

Usage: ``.venv/bin/python bench/bench_modes.py [--workdir DIR] [--steps 2000] [--loss 1.0] [--repeat 2]``
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import datetime
from pathlib import Path

from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.wait import run_group
from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.cluster.progress import PREFIX, parse_progress
from airflow_tf.data import prepare_dataset
from airflow_tf.data.samples import write_linear_regression_csv

SESSION_READY = "airflow-tf session ready global_step=0 "


def stamp_of(line: str) -> float:
    return datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()


def progress_lines(log_text: str) -> tuple[float, list[tuple[float, dict]]]:
    """When the chief's training started (its last ``session ready`` line), and (time, progress)
    of every progress line after it."""
    start, lines = None, []
    for line in log_text.splitlines():
        if SESSION_READY in line:
            start, lines = stamp_of(line), []
        elif PREFIX in line:
            lines.append((stamp_of(line), parse_progress(line)))
    return start, lines


def train_and_measure(backend: LocalBackend, config: TrainingConfig, name: str, workers: int = 2) -> dict:
    """Run a group to its target; examples/s, time to ``loss`` and wall time from its chief's log."""
    spec = GroupSpec.for_training(name, config, ps=1, workers=workers)
    logs_dir = Path(config.run_dir).parent / f"{name}-logs"
    started = time.monotonic()
    result = run_group(backend, spec, logs_dir=logs_dir)
    wall = time.monotonic() - started
    if not result.outcome.succeeded:
        raise RuntimeError(f"{name} failed: {result.report}")
    role, index = spec.chief_task()
    (log,) = [p for p in logs_dir.rglob(f"*{role}-{index}.log")]
    t0, lines = progress_lines(log.read_text())
    t1, last = lines[-1]
    rate = last["global_step"] * config.batch_size / (t1 - t0)
    return {"lines": lines, "examples_per_sec": rate, "t0": t0, "wall": wall, "steps": last["global_step"]}


def time_to_loss(measured: dict, loss: float) -> float | None:
    for stamp, progress in measured["lines"]:
        if progress["loss"] is not None and progress["loss"] <= loss:
            return stamp - measured["t0"]
    return None


def linear_dataset(root: Path) -> str:
    csv = write_linear_regression_csv(root / "linear.csv", rows=20_000, seed=0)
    return prepare_dataset(csv, root / "datasets", name="linear", label="y", shards=4)["dataset_uri"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--loss", type=float, default=1.0, help="the loss both modes must reach")
    parser.add_argument("--repeat", type=int, default=2, help="runs per mode (best kept)")
    args = parser.parse_args()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="bench-modes-"))
    root.mkdir(parents=True, exist_ok=True)
    backend = LocalBackend(root / "groups")
    print(f"workdir {root}; {os.cpu_count()} CPU(s); load average {os.getloadavg()[0]:.1f}", flush=True)
    dataset = linear_dataset(root)

    measured: dict[str, dict] = {}
    for attempt, mode in ((a, m) for a in range(args.repeat) for m in ("between_graph", "coordinator")):
        config = TrainingConfig(dataset=dataset, run_dir=str(root / f"{mode}-{attempt}" / "run"), mode=mode,
                                steps=args.steps, batch_size=64, learning_rate=0.005, log_every_secs=0.5,
                                checkpoint_every_secs=5)
        m = train_and_measure(backend, config, f"{mode.replace('_', '-')}-{attempt}")
        if m["examples_per_sec"] > measured.get(mode, {}).get("examples_per_sec", 0):
            measured[mode] = m
        reached = time_to_loss(m, args.loss)
        print(f"{mode:13s}: {m['examples_per_sec']:8.0f} examples/s, loss <= {args.loss:g} after "
              f"{'never' if reached is None else f'{reached:.2f} s'}, launch -> done {m['wall']:.1f} s "
              f"({m['steps']} steps)", flush=True)
    base, ours = measured["between_graph"], measured["coordinator"]
    print(f"best of {args.repeat}:", flush=True)
    print(f"coordinator / between-graph: examples/s {ours['examples_per_sec'] / base['examples_per_sec']:.2f}x, "
          f"launch -> done {ours['wall'] / base['wall']:.2f}x", end="")
    b, o = time_to_loss(base, args.loss), time_to_loss(ours, args.loss)
    print(f", time to loss {o / b:.2f}x" if b and o else "", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
