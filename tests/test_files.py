"""The file helper every room uses: a write that fails leaves the previous file whole and no
temporary behind; paths come from ``file://`` URIs; other schemes and bad JSON are refused by name;
a file opened below a directory is the file checked (no link, ``..``, hard link or FIFO on the way)."""

from __future__ import annotations

import os

import pytest

from airflow_tf.files import (UnsafePathError, atomic_open, atomic_write_bytes, local_path, open_beneath,
                              plain_absolute_path, read_beneath, read_json, strip_file_scheme, write_json,
                              write_json_at)


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


# -- open_beneath: the file opened is the file checked ---------------------------------------

def test_open_beneath_reads_a_runs_own_file_and_refuses_links_dots_hard_links_and_fifos(tmp_path):
    runs = tmp_path / "runs"
    (runs / "tf-a" / "eval").mkdir(parents=True)
    (runs / "tf-b").mkdir()
    (runs / "tf-a" / "eval" / "progress.json").write_text("mine")
    (runs / "tf-b" / "secret").write_text("theirs")
    assert read_beneath(str(runs), "tf-a/eval/progress.json") == b"mine"
    assert read_beneath(str(runs), "tf-a//eval/progress.json") == b"mine"  # '//' reads as '/'
    (runs / "tf-a" / "link").symlink_to(runs / "tf-b" / "secret")  # a link as the file
    (runs / "tf-a" / "dir-link").symlink_to(runs / "tf-b")  # a link on the way
    (runs / "tf-a" / "inner-link").symlink_to(runs / "tf-a" / "eval" / "progress.json")  # even inside the run
    os.link(runs / "tf-b" / "secret", runs / "tf-a" / "hard")
    os.mkfifo(runs / "tf-a" / "fifo")
    refused = {
        "tf-a/link": "is a symbolic link",
        "tf-a/dir-link/secret": f"{runs}/tf-a/dir-link is a symbolic link or not a directory",
        "tf-a/inner-link": "is a symbolic link",
        "tf-a/hard": "has 2 hard links",
        "tf-a/fifo": "is not a regular file",  # and the open does not wait for a writer
        "tf-a/../tf-b/secret": r"'\.' and '\.\.' are not followed",
        "tf-a/eval": "is not a regular file",
    }
    for relative, why in refused.items():
        with pytest.raises(UnsafePathError, match=why):
            read_beneath(str(runs), relative)
    with pytest.raises(FileNotFoundError):
        read_beneath(str(runs), "tf-a/missing.json")
    # A directory opened no-follow, and a file below that descriptor.
    fd = open_beneath(str(runs), "tf-a/eval", directory=True)
    try:
        assert read_beneath(fd, "progress.json") == b"mine"
    finally:
        os.close(fd)
    with pytest.raises(UnsafePathError):
        open_beneath(str(runs), "tf-a/dir-link", directory=True)


def test_a_file_swapped_for_a_link_after_it_was_opened_is_still_the_file_opened(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "other").write_text("theirs")
    (tmp_path / "run" / "events").write_text("mine")
    fd = open_beneath(str(tmp_path), "run/events")
    (tmp_path / "run" / "events").unlink()
    (tmp_path / "run" / "events").symlink_to(tmp_path / "other")
    with os.fdopen(fd) as handle:
        assert handle.read() == "mine"


def test_plain_absolute_paths(tmp_path):
    assert plain_absolute_path(f"file://{tmp_path}//runs/tf-a/") == f"{tmp_path}/runs/tf-a"
    for bad, why in [("runs/tf-a", "not an absolute path"), (f"{tmp_path}/tf-a/link/../../tf-b", r"'\.\.'"),
                     (123, "expected a path, got int"), (None, "expected a path"), ("gs://b/runs/x", "not a local")]:
        with pytest.raises(UnsafePathError, match=why):
            plain_absolute_path(bad)  # type: ignore[arg-type]


def test_write_json_at_replaces_a_link_planted_under_the_name_instead_of_writing_through_it(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "victim.json").write_text("untouched")
    (tmp_path / "run" / "launched_by.json").symlink_to(tmp_path / "victim.json")
    fd = os.open(tmp_path / "run", os.O_RDONLY | os.O_DIRECTORY)
    try:
        write_json_at(fd, "launched_by.json", {"dag_id": "d"})
    finally:
        os.close(fd)
    assert (tmp_path / "victim.json").read_text() == "untouched"
    assert not (tmp_path / "run" / "launched_by.json").is_symlink()
    assert read_json(tmp_path / "run" / "launched_by.json") == {"dag_id": "d"}
    assert os.listdir(tmp_path / "run") == ["launched_by.json"]  # no temporary left
