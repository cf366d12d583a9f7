"""What a small training group costs to start and run: an earlier commit against the current code,
in the same run.

Both run ``airflow-tf run`` (the local backend, 1 ps + ``--workers`` workers, ``--steps`` steps of
the built-in linear regression) on the same prepared dataset, alternated ``--rounds`` times. The
baseline is ``--baseline`` (default e48f45f: TensorFlow loaded with everything Keras imports when
installed) from a temporary worktree (``history.py``); ours is the working copy. Each run's CPU is
read from ``/proc`` by kind of process (``suite_cpu.py``): the ps, the workers, the rest. Prints
each run, the medians, and ours over the baseline. A group this small spends most of its CPU
starting its tasks, which is what a test suite, a sweep of small runs or a restarted group pays.

``.venv/bin/python bench/bench_task_start.py [--rounds 3] [--workers 2] [--steps 100] [--baseline e48f45f]``
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import history
from suite_cpu import measure

RUN = ["-m", "airflow_tf.cli", "run", "--model", "linear_regression", "--ps", "1"]


def _dataset(workdir: Path) -> Path:
    source = workdir / "linear.csv"
    with source.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["x", "y"])
        writer.writerows([f"{i / 1000:.3f}", f"{2 * i / 1000 + 10:.3f}"] for i in range(2000))
    subprocess.run([sys.executable, "-m", "airflow_tf.cli", "prepare", "--input", str(source), "--output",
                    str(workdir / "datasets"), "--name", "linear", "--label", "y"], check=True,
                   stdout=subprocess.DEVNULL)
    return workdir / "datasets" / "linear" / "1"


def _run(name: str, dataset: Path, workdir: Path, args: argparse.Namespace, tree: Path | None) -> dict:
    run_dir = workdir / f"run-{name}"
    command = [sys.executable, *RUN, "--dataset", str(dataset), "--workers", str(args.workers),
               "--steps", str(args.steps), "--run-dir", str(run_dir), "--name", f"start-{name}",
               "--state-dir", str(workdir / "groups")]
    usage = measure(command, interval=0.2, cwd=tree or history.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    env=history.environment(tree) if tree else None)
    if usage.returncode:
        raise SystemExit(f"{name}: airflow-tf run exited {usage.returncode}")
    tasks = {kind: seconds for kind, seconds in usage.cpu.items() if kind.startswith("tensorflow task")}
    return {"wall": usage.wall, "ps": tasks.get("tensorflow task (ps)", 0.0),
            "workers": sum(s for k, s in tasks.items() if k != "tensorflow task (ps)"),
            "all": sum(usage.cpu.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--baseline", default="e48f45f", help="the commit to compare with (default e48f45f)")
    args = parser.parse_args(argv)
    results: dict[str, list[dict]] = {"baseline": [], "ours": []}
    with tempfile.TemporaryDirectory(prefix="bench-task-start-") as tmp, history.checkout(args.baseline) as tree:
        workdir = Path(tmp)
        where = subprocess.run([sys.executable, "-c", "import os, airflow_tf; print(os.path.dirname(airflow_tf.__file__))"],
                               cwd=tree, env=history.environment(tree), capture_output=True, text=True,
                               check=True).stdout.strip()
        history.check_imported_from(tree, where)
        dataset = _dataset(workdir)
        for round_ in range(1, args.rounds + 1):
            for name, source in (("baseline", tree), ("ours", None)):
                figures = _run(f"{name}-{round_}", dataset, workdir, args, source)
                results[name].append(figures)
                print(f"round {round_} {name:8} wall {figures['wall']:5.1f} s  CPU: ps {figures['ps']:5.1f} s, "
                      f"workers {figures['workers']:5.1f} s, all {figures['all']:5.1f} s", flush=True)
    median = {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in results.items()}
    print(f"\n1 ps + {args.workers} workers, {args.steps} steps; medians of {args.rounds} rounds "
          f"(baseline {args.baseline})")
    for name, m in median.items():
        print(f"  {name:8} wall {m['wall']:5.1f} s  CPU: ps {m['ps']:5.1f} s, workers {m['workers']:5.1f} s, "
              f"all {m['all']:5.1f} s")
    b, o = median["baseline"], median["ours"]
    print(f"  ours / baseline: wall {o['wall'] / b['wall']:.2f}x, ps CPU {o['ps'] / b['ps']:.2f}x, "
          f"workers' CPU {o['workers'] / b['workers']:.2f}x, all CPU {o['all'] / b['all']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
