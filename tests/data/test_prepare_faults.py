"""Faults of `prepare` a user hits: a bad value deep in a large CSV, an integer beyond int64,
far too many shards, two runs of one dataset at once, a run killed mid-write. Each case checks
the outcome and that nothing half-written is left where readers look."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_tf.data import DataError, InputDataError, SchemaError, load_schema, prepare_dataset
from airflow_tf.data.stream import buffer_plan

HINT = r"pass string_columns=\['n'\] \(CLI: --string-columns n\) or declare it as string in a schema"


def _numbers_csv(path: Path, rows: int, odd: dict[int, str] | None = None, blank_before: int | None = None) -> Path:
    """Columns n (the row number, or ``odd[row]``) and y; optionally a blank line before a row."""
    odd = odd or {}
    lines = ["n,y"]
    for i in range(rows):
        if i == blank_before:
            lines.append("")
        lines.append(f"{odd.get(i, i)},{i % 2}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_value_that_is_not_a_number_deep_in_an_inferred_column_stops_prepare(tmp_path, assert_nothing_committed):
    # All in the first block (the types are inferred from it): the column is text with one
    # word among numbers, which is named with the count.
    path = _numbers_csv(tmp_path / "deep.csv", 60_000, {50_000: "abc"})
    with pytest.raises(InputDataError) as caught:
        prepare_dataset(path, tmp_path / "out", "deep", label="y")
    message = str(caught.value)
    assert re.search(rf"{re.escape(str(path))} line 50002, column 'n': value 'abc' is not a number, "
                     rf"but 59,999 of the column's 60,000 values are; fix the value, or if 'n' is a "
                     rf"text column, {HINT}", message), message
    assert_nothing_committed(tmp_path / "out")


def test_a_value_contradicting_the_type_inferred_from_the_first_block_stops_prepare(tmp_path, assert_nothing_committed):
    path = _numbers_csv(tmp_path / "late.csv", 300_000, {250_000: "abc"})
    block, _ = buffer_plan(4)
    assert path.stat().st_size > 4 * block  # the bad value lies blocks beyond the first
    with pytest.raises(InputDataError) as caught:
        prepare_dataset(path, tmp_path / "out", "late", label="y", buffer_mib=4)
    message = str(caught.value)
    assert re.search(rf"{re.escape(str(path))} line 250002, column 'n': value 'abc' does not parse as int64; .*"
                     rf"the types of .*late\.csv's columns are inferred from its first {block:,} bytes", message), message
    assert_nothing_committed(tmp_path / "out")


def test_a_declared_numeric_column_names_a_bad_value_beyond_the_first_block(tmp_path, assert_nothing_committed):
    path = _numbers_csv(tmp_path / "declared.csv", 300_000, {250_000: "1.5.2"})
    schema = {"features": [{"name": "n", "dtype": "float32"}, {"name": "y", "dtype": "int64"}], "label": "y"}
    with pytest.raises(InputDataError, match=rf"declared\.csv line 250002, column 'n': value '1\.5\.2' does not "
                                             r"parse as float32; fix the value or declare the column as string"):
        prepare_dataset(path, tmp_path / "out", "declared", schema=schema)
    assert_nothing_committed(tmp_path / "out")


def test_string_columns_read_a_mixed_column_as_text_verbatim(tmp_path, read_split):
    path = _numbers_csv(tmp_path / "ids.csv", 60_000, {0: "007", 50_000: "abc"})
    summary = prepare_dataset(path, tmp_path / "out", "ids", label="y", string_columns=["n"], eval_fraction=0)
    assert load_schema(summary["dataset_uri"])["n"].dtype == "string"
    values = {v.decode() for v in read_split(summary["dataset_uri"])["n"]}
    assert {"007", "abc", "1", "59999"} <= values and len(values) == 60_000

    # The command line takes the same opt-in (comma-separated or repeated).
    cli = [sys.executable, "-m", "airflow_tf.cli", "prepare", "--input", str(path), "--output",
           str(tmp_path / "out"), "--name", "ids", "--label", "y", "--quiet"]
    failed = subprocess.run(cli, capture_output=True, text=True)
    assert failed.returncode != 0 and "line 50002, column 'n': value 'abc' is not a number" in failed.stderr
    assert "--string-columns n" in failed.stderr
    done = subprocess.run(cli + ["--string-columns", "n"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["schema"]["features"][0] == {"name": "n", "dtype": "string", "shape": []}


def test_a_text_column_with_a_stray_number_and_lines_counted_as_an_editor_does(tmp_path, assert_nothing_committed):
    # A blank line (pyarrow skips it) and a value spanning two lines come before the number.
    text = "city,y\n" + "".join(f"Paris {i},{i % 2}\n" for i in range(50)) + '"New\nYork",1\n\n' + "1984,0\nOslo,1\n"
    path = tmp_path / "cities.csv"
    path.write_text(text)
    with pytest.raises(InputDataError, match=r"cities\.csv line 55, column 'city': value '1984' is a number in a "
                                             r"column of text \(1 of its 53 values are numbers\); fix the value, "
                                             r"or if 'city' is a text column, pass string_columns=\['city'\]"):
        prepare_dataset(path, tmp_path / "out", "cities", label="y")
    assert_nothing_committed(tmp_path / "out")
    summary = prepare_dataset(path, tmp_path / "out", "cities", label="y", string_columns="city", eval_fraction=0)
    assert summary["schema"]["features"][0]["dtype"] == "string" and summary["rows"] == 53
    # Names that pyarrow would read as NaN or infinity do not make a text column numeric.
    names = tmp_path / "names.csv"
    names.write_text("name,y\nAda,0\nNan,1\nInf,0\nLin,1\n")
    summary = prepare_dataset(names, tmp_path / "out", "names", label="y", eval_fraction=0)
    assert summary["schema"]["features"][0]["dtype"] == "string"


def test_string_columns_misuse_is_refused(tmp_path, write_csv, assert_nothing_committed):
    path = write_csv("ok.csv", "n,y\n1,0\n2,1\n3,0\n")
    with pytest.raises(SchemaError, match=r"string_columns \['m'\] are not columns of .*ok\.csv \(its columns: n, y\)"):
        prepare_dataset(path, tmp_path / "out", "s", label="y", string_columns="n, m")
    schema = {"features": [{"name": "n", "dtype": "int64"}, {"name": "y", "dtype": "int64"}]}
    with pytest.raises(SchemaError, match=r"string_columns \['n'\] and a declared schema were both given; "
                                          "with a schema, declare those columns' dtype as string there"):
        prepare_dataset(path, tmp_path / "out", "s", label="y", schema=schema, string_columns=["n"])
    pq.write_table(pa.table({"n": [1, 2, 3], "y": [0, 1, 0]}), tmp_path / "typed.parquet")
    with pytest.raises(SchemaError, match=r"typed\.parquet, column 'n' holds numbers but is declared string"):
        prepare_dataset(tmp_path / "typed.parquet", tmp_path / "out", "s", label="y", string_columns=["n"])
    assert_nothing_committed(tmp_path / "out")


@pytest.mark.parametrize("big", ["9223372036854775808", "-9223372036854775809", "18446744073709551615"])
def test_an_integer_beyond_int64_stops_prepare_instead_of_making_the_column_float(
        tmp_path, assert_nothing_committed, big):
    path = _numbers_csv(tmp_path / "ids.csv", 300_000, {250_000: big})
    with pytest.raises(InputDataError, match=rf"ids\.csv line 250002, column 'n': integer {big} is beyond the int64 "
                                             r"range \(-9223372036854775808 to 9223372036854775807\); fix the value, "
                                             "or declare the column as float32"):
        prepare_dataset(path, tmp_path / "out", "ids", label="y")
    schema = {"features": [{"name": "n", "dtype": "int64"}, {"name": "y", "dtype": "int64"}], "label": "y"}
    with pytest.raises(InputDataError, match=rf"ids\.csv line 250002, column 'n': integer {big} is beyond the int64"):
        prepare_dataset(path, tmp_path / "out", "ids", schema=schema)
    assert_nothing_committed(tmp_path / "out")


def test_int64_limits_stay_exact_and_a_float_column_may_hold_large_numbers(tmp_path, read_split):
    limits = _numbers_csv(tmp_path / "limits.csv", 1000, {3: "9223372036854775807", 4: "-9223372036854775808"})
    summary = prepare_dataset(limits, tmp_path / "out", "limits", label="y", eval_fraction=0)
    values = read_split(summary["dataset_uri"])["n"]
    assert values.dtype == np.int64 and {2**63 - 1, -(2**63)} <= set(values.tolist())

    floats = _numbers_csv(tmp_path / "floats.csv", 1000, {3: "0.5", 500: "99999999999999999999"})
    summary = prepare_dataset(floats, tmp_path / "out", "floats", label="y", eval_fraction=0)
    assert summary["schema"]["features"][0]["dtype"] == "float32"
    assert np.float32(1e20) in read_split(summary["dataset_uri"])["n"]


def test_too_many_shards_is_refused_with_the_numbers_and_a_value_that_works(tmp_path, assert_nothing_committed):
    path = _numbers_csv(tmp_path / "rows.csv", 3000)
    with pytest.raises(DataError, match=r"shards=100 is too many for 2,400 train rows \(about 24\.0 rows per file\); "
                                        r"at most 24 train files are allowed \(at least 100 rows each, 10,000 files "
                                        r"at most\): use shards=24 or fewer"):
        prepare_dataset(path, tmp_path / "out", "rows", label="y", shards=100)
    with pytest.raises(DataError, match=r"target_shard_mib=0\.0001 would make \d+ files of 2,400 train rows; at most "
                                        r"24 are allowed .*: use target_shard_mib=([0-9.]+) or more") as caught:
        prepare_dataset(path, tmp_path / "out", "rows", label="y", target_shard_mib=0.0001)
    assert_nothing_committed(tmp_path / "out")
    suggested = float(re.search(r"use target_shard_mib=([0-9.]+)", str(caught.value)).group(1))
    assert prepare_dataset(path, tmp_path / "out", "rows", label="y", shards=24)["shards"] == {"train": 24, "eval": 6}
    by_size = prepare_dataset(path, tmp_path / "out", "rows", label="y", target_shard_mib=suggested)
    assert by_size["shards"]["train"] <= 24


# A prepare run in its own process that waits, once its temporary directory holds written
# records, until ``go`` exists (so two runs are provably in flight at once).
RUN = """
import json, sys, time
from pathlib import Path
from airflow_tf.data import prepare_dataset

source, output, ready, go, version = sys.argv[1:]
def progress(p):
    if p.stage == "write" and not Path(ready).exists():
        Path(ready).touch()
        while not Path(go).exists():
            time.sleep(0.05)
summary = prepare_dataset(source, output, "shared", version=version or None, label="y", shards=2,
                          progress=progress, progress_every=0)
print(json.dumps(summary))
"""


def _start(tmp_path: Path, source: Path, ready: Path, go: Path, version: str = "") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RUN, str(source), str(tmp_path / "out"), str(ready), str(go),
                             version], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, process: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def _run_two_at_once(tmp_path: Path, source: Path, version: str = "") -> list[tuple[int, str, str]]:
    """Two prepare processes, both released only once both are mid-write: (exit code, stdout, stderr)."""
    go = tmp_path / "go"
    runs = [_start(tmp_path, source, tmp_path / f"ready-{i}", go, version) for i in range(2)]
    try:
        for i, run in enumerate(runs):  # both have planned their version and written records
            _wait_for(tmp_path / f"ready-{i}", run)
        go.touch()
        outputs = [run.communicate(timeout=300) for run in runs]
        return [(run.returncode, *output) for run, output in zip(runs, outputs)]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()


def test_two_concurrent_runs_of_one_dataset_both_commit_complete_versions(tmp_path):
    source = _numbers_csv(tmp_path / "in.csv", 20_000)
    results = _run_two_at_once(tmp_path, source)
    assert all(code == 0 for code, _, _ in results), [err for _, _, err in results]
    summaries = [json.loads(out) for _, out, _ in results]
    assert sorted(s["version"] for s in summaries) == ["1", "2"]
    root = tmp_path / "out" / "shared"
    assert sorted(p.name for p in root.iterdir()) == ["1", "2"]  # no temporary left behind
    for summary in summaries:
        uri = Path(summary["dataset_uri"])
        manifest = json.loads((uri / "_SUCCESS").read_text())
        assert manifest["version"] == uri.name == summary["version"]
        assert manifest["splits"]["train"]["examples"] + manifest["splits"]["eval"]["examples"] == 20_000
        for split, info in manifest["splits"].items():
            for shard in info["shards"]:
                assert (uri / split / shard["file"]).stat().st_size == shard["bytes"] > 0


def test_a_prepare_killed_mid_write_commits_nothing_and_its_directory_is_cleaned_after_a_day(tmp_path):
    source = _numbers_csv(tmp_path / "in.csv", 20_000)
    run = _start(tmp_path, source, tmp_path / "ready", tmp_path / "never")
    try:
        _wait_for(tmp_path / "ready", run)
        os.kill(run.pid, signal.SIGKILL)
    finally:
        run.kill()
        run.communicate()
    root = tmp_path / "out" / "shared"
    (left,) = root.iterdir()
    assert left.name.startswith(".tmp-") and any(left.rglob("*.tfrecord")) and not (left / "_SUCCESS").exists()

    # The next run commits version 1 and keeps the young directory (it could be a live run) ...
    assert prepare_dataset(source, tmp_path / "out", "shared", label="y")["version"] == "1"
    assert left.exists()
    # ... and a run a day later removes it.
    os.utime(left, (time.time() - 2 * 86400,) * 2)
    assert prepare_dataset(source, tmp_path / "out", "shared", label="y")["version"] == "2"
    assert sorted(p.name for p in root.iterdir()) == ["1", "2"]


def test_two_concurrent_runs_asking_for_the_same_version_commit_one_and_fail_the_other(tmp_path):
    source = _numbers_csv(tmp_path / "in.csv", 20_000)
    results = sorted(_run_two_at_once(tmp_path, source, version="3"), key=lambda r: r[0])
    (ok, out, _), (failed, _, err) = results
    assert ok == 0 and failed != 0
    assert re.search(r"DatasetExistsError: dataset version .*/shared/3 was created while this one was being "
                     "written", err)
    root = tmp_path / "out" / "shared"
    assert sorted(p.name for p in root.iterdir()) == ["3"]
    assert json.loads((root / "3" / "_SUCCESS").read_text())["version"] == "3" == json.loads(out)["version"]
