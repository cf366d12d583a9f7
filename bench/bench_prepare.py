"""CSV -> TFRecord conversion: memory and speed of the streaming prepare against the
whole-input-in-memory path it replaced, and (``--textbook``) against the textbook way. Same run.

For each ``--rows`` size it generates a numeric CSV (20 float columns + an integer label) and
converts it, every contender in a fresh process so that its peak resident memory (RSS) is its own:

* in-memory: the previous ``prepare_dataset`` (reads every file whole, then splits, shuffles,
  encodes and writes), the baseline: commit ``BASELINE``, run from a temporary worktree of it
  (bench/history.py) in the same run;
* streaming: ``prepare_dataset`` as it is now (reads, splits, encodes and writes a block at a
  time, memory bounded by ``buffer_mib``);
* textbook (``--textbook``, small sizes only: ~20k rows/s): ``pandas.read_csv``, then one
  ``tf.train.Example`` per row written with ``tf.io.TFRecordWriter``.

Prints wall time, rows/s, CPU time and peak RSS of each, and the ratios streaming / in-memory.
Checks on the smallest size that every output holds the same values.
Usage: ``.venv/bin/python bench/bench_prepare.py [--rows 1000000,8000000] [--encode-threads N] [--textbook]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import history
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The last commit whose prepare read the whole input into memory (the next, 12b701d, streams).
BASELINE = "8ad79968818170151b85c5ac89c687b077f0c247"


def generate_csv(path: Path, rows: int, columns: int, seed: int = 0) -> list[str]:
    """A CSV of ``rows`` rows, written a million rows at a time (the generator stays small)."""
    rng = np.random.default_rng(seed)
    names = [f"f{i:02d}" for i in range(columns)] + ["label"]
    with pacsv.CSVWriter(path, pa.schema([(n, pa.float64()) for n in names[:-1]] + [("label", pa.int64())])) as out:
        for start in range(0, rows, 1_000_000):
            n = min(1_000_000, rows - start)
            data = {name: np.round(rng.standard_normal(n), 6) for name in names[:-1]}
            data["label"] = rng.integers(0, 2, n)
            out.write_table(pa.table(data))
    return names


def textbook(csv_path: Path, out: Path, names: list[str]) -> int:
    import pandas as pd
    import tensorflow as tf

    frame = pd.read_csv(csv_path)
    count = 0
    with tf.io.TFRecordWriter(str(out)) as writer:
        for row in frame.itertuples(index=False):
            feature = {
                name: tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
                for name, value in zip(names[:-1], row[:-1])
            }
            feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(row[-1])]))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
            count += 1
    return count


def column_sums(files: list[str], columns: int, compression: str = "") -> dict[str, float]:
    """Sum of every column over all records, parsed by TensorFlow (to compare the outputs)."""
    import tensorflow as tf

    spec = {f"f{i:02d}": tf.io.FixedLenFeature([], tf.float32) for i in range(columns)}
    spec["label"] = tf.io.FixedLenFeature([], tf.int64)
    sums = dict.fromkeys(spec, 0.0)
    for batch in tf.data.TFRecordDataset(files, compression_type=compression).batch(8192):
        parsed = tf.io.parse_example(batch, spec)
        for name, values in parsed.items():
            sums[name] += float(np.sum(values.numpy().astype(np.float64)))
    return sums


def child(args: argparse.Namespace) -> int:
    """One contender in this (fresh) process; prints its JSON result."""
    csv_path, out = Path(args.csv), Path(args.out)
    if args.child == "textbook":
        import tensorflow  # noqa: F401  (imported before timing, like the others' imports)

        names = pacsv.open_csv(csv_path).schema.names
        start = time.perf_counter()
        rows = textbook(csv_path, out / "textbook.tfrecord", names)
        files = [str(out / "textbook.tfrecord")]
    else:
        # The in-memory child finds BASELINE's airflow_tf first on PYTHONPATH (run_child's env).
        from airflow_tf.data.prepare import prepare_dataset
        # The baseline predates buffer_mib and names its encoding threads "workers".
        options = ({"workers": args.encode_threads} if args.child == "in-memory"
                   else {"buffer_mib": args.buffer_mib, "encode_threads": args.encode_threads})
        start = time.perf_counter()
        summary = prepare_dataset(csv_path, out, args.child, label="label", version=1, overwrite=True, **options)
        rows = summary["rows"]
        uri = Path(summary["dataset_uri"])
        files = sorted(str(p) for p in uri.glob("*/part-*"))
    seconds = time.perf_counter() - start
    where = history.imported_from() if args.child != "textbook" else None
    print(json.dumps({"rows": rows, "seconds": seconds, "files": files, "airflow_tf": where}))
    return 0


def run_child(kind: str, csv_path: Path, out: Path, args: argparse.Namespace, tree: Path) -> dict:
    """Run one contender in a fresh process: its result, CPU seconds and peak RSS (MiB). The
    in-memory one imports airflow_tf from ``tree`` (BASELINE's worktree), the others from this one."""
    command = [sys.executable, __file__, "--child", kind, "--csv", str(csv_path), "--out", str(out),
               "--buffer-mib", str(args.buffer_mib)] + (["--encode-threads", str(args.encode_threads)] if args.encode_threads else [])
    source = tree if kind == "in-memory" else history.REPO
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=history.environment(source))
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise SystemExit(f"{kind} failed with exit code {process.returncode}")
    result = json.loads(output.strip().splitlines()[-1])
    if result["airflow_tf"] is not None:
        history.check_imported_from(source, result["airflow_tf"])
    result["cpu"] = usage.ru_utime + usage.ru_stime
    result["rss_mib"] = usage.ru_maxrss / 1024  # Linux: KiB
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1000000,8000000", help="comma-separated input sizes in rows")
    parser.add_argument("--columns", type=int, default=20, help="float columns (plus one label)")
    parser.add_argument("--encode-threads", type=int, default=None, help="encoding threads (default: one per core)")
    parser.add_argument("--buffer-mib", type=float, default=512.0, help="the streaming path's memory setting")
    parser.add_argument("--textbook", action="store_true",
                        help="add the textbook conversion (for sizes up to 1M rows: it runs ~20k rows/s)")
    parser.add_argument("--workdir", help="keep the files here (default: a temporary directory)")
    parser.add_argument("--child", choices=["in-memory", "streaming", "textbook"], help=argparse.SUPPRESS)
    parser.add_argument("--csv", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    sizes = [int(s.replace("_", "")) for s in args.rows.split(",") if s.strip()]
    ok = True
    with tempfile.TemporaryDirectory() as tmp, history.checkout(BASELINE) as tree:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        print(f"{os.cpu_count()} cores, streaming buffer_mib={args.buffer_mib:g}, encode_threads={args.encode_threads or 'one per core'}; "
              f"in-memory: commit {BASELINE[:7]} (a temporary worktree, {tree})")
        print(f"{'rows':>10s} {'contender':10s} {'wall s':>8s} {'rows/s':>11s} {'CPU s':>7s} {'peak RSS MiB':>13s}")
        for n, rows in enumerate(sizes):
            csv_path = work / f"bench-{rows}.csv"
            generate_csv(csv_path, rows, args.columns)
            size_mb = csv_path.stat().st_size / 1e6
            kinds = ["in-memory", "streaming"] + (["textbook"] if args.textbook and rows <= 1_000_000 else [])
            results = {}
            for kind in kinds:
                results[kind] = run_child(kind, csv_path, work / "out", args, tree)
                r = results[kind]
                print(f"{rows:>10,d} {kind:10s} {r['seconds']:8.2f} {rows / r['seconds']:11,.0f} {r['cpu']:7.2f} "
                      f"{r['rss_mib']:13,.0f}", flush=True)
            base, ours = results["in-memory"], results["streaming"]
            print(f"{'':>10s} input {size_mb:,.0f} MB; streaming / in-memory: {base['seconds'] / ours['seconds']:.2f}x "
                  f"rows/s (goal >= 0.9x), peak RSS {ours['rss_mib']:,.0f} vs {base['rss_mib']:,.0f} MiB "
                  f"(goal <= 1024 MiB)" + (f"; textbook / streaming: {results['textbook']['seconds'] / ours['seconds']:.1f}x"
                                           if "textbook" in results else ""), flush=True)
            if n == 0:
                sums = {kind: column_sums(r["files"], args.columns) for kind, r in results.items()}
                first = sums["in-memory"]
                same = all(np.isclose(first[k], s[k], rtol=1e-6, atol=1e-3) for s in sums.values() for k in first)
                counts = {kind: r["rows"] for kind, r in results.items()}
                print(f"{'':>10s} outputs hold the same values: {'yes' if same else 'NO'} ({counts})")
                ok = ok and same and len(set(counts.values())) == 1
            for r in results.values():
                for f in r["files"]:
                    Path(f).unlink(missing_ok=True)
            csv_path.unlink()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
