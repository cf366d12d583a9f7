"""The file helper every room uses: a write that fails leaves the previous file whole and no
temporary behind; paths come from ``file://`` URIs; other schemes and bad JSON are refused by name."""

from __future__ import annotations

import os

import pytest

from airflow_tf.files import (atomic_open, atomic_write_bytes, local_path, read_json, strip_file_scheme,
                              write_json)


def test_a_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "deep" / "metrics.json"  # missing parents are created
    write_json(target, {"loss": 0.5})
    write_json(target, {"loss": 0.25, "name": "épreuve"}, fsync=False)
    assert read_json(target) == {"loss": 0.25, "name": "épreuve"}
    assert os.listdir(target.parent) == ["metrics.json"]


def test_a_write_that_fails_midway_keeps_the_previous_file_whole(tmp_path):
    target = atomic_write_bytes(tmp_path / "model.bin", b"old content")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_open(target, "wb") as handle:
            handle.write(b"half of the new")
            raise RuntimeError("disk full")
    assert target.read_bytes() == b"old content"
    assert os.listdir(tmp_path) == ["model.bin"]


def test_json_that_cannot_be_encoded_is_refused_before_anything_is_written(tmp_path):
    target = tmp_path / "state.json"
    write_json(target, {"ok": True})
    with pytest.raises(TypeError):
        write_json(target, {"when": object()})
    assert read_json(target) == {"ok": True} and os.listdir(tmp_path) == ["state.json"]


def test_file_uris_become_local_paths_and_other_schemes_are_refused_by_name(tmp_path):
    assert strip_file_scheme(f"file://{tmp_path}") == str(tmp_path)
    assert strip_file_scheme("gs://bucket/data") == "gs://bucket/data"
    assert local_path(f"file://{tmp_path}/runs") == tmp_path / "runs"
    assert local_path("relative/dir") == local_path("relative/dir", "run_dir")
    with pytest.raises(ValueError, match=r"serving_base 'gs://bucket/models': only local paths and file:// URIs"):
        local_path("gs://bucket/models", "serving_base")


def test_reading_bad_or_missing_json_names_the_file(tmp_path):
    broken = tmp_path / "progress.json"
    broken.write_text('{"global_step": 12')
    with pytest.raises(ValueError, match=rf"{broken}: not valid JSON .*delete or regenerate the file"):
        read_json(broken)
    assert read_json(tmp_path / "absent.json", missing_ok=True) is None
    with pytest.raises(FileNotFoundError, match="absent.json"):
        read_json(tmp_path / "absent.json")
