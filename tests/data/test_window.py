"""Partition versions and windows: a window version lists the shards of the last N
partitions (nothing copied) and a reader of it reads exactly those partitions' rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_tf.data import DataError, count_examples, prepare_dataset
from airflow_tf.data.window import make_window


def _day(tmp_path: Path, day: int, rows: int = 600) -> Path:
    path = tmp_path / "raw" / f"day-{day}.csv"
    path.parent.mkdir(exist_ok=True)
    ids = range(day * 10_000, day * 10_000 + rows)
    path.write_text("id,x,y\n" + "".join(f"{i},{i / 4},{i % 2}\n" for i in ids))
    return path


def test_a_window_version_reads_exactly_its_partitions_without_copying(tmp_path, read_split):
    out = tmp_path / "out"
    for day in (1, 2, 3):
        summary = prepare_dataset(_day(tmp_path, day), out, "clicks", label="y", compression="gzip",
                                  partition_key=f"2026-11-0{day}")
        assert summary["version"] == f"2026-11-0{day}" and summary["partition"] == f"2026-11-0{day}"
    window = make_window(out, "clicks", last=2)
    assert window["partitions"] == ["2026-11-02", "2026-11-03"]
    uri = Path(window["dataset_uri"])
    assert uri.name == "window-2026-11-02--2026-11-03"
    assert sorted(p.name for p in uri.iterdir()) == ["_SUCCESS", "schema.json"]  # no shard copied

    ids = set()
    for split in ("train", "eval"):
        rows = read_split(str(uri), split)
        assert len(rows["id"]) == count_examples(uri, split) == window["counts"][split]
        ids |= set(rows["id"].tolist())
    assert ids == set(range(20_000, 20_600)) | set(range(30_000, 30_600))
    assert json.loads((uri / "_SUCCESS").read_text())["window"] == [
        {"partition": "2026-11-02", "version": "2026-11-02"}, {"partition": "2026-11-03", "version": "2026-11-03"}]

    # A new day moves the window on; an explicit list picks partitions by key.
    prepare_dataset(_day(tmp_path, 4), out, "clicks", label="y", compression="gzip", partition_key="2026-11-04")
    moved = make_window(out, "clicks", last=2)
    assert moved["partitions"] == ["2026-11-03", "2026-11-04"]
    picked = make_window(out, "clicks", partitions=["2026-11-01"], version="first-day")
    assert set(read_split(picked["dataset_uri"], "train")["id"].tolist()) <= set(range(10_000, 10_600))


def test_a_window_refuses_missing_or_mismatched_partitions(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(DataError, match="has no partition versions"):
        make_window(out, "clicks", last=2)
    prepare_dataset(_day(tmp_path, 1), out, "clicks", label="y", partition_key="d1")
    prepare_dataset(_day(tmp_path, 2), out, "clicks", label="y", partition_key="d2", compression="gzip")
    with pytest.raises(DataError, match=r"partitions \['d9'\] of dataset .* are not prepared \(prepared: d1, d2\)"):
        make_window(out, "clicks", partitions=["d9"])
    with pytest.raises(DataError, match="partition 'd2' is compressed differently from partition 'd1'"):
        make_window(out, "clicks", last=2)
    with pytest.raises(DataError, match="give last"):
        make_window(out, "clicks", last=0)
