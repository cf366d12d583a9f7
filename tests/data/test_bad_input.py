"""Bad input gets an error naming the file, line or column and what to do, and leaves
nothing behind: no dataset version, no _SUCCESS, no temporary directory."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_tf.data.parts import plan_parts
from airflow_tf.data import (
    DataError, DatasetExistsError, InputDataError, SchemaError, load_schema, prepare_dataset,
)

GOOD = "x,y\n1.5,1\n2.5,0\n3.5,1\n"


def _prepare(tmp_path, source, **kwargs):
    kwargs.setdefault("label", "y")
    return prepare_dataset(source, tmp_path / "out", "bad", **kwargs)


def _fails(tmp_path, source, error, pattern, assert_nothing_committed, **kwargs):
    with pytest.raises(error) as caught:
        _prepare(tmp_path, source, **kwargs)
    message = str(caught.value)
    assert re.search(pattern, message), message
    assert_nothing_committed(tmp_path / "out")
    return message


def test_missing_input_and_glob_without_matches(tmp_path, assert_nothing_committed):
    _fails(tmp_path, tmp_path / "absent.csv", InputDataError, r"absent\.csv does not exist", assert_nothing_committed)
    _fails(tmp_path, str(tmp_path / "*.parquet"), InputDataError, r"glob .*\*\.parquet' matches no files",
           assert_nothing_committed)


@pytest.mark.parametrize("name", [None, "", "  ", 7, ["clicks"]])
def test_a_name_that_is_not_a_non_empty_string_is_refused(tmp_path, write_csv, assert_nothing_committed, name):
    """A dataset's name becomes its directory: 7 or a list would be quietly written as "7" or
    "['clicks']" and found under no name the user knows."""
    source = write_csv("good.csv", GOOD)
    with pytest.raises(DataError, match=rf"name: expected a dataset name \(a non-empty string\), got {re.escape(repr(name))}"):
        prepare_dataset(source, tmp_path / "out", name, label="y")
    with pytest.raises(DataError, match=r"name: expected a dataset name"):
        plan_parts(source, tmp_path / "out", name, parts=2, label="y")
    assert_nothing_committed(tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_empty_file_and_header_without_rows(tmp_path, write_csv, assert_nothing_committed):
    _fails(tmp_path, write_csv("empty.csv", ""), InputDataError, r"empty\.csv is empty", assert_nothing_committed)
    _fails(tmp_path, write_csv("header.csv", "x,y\n"), InputDataError, r"no rows .*header\.csv",
           assert_nothing_committed)


def test_ragged_csv_row_names_file_and_line(tmp_path, write_csv, assert_nothing_committed):
    path = write_csv("ragged.csv", GOOD + "4.5\n5.5,1\n")
    _fails(tmp_path, path, InputDataError, rf"{re.escape(str(path))} line 5: expected 2 fields .* found 1",
           assert_nothing_committed)


def test_value_not_parsing_as_declared_type_names_file_line_and_column(tmp_path, write_csv, assert_nothing_committed):
    schema = {"features": [{"name": "x", "dtype": "float32"}, {"name": "y", "dtype": "int64"}], "label": "y"}
    path = write_csv("typed.csv", GOOD + "4.5,yes\n")
    _fails(tmp_path, path, InputDataError, r"typed\.csv line 5, column 'y': value 'yes' does not parse as int64",
           assert_nothing_committed, schema=schema)
    path = write_csv("typed2.csv", GOOD + "oops,1\n")
    _fails(tmp_path, path, InputDataError, r"typed2\.csv line 5, column 'x': value 'oops' does not parse as float32",
           assert_nothing_committed, schema=schema)
    path = write_csv("blank.csv", "x,y\n1.5,1\n,0\n")
    _fails(tmp_path, path, InputDataError, r"blank\.csv line 3, column 'x': missing \(empty\) value",
           assert_nothing_committed)


def test_nan_and_infinity_are_refused_unless_allowed(tmp_path, write_csv, assert_nothing_committed):
    path = write_csv("nan.csv", GOOD + "nan,1\n")
    message = _fails(tmp_path, path, InputDataError, r"nan\.csv line 5, column 'x': nan is not allowed",
                     assert_nothing_committed)
    assert "allow_nan=True" in message and "--allow-nan" in message
    np.savez(tmp_path / "inf.npz", x=np.array([[1.0, np.inf]]), y=np.array([1]))
    _fails(tmp_path, tmp_path / "inf.npz", InputDataError, r"inf\.npz row 0, column 'x': inf is not allowed",
           assert_nothing_committed)
    summary = _prepare(tmp_path, path, allow_nan=True, eval_fraction=0)
    assert load_schema(summary["dataset_uri"])["x"].allow_nan


def test_value_outside_float32_range(tmp_path, write_csv, assert_nothing_committed):
    _fails(tmp_path, write_csv("big.csv", GOOD + "1e39,1\n"), InputDataError,
           r"big\.csv line 5, column 'x': value 1e\+39 is out of the float32 range", assert_nothing_committed)


def test_label_column_that_does_not_exist(tmp_path, write_csv, assert_nothing_committed):
    _fails(tmp_path, write_csv("ok.csv", GOOD), SchemaError, r"label column 'target' is not in the input \(columns: x, y\)",
           assert_nothing_committed, label="target")


def test_declared_schema_that_does_not_match_the_input(tmp_path, write_csv, assert_nothing_committed):
    path = write_csv("ok.csv", GOOD)
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps({"features": [{"name": "x", "dtype": "float32"}, {"name": "z", "dtype": "int64"}]}))
    _fails(tmp_path, path, SchemaError, r"declared schema has features \['z'\] that .*ok\.csv does not have",
           assert_nothing_committed, schema=str(schema_file), label=None)
    _fails(tmp_path, path, SchemaError, r"ok\.csv has columns \['y'\] that the declared schema does not list",
           assert_nothing_committed, schema={"features": [{"name": "x", "dtype": "float32"}]}, label=None)
    np.savez(tmp_path / "v.npz", v=np.zeros((3, 4)), y=np.zeros(3))
    _fails(tmp_path, tmp_path / "v.npz", SchemaError, r"v\.npz, column 'v' has shape \[4\] per row but the schema declares \[3\]",
           assert_nothing_committed,
           schema={"features": [{"name": "v", "dtype": "float32", "shape": [3]}, {"name": "y", "dtype": "float32"}]})
    schema_file.write_text("{not json")
    _fails(tmp_path, path, SchemaError, r"schema\.json is not valid JSON", assert_nothing_committed, schema=str(schema_file))


def test_parquet_lists_of_different_lengths(tmp_path, assert_nothing_committed):
    pq.write_table(pa.table({"v": [[1.0, 2.0], [3.0]], "y": [0, 1]}), tmp_path / "ragged.parquet")
    _fails(tmp_path, tmp_path / "ragged.parquet", InputDataError,
           r"ragged\.parquet row 1, column 'v': list of 1 values where row 0 has 2", assert_nothing_committed)


def test_existing_version_is_refused_and_left_intact(tmp_path, write_csv):
    path = write_csv("ok.csv", GOOD)
    first = _prepare(tmp_path, path, version=7, eval_fraction=0)
    marker = os.path.join(first["dataset_uri"], "_SUCCESS")
    before = open(marker).read()
    with pytest.raises(DatasetExistsError, match=r"bad/7 already exists; choose another version"):
        _prepare(tmp_path, path, version=7, eval_fraction=0.5)
    assert open(marker).read() == before
    assert sorted(p.name for p in (tmp_path / "out" / "bad").iterdir()) == ["7"]


def test_unwritable_output(tmp_path, write_csv, assert_nothing_committed):
    path = write_csv("ok.csv", GOOD)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    with pytest.raises(DataError, match=r"cannot write to the output directory .*blocker/bad: .*choose a writable"):
        prepare_dataset(path, blocker, "bad", label="y")
    assert blocker.read_text() == "a file, not a directory"

    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o500)
    try:
        if os.access(read_only, os.W_OK):  # root ignores permissions: use a read-only location instead
            read_only = "/proc/airflow-tf-test"
        with pytest.raises(DataError, match=r"cannot write to the output directory"):
            prepare_dataset(path, read_only, "bad", label="y")
    finally:
        os.chmod(tmp_path / "read-only", 0o700)
    assert_nothing_committed(tmp_path / "read-only")


@pytest.mark.parametrize("options, pattern", [
    ({"eval_fraction": 1.0}, r"eval_fraction must be in \[0, 1\)"),
    ({"shards": 0}, r"shards must be between 1 and 10,000, got 0"),
    ({"shards": 125_000}, r"shards must be between 1 and 10,000, got 125000"),
    ({"compression": "zip"}, r"compression 'zip' is not supported"),
    ({"version": "../x"}, r"version '\.\./x' is not a valid directory name"),
])
def test_bad_options(tmp_path, write_csv, assert_nothing_committed, options, pattern):
    _fails(tmp_path, write_csv("ok.csv", GOOD), DataError, pattern, assert_nothing_committed, **options)
