"""CSV -> TFRecord conversion: the textbook way against airflow-tf's converter, same run.

Generates a numeric CSV (default 200,000 rows x 20 float columns + an integer label), then
converts it:

* textbook: ``pandas.read_csv``, then one ``tf.train.Example`` per row written with
  ``tf.io.TFRecordWriter`` (one file, no split);
* airflow-tf: ``prepare_dataset`` (pyarrow CSV reader, train/eval split, shuffle, vectorised
  Example encoding, TFRecord framing and CRC32C in NumPy, encoding threads, atomic commit);
* for the record, airflow-tf's encoder with the framing left to ``tf.io.TFRecordWriter``
  (one ``write`` call per record) instead of the NumPy framing.

Prints rows/s of each and the ratio to the textbook way; checks that both outputs hold the
same values. Usage: ``.venv/bin/python bench/bench_prepare.py [--rows N] [--workers N]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def generate_csv(path: Path, rows: int, columns: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    data = {f"f{i:02d}": np.round(rng.standard_normal(rows), 6) for i in range(columns)}
    data["label"] = rng.integers(0, 2, rows)
    pacsv.write_csv(pa.table(data), path)
    return list(data)


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


def encoder_with_tf_framing(csv_path: Path, out: Path) -> int:
    """Our reader and Example encoder, TFRecordWriter's framing (one Python call per record)."""
    import tensorflow as tf

    from airflow_tf.data.encode import _fixed_records, _merge_runs, example_pieces
    from airflow_tf.data.inputs import read_table

    table = read_table(csv_path)
    features = table.schema.features
    n, chunk = table.num_rows, 16384
    with tf.io.TFRecordWriter(str(out)) as writer:
        for start in range(0, n, chunk):
            columns = [table.columns[f.name][start:start + chunk] for f in features]
            rows = _fixed_records(_merge_runs(example_pieces(features, columns)), len(columns[0]))[0][:, 12:-4]
            for record in rows:
                writer.write(record.tobytes())
    return n


def column_sums(files: list[str], compression: str = "") -> dict[str, float]:
    """Sum of every column over all records, parsed by TensorFlow (to compare the outputs)."""
    import tensorflow as tf

    spec = {f"f{i:02d}": tf.io.FixedLenFeature([], tf.float32) for i in range(20)}
    spec["label"] = tf.io.FixedLenFeature([], tf.int64)
    sums = dict.fromkeys(spec, 0.0)
    for batch in tf.data.TFRecordDataset(files, compression_type=compression).batch(8192):
        parsed = tf.io.parse_example(batch, spec)
        for name, values in parsed.items():
            sums[name] += float(np.sum(values.numpy().astype(np.float64)))
    return sums


def timed(repeat: int, function, *args, **kwargs):
    """(result, wall s, CPU s) of the fastest of ``repeat`` calls (CPU: all threads of this process)."""
    best = None
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        result = function(*args, **kwargs)
        run = (result, time.perf_counter() - start, time.process_time() - cpu)
        best = run if best is None or run[1] < best[1] else best
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--columns", type=int, default=20, help="float columns (plus one label)")
    parser.add_argument("--workers", type=int, default=None, help="encoding threads (default: one per core)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of the short contenders; the fastest counts (the textbook way runs once: "
                        "it takes long enough to average out other load)")
    parser.add_argument("--workdir", help="keep the files here (default: a temporary directory)")
    args = parser.parse_args()

    import tensorflow as tf  # imported before timing: both contenders then start warm

    from airflow_tf.data import prepare_dataset, split_files

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        csv_path = work / "bench.csv"
        names = generate_csv(csv_path, args.rows, args.columns)
        print(f"input: {csv_path} ({args.rows} rows x {args.columns} float columns + label, "
              f"{csv_path.stat().st_size / 1e6:.1f} MB), {os.cpu_count()} cores, TensorFlow {tf.__version__}")

        count, base_s, base_cpu = timed(1, textbook, csv_path, work / "textbook.tfrecord", names)
        summary, ours_s, ours_cpu = timed(args.repeat, prepare_dataset, csv_path, work / "datasets", "bench",
                                          label="label", overwrite=True, version=1, workers=args.workers)
        _, framing_s, framing_cpu = timed(args.repeat, encoder_with_tf_framing, csv_path, work / "tf-framing.tfrecord")

        print(f"{'':54s} {'wall s':>8s} {'rows/s':>12s} {'CPU s':>7s}")
        for label, seconds, cpu in (
            ("textbook (tf.train.Example per row + TFRecordWriter)", base_s, base_cpu),
            ("airflow-tf prepare_dataset (split, shuffle, commit)", ours_s, ours_cpu),
            ("  variant: our encoder + TFRecordWriter framing", framing_s, framing_cpu),
        ):
            print(f"{label:54s} {seconds:8.2f} {args.rows / seconds:12,.0f} {cpu:7.2f}")
        print(f"ratio airflow-tf / textbook: {base_s / ours_s:.1f}x rows/s (goal >= 20x), "
              f"{base_cpu / ours_cpu:.1f}x less CPU time")

        uri = summary["dataset_uri"]
        ours_files = split_files(uri, "train") + split_files(uri, "eval")
        expected, got = column_sums([str(work / "textbook.tfrecord")]), column_sums(ours_files)
        same = all(np.isclose(expected[k], got[k], rtol=1e-6, atol=1e-3) for k in expected)
        print(f"outputs hold the same values: {'yes' if same else 'NO'} "
              f"({count} and {sum(summary['counts'].values())} records)")
        return 0 if same and count == sum(summary["counts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
