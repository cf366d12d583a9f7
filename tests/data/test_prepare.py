"""Preparing datasets from CSV, Parquet and .npz, and reading them back with make_dataset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_tf.data import (
    DatasetNotReadyError, count_examples, load_schema, make_dataset, parse_spec, prepare_dataset,
)
from airflow_tf.data.samples import write_linear_regression_csv


def _csv(path: Path, ids: range, with_text: bool = False) -> Path:
    lines = ["id,a,b,label" + (",note" if with_text else "")]
    for i in ids:
        lines.append(f"{i},{i * 0.5},{-i},{i % 3}" + (f",\"n{i}, ü\"" if with_text else ""))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_csv_glob_becomes_a_committed_dataset_with_every_row_exactly_once(tmp_path, read_split):
    _csv(tmp_path / "part1.csv", range(0, 500), with_text=True)
    _csv(tmp_path / "part2.csv", range(500, 1000), with_text=True)
    summary = prepare_dataset(str(tmp_path / "part*.csv"), tmp_path / "out", "toy", label="label", shards=3)
    uri = Path(summary["dataset_uri"])
    assert uri == (tmp_path / "out" / "toy" / "1").resolve()
    counts = summary["counts"]
    assert counts["train"] + counts["eval"] == 1000 and 160 <= counts["eval"] <= 240
    assert sorted(p.name for p in (uri / "train").iterdir()) == [f"part-0000{i}-of-00003.tfrecord" for i in range(3)]
    assert [p.name for p in (uri / "eval").iterdir()] == ["part-00000-of-00001.tfrecord"]

    schema = load_schema(uri)
    assert [(f.name, f.dtype, f.shape) for f in schema.features] == [
        ("id", "int64", ()), ("a", "float32", ()), ("b", "int64", ()), ("label", "int64", ()), ("note", "string", ())]
    assert schema.label.name == "label" and schema.feature_names == ["id", "a", "b", "note"]
    assert json.loads((uri / "schema.json").read_text()) == summary["schema"]
    manifest = json.loads((uri / "_SUCCESS").read_text())
    assert sum(s["examples"] for s in manifest["splits"]["train"]["shards"]) == counts["train"]
    assert all(s["bytes"] == (uri / "train" / s["file"]).stat().st_size for s in manifest["splits"]["train"]["shards"])
    assert count_examples(f"file://{uri}", "eval") == counts["eval"]

    rows = {split: read_split(str(uri), split) for split in ("train", "eval")}
    ids = np.concatenate([rows["train"]["id"], rows["eval"]["id"]])
    assert sorted(ids.tolist()) == list(range(1000))
    for split in rows.values():
        np.testing.assert_array_equal(split["a"], (split["id"] * 0.5).astype(np.float32))
        np.testing.assert_array_equal(split["b"], -split["id"])
        assert [n.decode() for n in split["note"]] == [f"n{i}, ü" for i in split["id"]]


def test_parquet_and_npz_vectors_strings_and_declared_schema(tmp_path, read_split):
    n = 40
    vectors = np.arange(n * 3, dtype=np.float32).reshape(n, 3) / 7
    table = pa.table({
        "v": pa.array(list(vectors), type=pa.list_(pa.float32(), 3)),
        "word": [f"w{i}" for i in range(n)],
        "y": np.arange(n, dtype=np.int32),
    })
    pq.write_table(table, tmp_path / "in.parquet")
    summary = prepare_dataset(tmp_path / "in.parquet", tmp_path / "out", "pq", label="y", eval_fraction=0)
    rows = read_split(summary["dataset_uri"])
    assert summary["counts"] == {"train": n} and rows["v"].shape == (n, 3)
    order = np.argsort(rows["y"])
    np.testing.assert_array_equal(rows["v"][order], vectors)
    assert [w.decode() for w in rows["word"][order]] == [f"w{i}" for i in range(n)]

    images = np.random.default_rng(0).random((n, 2, 2)).astype(np.float64)
    np.savez(tmp_path / "in.npz", image=images, digit=np.arange(n) % 10, name=np.array([f"名{i}" for i in range(n)]))
    declared = {"features": [{"name": "image", "dtype": "float32", "shape": [2, 2]},
                             {"name": "digit", "dtype": "int64", "shape": []},
                             {"name": "name", "dtype": "string", "shape": []}], "label": "digit"}
    summary = prepare_dataset(tmp_path / "in.npz", tmp_path / "out", "npz", schema=declared, eval_fraction=0.25)
    assert summary["schema"]["label"] == "digit" and sum(summary["counts"].values()) == n
    rows = read_split(summary["dataset_uri"], "eval")
    index = np.array([int(s.decode()[1:]) for s in rows["name"]])
    np.testing.assert_array_equal(rows["image"], images[index].astype(np.float32))
    np.testing.assert_array_equal(rows["digit"], index % 10)


def test_split_is_deterministic_and_a_split_key_keeps_each_key_in_one_split(tmp_path, read_split):
    src = _csv(tmp_path / "in.csv", range(500))

    def eval_ids(name, **kwargs):
        summary = prepare_dataset(src, tmp_path / "out", name, label="label", **kwargs)
        return set(read_split(summary["dataset_uri"], "eval")["id"].tolist())

    first, again, other = eval_ids("s1", seed=3), eval_ids("s2", seed=3), eval_ids("s3", seed=4)
    assert first == again and 70 < len(first) < 130  # each row by its own hash: about 20%
    assert first != other
    # A row's split does not depend on how the input is read: a tiny read buffer agrees.
    assert eval_ids("s4", seed=3, buffer_mib=1) == first
    # Nor on where the file lives: the same file moved to another directory splits the same.
    moved = tmp_path / "elsewhere" / "in.csv"
    moved.parent.mkdir()
    moved.write_bytes(src.read_bytes())
    summary = prepare_dataset(moved, tmp_path / "out", "s5", label="label", seed=3)
    assert set(read_split(summary["dataset_uri"], "eval")["id"].tolist()) == first

    # Keyed by "b" (= -id): growing the input must not move any existing key to the other split.
    keyed = eval_ids("k1", split_key="b", eval_fraction=0.3)
    _csv(tmp_path / "in.csv", range(900))
    grown = eval_ids("k2", split_key="b", eval_fraction=0.3)
    assert keyed and keyed == {i for i in grown if i < 500}
    assert 0.2 < len(grown) / 900 < 0.4


def test_shard_size_compression_versions_and_overwrite(tmp_path, read_split):
    src = write_linear_regression_csv(tmp_path / "lr.csv", rows=3000, seed=2)
    small = prepare_dataset(src, tmp_path / "out", "lr", label="y", target_shard_mib=0.02, compression="gzip")
    train_files = sorted((Path(small["dataset_uri"]) / "train").iterdir())
    # 2400 train records of 48 bytes ~ 115 kB -> 6 files of at most ~20 kB uncompressed.
    assert small["version"] == "1" and len(train_files) == 6
    assert all(p.name.endswith(".tfrecord.gz") for p in train_files)
    assert len(read_split(small["dataset_uri"])["x"]) == small["counts"]["train"] > 2300

    second = prepare_dataset(src, tmp_path / "out", "lr", label="y", shards=2)
    assert second["version"] == "2" and second["shards"] == {"train": 2, "eval": 1}
    replaced = prepare_dataset(src, tmp_path / "out", "lr", version=1, label="y", eval_fraction=0.5, overwrite=True)
    assert replaced["dataset_uri"] == small["dataset_uri"]
    assert 1400 < count_examples(small["dataset_uri"], "eval") == replaced["counts"]["eval"] < 1600
    assert sorted(p.name for p in (tmp_path / "out" / "lr").iterdir()) == ["1", "2"]


def test_zlib_shards_are_single_streams_that_hold_every_record(tmp_path, read_split):
    import zlib

    src = write_linear_regression_csv(tmp_path / "lr.csv", rows=30000, seed=3)
    # A small buffer: many groups, each compressed on its own thread, per file.
    done = prepare_dataset(src, tmp_path / "out", "z", label="y", shards=2, compression="zlib", buffer_mib=2)
    plain = prepare_dataset(src, tmp_path / "out", "p", label="y", shards=2, buffer_mib=2)
    for split in ("train", "eval"):
        files = sorted((Path(done["dataset_uri"]) / split).iterdir())
        assert files and all(p.name.endswith(".tfrecord.zlib") for p in files)
        # One zlib stream per file (checksum included) holding the same bytes as the plain files.
        unpacked = [zlib.decompress(p.read_bytes()) for p in files]
        assert unpacked == [p.read_bytes() for p in sorted((Path(plain["dataset_uri"]) / split).iterdir())]
        read = read_split(done["dataset_uri"], split)["x"]
        assert sorted(read.tolist()) == sorted(read_split(plain["dataset_uri"], split)["x"].tolist())
        assert len(read) == done["counts"][split]


def test_workers_get_disjoint_complete_shares_by_file_or_by_record(tmp_path, read_split):
    src = _csv(tmp_path / "in.csv", range(480))
    for shards, workers in ((4, 2), (1, 3)):  # by file, then by record
        uri = prepare_dataset(src, tmp_path / "out", f"w{shards}", label="label", eval_fraction=0,
                              shards=shards)["dataset_uri"]
        shares = [set(read_split(uri, num_shards=workers, shard_index=i)["id"].tolist()) for i in range(workers)]
        assert sum(len(s) for s in shares) == 480 and set().union(*shares) == set(range(480))


def test_make_dataset_batches_shapes_epochs_and_unlabelled_data(tmp_path):
    np.savez(tmp_path / "in.npz", x=np.zeros((50, 4), np.float32), y=np.ones(50, np.int64))
    uri = prepare_dataset(tmp_path / "in.npz", tmp_path / "out", "b", label="y", eval_fraction=0)["dataset_uri"]
    features, label = next(iter(make_dataset(uri, batch_size=8)))
    assert list(features) == ["x"] and features["x"].shape == (8, 4) and label.shape == (8,)
    batches = list(make_dataset(uri, batch_size=8, epochs=2, drop_remainder=True, seed=1))
    assert len(batches) == 12  # 100 examples, 4 dropped
    assert sorted(parse_spec(load_schema(uri))) == ["x", "y"]

    unlabelled = prepare_dataset(tmp_path / "in.npz", tmp_path / "out", "u", eval_fraction=0)["dataset_uri"]
    batch = next(iter(make_dataset(unlabelled, batch_size=50, epochs=1)))
    assert isinstance(batch, dict) and sorted(batch) == ["x", "y"]


def test_reader_refuses_an_unfinished_dataset_without_importing_tensorflow(tmp_path):
    summary = prepare_dataset(_csv(tmp_path / "in.csv", range(20)), tmp_path / "out", "r", label="label")
    uri = summary["dataset_uri"]
    code = (
        "import sys, airflow_tf.data as d\n"
        f"print(d.load_schema({uri!r}).label_name, d.count_examples({uri!r}, 'train'))\n"
        "print('tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["label", str(summary["counts"]["train"]), "False"]

    (Path(uri) / "_SUCCESS").unlink()
    for call in (lambda: load_schema(uri), lambda: count_examples(uri), lambda: make_dataset(uri)):
        with pytest.raises(DatasetNotReadyError, match=f"{uri} has no _SUCCESS"):
            call()
    with pytest.raises(DatasetNotReadyError, match="does not exist"):
        load_schema(tmp_path / "nowhere")


def test_progress_is_reported_with_rows_and_rate(tmp_path):
    src = write_linear_regression_csv(tmp_path / "lr.csv", rows=20000)
    seen = []
    prepare_dataset(src, tmp_path / "out", "p", label="y", shards=4, progress=seen.append, progress_every=0)
    writes = [p for p in seen if p.stage == "write"]
    assert len(writes) >= 4 and writes[-1].done == 20000 and writes[-1].percent == 100.0
    assert [p.done for p in writes] == sorted(p.done for p in writes) and writes[-1].rows_per_sec > 0
    assert "20000/20000 rows (100.0%)" in writes[-1].describe()

    quiet = []
    prepare_dataset(src, tmp_path / "out", "q", label="y", progress=quiet.append, progress_every=3600)
    assert [p.stage for p in quiet] == ["read", "write"]  # only the end of each stage


def test_sample_is_the_seed_articles_line():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = write_linear_regression_csv(Path(tmp) / "lr.csv", rows=2000, seed=5)
        data = np.loadtxt(path, delimiter=",", skiprows=1)
        assert path.read_text().startswith("x,y\n") and data.shape == (2000, 2)
        slope, intercept = np.polyfit(data[:, 0], data[:, 1], 1)
        assert abs(slope - 2) < 0.1 and abs(intercept - 10) < 0.05
        assert path.read_bytes() == write_linear_regression_csv(Path(tmp) / "again.csv", rows=2000, seed=5).read_bytes()


def test_cli_prints_a_json_summary_and_fails_clearly(tmp_path):
    src = _csv(tmp_path / "in.csv", range(300))
    cli = [sys.executable, "-m", "airflow_tf.cli", "prepare", "--output", str(tmp_path / "out"), "--name", "c"]
    done = subprocess.run(cli + ["--input", str(src), "--label", "label", "--shards", "2", "--compression", "gzip"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert sum(summary["counts"].values()) == 300 and summary["compression"] == "gzip"
    assert Path(summary["dataset_uri"], "_SUCCESS").is_file() and "rows/s" in done.stderr

    failed = subprocess.run(cli + ["--input", str(src), "--label", "nope"], capture_output=True, text=True)
    assert failed.returncode != 0 and failed.stdout == ""
    assert "label column 'nope' is not in the input" in failed.stderr


def test_csv_column_that_turns_float_after_the_first_block_is_read_as_float(tmp_path, read_split):
    # pyarrow guesses types from the first block (1 MB); a float far below must still be read.
    rows = ["n,y"] + [f"{i},{i % 2}" for i in range(200_000)] + ["2.5,1"]
    (tmp_path / "late.csv").write_text("\n".join(rows) + "\n")
    summary = prepare_dataset(tmp_path / "late.csv", tmp_path / "out", "late", label="y", eval_fraction=0)
    assert summary["schema"]["features"][0] == {"name": "n", "dtype": "float32", "shape": [], "allow_nan": False}
    values = read_split(summary["dataset_uri"])["n"]
    assert len(values) == 200_001 and 2.5 in values and values.max() == 199_999


def test_temporary_directory_of_a_killed_run_is_cleaned_up_later(tmp_path):
    src = _csv(tmp_path / "in.csv", range(10))
    root = tmp_path / "out" / "k"
    old, recent = root / ".tmp-1-0123456789ab", root / ".tmp-1-ba9876543210"
    for path in (old, recent):
        (path / "train").mkdir(parents=True)
    os.utime(old, (time.time() - 2 * 86400,) * 2)
    # No eval split: with 10 rows, whether one hashes into eval depends on the file's path.
    summary = prepare_dataset(src, tmp_path / "out", "k", label="label", eval_fraction=0)
    assert summary["version"] == "1" and not old.exists() and recent.exists()


def test_cache_reuses_the_version_of_an_unchanged_input_and_encodes_nothing(tmp_path, monkeypatch, caplog):
    from airflow_tf.data import stream as stream_module

    src = _csv(tmp_path / "in.csv", range(400))
    first = prepare_dataset(src, tmp_path / "out", "c", label="label", cache=True)
    assert first["cached"] is False and first["version"] == "1" and first["fingerprint"]

    def no_encoding(*args, **kwargs):
        raise AssertionError("a cache hit encoded rows")

    monkeypatch.setattr(stream_module, "_encode_group", no_encoding)
    with caplog.at_level("INFO", logger="airflow_tf.data.prepare"):
        again = prepare_dataset(src, tmp_path / "out", "c", label="label", cache=True)
    assert again["cached"] is True and again["dataset_uri"] == first["dataset_uri"]
    assert again["counts"] == first["counts"] and again["schema"] == first["schema"]
    assert f"reusing version 1, nothing encoded" in caplog.text
    assert sorted(p.name for p in (tmp_path / "out" / "c").iterdir()) == ["1"]

    # Another option or other content is another dataset: encoded as the next version.
    monkeypatch.undo()
    assert prepare_dataset(src, tmp_path / "out", "c", label="label", cache=True, seed=1)["version"] == "2"
    src.write_text(src.read_text().replace("\n5,", "\n-5,", 1))
    changed = prepare_dataset(src, tmp_path / "out", "c", label="label", cache=True)
    assert changed["cached"] is False and changed["version"] == "3"


def test_encoding_threads_default_to_the_cores_the_process_may_use(tmp_path):
    from airflow_tf.data.cpus import usable_cpus

    cpu_max = tmp_path / "cpu.max"
    cores = len(os.sched_getaffinity(0))
    cpu_max.write_text("50000 100000\n")  # a pod limited to half a core: one thread, never zero
    assert usable_cpus(cpu_max) == 1
    cpu_max.write_text("max 100000\n")  # no quota: the affinity
    assert usable_cpus(cpu_max) == cores
    for garbage in ("not a quota\n", "100000 0\n", "\n"):
        cpu_max.write_text(garbage)
        assert usable_cpus(cpu_max) == cores, garbage
    assert usable_cpus(tmp_path / "missing") == cores
    # A process bound to one core (taskset, a static CPU manager) encodes on one thread.
    bound = subprocess.run(
        [sys.executable, "-c", "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
         "from airflow_tf.data.cpus import usable_cpus; print(usable_cpus())"],
        capture_output=True, text=True, check=True)
    assert bound.stdout.strip() == "1"
