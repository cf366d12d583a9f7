"""Partitioned prepare: one dataset version written by N parallel parts against one prepare
of the same files, same run.

Generates ``--files`` CSV files (20 float columns + label, ``--rows`` rows in all) and prepares
them twice: baseline, one ``prepare_dataset`` call (its encoding threads use every core); ours,
``plan_parts`` -> ``--partitions`` processes each running ``prepare_part`` at once (as the mapped
Airflow tasks do) -> ``commit_parts``. Prints wall time, rows/s, the speed-up (goal >= 1.7x for
2 partitions on 2 cores) and checks that both versions hold the same number of rows per split.
Usage: ``.venv/bin/python bench/bench_prepare_parts.py [--rows 2000000] [--partitions 2]``
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prepare import generate_csv  # noqa: E402


def _part(plan: dict, index: int, workers: int) -> None:
    from airflow_tf.data.partitioned import prepare_part

    prepare_part(plan, index, workers=workers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--workdir", help="keep the files here (default: a temporary directory)")
    args = parser.parse_args()

    from airflow_tf.data import prepare_dataset
    from airflow_tf.data.partitioned import commit_parts, plan_parts

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        (work / "in").mkdir(parents=True, exist_ok=True)
        for i in range(args.files):
            generate_csv(work / "in" / f"part-{i}.csv", args.rows // args.files, 20, seed=i)
        print(f"{os.cpu_count()} cores, {args.rows:,} rows in {args.files} files, {args.partitions} partitions")

        start = time.perf_counter()
        single = prepare_dataset(work / "in", work / "out", "single", label="label")
        single_s = time.perf_counter() - start

        start = time.perf_counter()
        plan = plan_parts(work / "in", work / "out", "parted", args.partitions, label="label")
        workers = max(1, (os.cpu_count() or 1) // len(plan["parts"]))
        context = multiprocessing.get_context("spawn")
        processes = [context.Process(target=_part, args=(plan, i, workers)) for i in range(len(plan["parts"]))]
        for process in processes:
            process.start()
        for process in processes:
            process.join()
        if any(p.exitcode for p in processes):
            raise SystemExit("a part failed")
        parted = commit_parts(plan)
        parted_s = time.perf_counter() - start

        print(f"{'':32s} {'wall s':>8s} {'rows/s':>11s}")
        print(f"{'1 prepare (all cores)':32s} {single_s:8.2f} {args.rows / single_s:11,.0f}")
        print(f"{f'{len(processes)} parts in parallel + commit':32s} {parted_s:8.2f} {args.rows / parted_s:11,.0f}")
        print(f"speed-up: {single_s / parted_s:.2f}x (goal >= 1.7x with 2 partitions on 2 cores)")
        same = parted["counts"] == single["counts"]
        print(f"same rows per split: {'yes' if same else 'NO'} ({single['counts']} / {parted['counts']})")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
