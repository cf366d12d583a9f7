"""The TF Serving directory layout: integer versions, hidden staging, no overwrite."""

import json
import os
import time

import pytest

from airflow_tf.serving import latest_export, list_versions, model_dir
from airflow_tf.serving.versions import METADATA_FILE, STALE_STAGING_SECONDS, publish, staging_dir


def _staged_export(directory, marker):
    """A stand-in export (a file) built the way export_saved_model builds one."""
    directory.mkdir(parents=True, exist_ok=True)
    staged = directory / f".tmp-test-{marker}"
    staged.mkdir()
    (staged / "saved_model.pb").write_text(marker)
    return staged


def test_versions_are_the_integer_directories_only(tmp_path):
    for name in ("1", "10", "2", ".tmp-123", "tmp-4", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "3").write_text("a file, not a version")
    assert list_versions(tmp_path) == [1, 2, 10]
    assert list_versions(tmp_path / "missing") == []


def test_publish_takes_the_next_version_and_never_replaces_one(tmp_path):
    directory = tmp_path / "model"
    assert publish(_staged_export(directory, "a"), directory)[0] == 1
    assert publish(_staged_export(directory, "b"), directory)[0] == 2
    (directory / "3").mkdir()  # an empty directory someone else created: still not ours to replace
    version, path = publish(_staged_export(directory, "c"), directory)
    assert (version, path.name) == (4, "4")
    assert (directory / "1" / "saved_model.pb").read_text() == "a"
    assert (directory / "2" / "saved_model.pb").read_text() == "b"
    assert list(directory.glob(".tmp-*")) == []


def test_a_failed_build_leaves_neither_a_version_nor_its_staging_dir(tmp_path):
    directory = tmp_path / "model"
    with pytest.raises(RuntimeError, match="disk full"):
        with staging_dir(directory) as staged:
            (staged / "saved_model.pb").write_text("half")
            raise RuntimeError("disk full")
    assert list(directory.iterdir()) == []


def test_stale_staging_dirs_of_dead_exports_are_cleaned_up(tmp_path):
    directory = tmp_path / "model"
    stale = _staged_export(directory, "dead")
    old = time.time() - STALE_STAGING_SECONDS - 60
    os.utime(stale, (old, old))
    fresh = _staged_export(directory, "running")  # another export in progress: left alone
    with staging_dir(directory):
        pass
    assert not stale.exists() and fresh.exists()


def test_latest_export_reports_version_path_and_metadata(tmp_path):
    assert latest_export(tmp_path, "linear") is None
    directory = model_dir(tmp_path, "linear")
    for version in (1, 2):
        (directory / str(version) / METADATA_FILE.parent).mkdir(parents=True)
        (directory / str(version) / METADATA_FILE).write_text(json.dumps({"run_dir": f"run-{version}"}))
    served = latest_export(tmp_path, "linear")
    assert served == {"version": 2, "path": str(directory / "2"), "metadata": {"run_dir": "run-2"}}
    json.dumps(served)  # fit for XCom


def test_model_names_are_sanitised_into_one_path_component(tmp_path):
    assert model_dir(tmp_path, "fraud/../../etc").parent == tmp_path
    assert model_dir(tmp_path, "linear").name == "linear"
    with pytest.raises(ValueError, match="model_name: a model name is required"):
        model_dir(tmp_path, " ")


def test_concurrent_exports_each_get_their_own_version(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    directory = tmp_path / "model"
    staged = [_staged_export(directory, f"export-{i}") for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda path: publish(path, directory), staged))
    assert sorted(version for version, _ in results) == list(range(1, 9))
    contents = {(path / "saved_model.pb").read_text() for _, path in results}
    assert contents == {f"export-{i}" for i in range(8)}, "no export replaced another"


def test_importing_serving_loads_neither_tensorflow_nor_matplotlib():
    # Airflow imports the operators (and so this package) whenever it parses a DAG file.
    import subprocess
    import sys

    code = "import sys, airflow_tf.serving; print(sorted(m for m in ('tensorflow', 'keras', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
