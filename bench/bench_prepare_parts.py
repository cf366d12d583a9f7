"""Partitioned prepare: one dataset version written by N parallel parts against one prepare
of the same files, same run.

Generates ``--files`` CSV files (20 float columns + label, ``--rows`` rows in all) and prepares
them three times: one ``prepare_dataset`` call (its encoding threads use every core); one part
alone (``plan_parts`` with one partition, its process given a part's share of the cores, as a
pod with a CPU limit would be); and ours, ``plan_parts`` -> ``--parts`` processes each
running ``prepare_part`` at once with that share (as the mapped Airflow tasks or pods do) ->
``commit_parts``. Prints wall time, rows/s, both speed-ups (the goal, >= 1.7x for 2 parts
on 2 cores, is against one part) and checks that the versions hold the same rows per split.
``--pin`` binds each part to its share of the cores, as pods with a CPU limit each would be.
Usage: ``.venv/bin/python bench/bench_prepare_parts.py [--rows 2000000] [--parts 2] [--pin]``
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


def _part(plan: dict, index: int, threads: int, pin: bool) -> None:
    from airflow_tf.data.parts import prepare_part

    if pin:
        # The part's own cores, as a pod's CPU limit would give it: every thread of the
        # process (Arrow's reader included) stays on them.
        cores = os.cpu_count() or 1
        os.sched_setaffinity(0, {(index * threads + k) % cores for k in range(threads)})
    prepare_part(plan, index, encode_threads=threads)


def run_parts(work: Path, name: str, parts: int, threads: int, pin: bool) -> tuple[dict, dict[str, float]]:
    """plan -> one process per part, all at once -> commit, as the mapped tasks run them;
    the summary and the seconds of each stage."""
    from airflow_tf.data.parts import commit_parts, plan_parts

    start = time.perf_counter()
    plan = plan_parts(work / "in", work / "out", name, parts, label="label")
    planned = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_part, args=(plan, i, threads, pin)) for i in range(len(plan["parts"]))]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    if any(p.exitcode for p in processes):
        raise SystemExit(f"a part of {name} failed")
    parted = time.perf_counter()
    summary = commit_parts(plan)
    end = time.perf_counter()
    return summary, {"total": end - start, "plan": planned - start, "parts": parted - planned, "commit": end - parted}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--workdir", help="keep the files here (default: a temporary directory)")
    parser.add_argument("--pin", action="store_true",
                        help="bind each part to its share of the cores (as pods with a CPU limit each)")
    args = parser.parse_args()

    from airflow_tf.data import prepare_dataset

    # A part's share of the cores: what each of --parts pods or task slots on this machine gets.
    threads = max(1, (os.cpu_count() or 1) // args.parts)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        (work / "in").mkdir(parents=True, exist_ok=True)
        for i in range(args.files):
            generate_csv(work / "in" / f"part-{i}.csv", args.rows // args.files, 20, seed=i)
        print(f"{os.cpu_count()} cores, {args.rows:,} rows in {args.files} files, {args.parts} parts, "
              f"{threads} encoding thread(s) per part" + (", each part bound to its own core(s)" if args.pin else ""))

        start = time.perf_counter()
        single = prepare_dataset(work / "in", work / "out", "single", label="label")
        single_s = time.perf_counter() - start
        alone, alone_stages = run_parts(work, "one-part", 1, threads, args.pin)
        parted, parted_stages = run_parts(work, "parted", args.parts, threads, args.pin)
        alone_s, parted_s = alone_stages["total"], parted_stages["total"]

        print(f"{'':32s} {'wall s':>8s} {'rows/s':>11s}")
        for what, seconds in (("1 prepare (all cores)", single_s), (f"1 part ({threads} thread(s)) + commit", alone_s),
                              (f"{args.parts} parts in parallel + commit", parted_s)):
            print(f"{what:32s} {seconds:8.2f} {args.rows / seconds:11,.0f}")
        for what, stages in (("1 part", alone_stages), (f"{args.parts} parts", parted_stages)):
            print(f"{what}: plan {stages['plan']:.2f} s, parts {stages['parts']:.2f} s (processes started, "
                  f"ran, ended), commit {stages['commit']:.2f} s")
        print(f"speed-up against one part: {alone_s / parted_s:.2f}x "
              f"(goal >= 1.7x with 2 parts on 2 cores)")
        print(f"speed-up against one prepare on all cores: {single_s / parted_s:.2f}x")
        same = parted["counts"] == single["counts"] == alone["counts"]
        print(f"same rows per split: {'yes' if same else 'NO'} ({single['counts']} / {alone['counts']} / {parted['counts']})")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
