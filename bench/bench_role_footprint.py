"""What one task of each role takes on this machine: peak resident memory and CPU, the figures the
Kubernetes backend's default requests (``airflow_tf.backends.kubernetes.requests``) are derived from.

A 1 ps + 2 workers + 1 evaluator group trains the seed's linear regression on the local backend
while this script samples every task's process from /proc each 0.2 s: its peak resident memory
(``VmHWM`` of /proc/<pid>/status) and its CPU time (utime + stime of /proc/<pid>/stat) over its life,
whose busiest 1 s window is also kept. Then ``airflow-tf evaluate``, ``airflow-tf export`` and
``airflow-tf prepare`` (what a prepare part runs) each run as a child process whose peak RSS and
CPU time come from ``wait4``.

Usage: ``.venv/bin/python bench/bench_role_footprint.py [--steps 3000] [--workdir DIR]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.wait import run_group
from airflow_tf.cli import _record_launch
from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.data import prepare_dataset
from airflow_tf.data.samples import write_linear_regression_csv

TICKS = os.sysconf("SC_CLK_TCK")


def _sample(pid: int) -> tuple[int, float] | None:
    """(peak RSS bytes, CPU seconds) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return hwm, (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, StopIteration, ValueError, IndexError):
        return None


class Sampler(threading.Thread):
    """Every task's peak RSS and CPU time, read from /proc each 0.2 s while the group runs."""

    def __init__(self, backend: LocalBackend) -> None:
        super().__init__(daemon=True)
        self.backend, self.ref = backend, None
        self.stop = threading.Event()
        self.tasks: dict[tuple[str, int], dict[str, float]] = {}

    def run(self) -> None:
        while not self.stop.wait(0.2):
            now = time.monotonic()
            for comm, pid in (self.backend.processes(self.ref) if self.ref else {}).items():
                got = _sample(pid)
                if got is None:
                    continue
                hwm, cpu = got
                task = self.tasks.setdefault((comm, pid), {"first": now, "cpu0": cpu, "hwm": 0, "cpu": cpu,
                                                           "busiest": 0.0, "window": [(now, cpu)]})
                task["hwm"], task["cpu"], task["last"] = max(task["hwm"], hwm), cpu, now
                window = [(t, c) for t, c in task["window"] if now - t <= 1.0] + [(now, cpu)]
                task["window"] = window
                if now - window[0][0] >= 0.8:
                    task["busiest"] = max(task["busiest"], (cpu - window[0][1]) / (now - window[0][0]))


def _child(argv: list[str]) -> tuple[float, float, float]:
    """(peak RSS MiB, CPU s, wall s) of a command run to its end."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise RuntimeError(f"{argv} exited with status {status}")
    return usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    if args.workdir is None:  # a folder of its own, removed at the end
        with tempfile.TemporaryDirectory(prefix="airflow-tf-footprint-") as root:
            measure(Path(root), args.steps)
    else:
        measure(Path(args.workdir), args.steps)


def measure(root: Path, steps: int) -> None:
    csv = root / "linear.csv"
    write_linear_regression_csv(csv, rows=20_000)
    dataset = prepare_dataset(str(csv), str(root / "datasets"), name="linear", label="y")["dataset_uri"]
    run_dir = root / "runs" / "footprint"
    config = TrainingConfig(dataset=dataset, run_dir=str(run_dir), steps=steps, log_every_secs=1.0)
    spec = GroupSpec.for_training("footprint", config, ps=1, workers=2, evaluator=1)
    backend = LocalBackend(str(root / "state"))
    sampler = Sampler(backend)
    sampler.start()
    result = run_group(backend, spec, on_launched=lambda ref: setattr(sampler, "ref", ref))
    sampler.stop.set()
    sampler.join()
    if not result.outcome.succeeded:
        raise SystemExit(result.report)
    _record_launch(str(run_dir), spec, result.ref)  # what evaluate and export read, as after `airflow-tf run`
    print(f"{os.cpu_count()} CPU(s); load average {os.getloadavg()[0]:.1f}; {steps} steps of 1 ps + 2 workers "
          f"+ 1 evaluator (linear regression, 20,000 rows)")
    print(f"{'task':14} {'peak RSS MiB':>12} {'CPU s':>7} {'life s':>7} {'mean cores':>10} {'busiest 1 s':>11}")
    for (comm, _), t in sorted(sampler.tasks.items()):
        life = max(t.get("last", t["first"]) - t["first"], 1e-9)
        print(f"{comm.removeprefix('footprint-'):14} {t['hwm'] / 2**20:12.0f} {t['cpu'] - t['cpu0']:7.1f} {life:7.1f} "
              f"{(t['cpu'] - t['cpu0']) / life:10.2f} {t['busiest']:11.2f}")
    cli = [sys.executable, "-m", "airflow_tf.cli"]
    rows = {
        "evaluate": [*cli, "evaluate", "--run-dir", str(run_dir)],
        "export": [*cli, "export", "--run-dir", str(run_dir), "--model-name", "linear", "--force",
                   "--serving-base", str(root / "models")],
        "prepare": [*cli, "prepare", "--input", str(csv), "--output", str(root / "datasets"), "--name", "again",
                    "--label", "y", "--quiet"],
    }
    print(f"{'command':14} {'peak RSS MiB':>12} {'CPU s':>7} {'wall s':>7} {'mean cores':>10}")
    for name, argv in rows.items():
        rss, cpu, wall = _child(argv)
        print(f"{name:14} {rss:12.0f} {cpu:7.1f} {wall:7.1f} {cpu / wall:10.2f}")


if __name__ == "__main__":
    main()
