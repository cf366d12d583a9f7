"""Reading a split as batches of parsed examples: airflow-tf's reader against the textbook
per-record ``tf.io.parse_single_example`` map, same run, same files.

Prepares a dataset (default 200,000 rows x 20 float features + label, 4 train files), then
reads the train split once with each pipeline, as batches of 256:

* textbook: ``TFRecordDataset(files).map(parse_single_example).batch(256)``;
* textbook with ``num_parallel_calls=AUTOTUNE`` on the map (a common improvement);
* airflow-tf: ``make_dataset(..., shuffle=False)`` (parallel interleave over the files,
  batch first, one ``parse_example`` per batch, prefetch), and with ``shuffle=True``, the
  training default.

Prints examples/s of each and the ratio to the textbook pipeline (best of ``--repeat`` passes).
Usage: ``.venv/bin/python bench/bench_read.py [--rows N] [--batch-size B]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build_dataset(work: Path, rows: int, columns: int) -> str:
    from airflow_tf.data import prepare_dataset

    rng = np.random.default_rng(0)
    arrays = {f"f{i:02d}": rng.standard_normal(rows).astype(np.float32) for i in range(columns)}
    arrays["label"] = rng.integers(0, 2, rows)
    np.savez(work / "bench.npz", **arrays)
    return prepare_dataset(work / "bench.npz", work / "datasets", "read", label="label", shards=4,
                           overwrite=True, version=1)["dataset_uri"]


def textbook(files: list[str], spec: dict, batch_size: int, parallel: bool):
    import tensorflow as tf

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        label = example.pop("label")
        return example, label

    calls = tf.data.AUTOTUNE if parallel else None
    return tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=calls).batch(batch_size)


def drain(dataset) -> tuple[int, float, float]:
    """Examples read, wall seconds and CPU seconds (all threads of this process) of one pass."""
    start, cpu, count = time.perf_counter(), time.process_time(), 0
    for _, label in dataset:
        count += int(label.shape[0])
    return count, time.perf_counter() - start, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--columns", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=2, help="passes per pipeline; the best counts")
    args = parser.parse_args()

    import tensorflow as tf

    from airflow_tf.data import count_examples, load_schema, make_dataset, parse_spec, split_files

    with tempfile.TemporaryDirectory() as tmp:
        uri = build_dataset(Path(tmp), args.rows, args.columns)
        files, spec = split_files(uri, "train"), parse_spec(load_schema(uri))
        expected = count_examples(uri, "train")
        print(f"dataset: {uri} ({expected} train examples in {len(files)} files, {args.columns} float "
              f"features + label), batch {args.batch_size}, {os.cpu_count()} cores, TensorFlow {tf.__version__}")
        pipelines = {
            "textbook: map(parse_single_example).batch": lambda: textbook(files, spec, args.batch_size, False),
            "textbook, map with AUTOTUNE parallel calls": lambda: textbook(files, spec, args.batch_size, True),
            "airflow-tf make_dataset, shuffle=False": lambda: make_dataset(
                uri, batch_size=args.batch_size, epochs=1, shuffle=False),
            "airflow-tf make_dataset, shuffle=True": lambda: make_dataset(
                uri, batch_size=args.batch_size, epochs=1, shuffle=True),
        }
        best: dict[str, tuple[float, float]] = {}  # name -> (wall s, CPU s) of the fastest pass
        for _ in range(args.repeat):
            for name, build in pipelines.items():
                count, seconds, cpu = drain(build())
                if count != expected:
                    print(f"{name}: read {count} examples, expected {expected}")
                    return 1
                if name not in best or seconds < best[name][0]:
                    best[name] = (seconds, cpu)
        textbook_name, ours_name = "textbook: map(parse_single_example).batch", "airflow-tf make_dataset, shuffle=False"
        base_wall, base_cpu = best[textbook_name]
        print(f"{'pipeline (best of ' + str(args.repeat) + ' passes)':45s} {'examples/s':>12s} {'ratio':>7s} {'CPU s':>7s}")
        for name, (seconds, cpu) in best.items():
            print(f"{name:45s} {expected / seconds:12,.0f} {base_wall / seconds:6.1f}x {cpu:7.2f}")
        wall, cpu = best[ours_name]
        print(f"ratio airflow-tf / textbook: {base_wall / wall:.1f}x examples/s (goal >= 10x), "
              f"{base_cpu / cpu:.1f}x less CPU time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
