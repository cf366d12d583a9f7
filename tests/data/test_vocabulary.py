"""Vocabularies from the data: prepare keeps each named column's most frequent values (counted
over the training rows only) in the dataset version, and the model reads them from its schema."""

from __future__ import annotations

import csv
from collections import Counter

import pytest

from airflow_tf.data import load_schema, prepare_dataset
from airflow_tf.data.errors import DataError, SchemaError
from airflow_tf.data.samples import write_clicks_csv


@pytest.fixture(scope="module")
def clicks(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab")
    return write_clicks_csv(root / "clicks.csv", rows=5_000, users=800, items=300, seed=5)


def column_counts(path, column):
    with open(path, newline="") as handle:
        return Counter(row[column] for row in csv.DictReader(handle))


def test_the_top_values_of_each_named_column_are_kept_most_frequent_first(clicks, tmp_path):
    summary = prepare_dataset(clicks, tmp_path / "ds", name="clicks", label="clicked", eval_fraction=0,
                              string_columns=["user", "item"], vocabularies={"user": 25, "item": 10})
    schema = load_schema(summary["dataset_uri"])
    expected = [value for value, _ in sorted(column_counts(clicks, "user").items(), key=lambda kv: (-kv[1], kv[0]))]
    assert schema.vocabulary("user") == expected[:25]
    assert len(schema.vocabulary("item")) == 10
    assert schema.vocabularies["user"]["distinct"] == len(expected)
    counts = (tmp_path / "ds" / "clicks" / summary["version"] / "vocabularies" / "user.counts.tsv").read_text()
    first_value, first_count = counts.splitlines()[0].split("\t")
    assert (first_value, int(first_count)) == (expected[0], column_counts(clicks, "user")[expected[0]])


def test_only_training_rows_are_counted(clicks, tmp_path):
    summary = prepare_dataset(clicks, tmp_path / "ds", name="clicks", label="clicked", eval_fraction=0.5,
                              string_columns=["user", "item"], vocabularies={"item": 1_000_000})
    counts = (tmp_path / "ds" / "clicks" / summary["version"] / "vocabularies" / "item.counts.tsv").read_text()
    counted = sum(int(line.split("\t")[1]) for line in counts.splitlines())
    assert counted == summary["counts"]["train"] < summary["rows"]


@pytest.mark.parametrize(("vocabularies", "message"), [
    ({"nope": 5}, "'nope' is not a column of the input"),
    ({"clicked": 5}, "'clicked' is the label"),
    ({"user": 0}, "the size of 'user' must be a whole number >= 1"),
])
def test_a_bad_vocabulary_request_is_refused_before_anything_is_written(clicks, tmp_path, vocabularies, message):
    with pytest.raises(DataError, match=message):
        prepare_dataset(clicks, tmp_path / "ds", name="clicks", label="clicked", string_columns=["user", "item"],
                        vocabularies=vocabularies)
    assert not list((tmp_path / "ds" / "clicks").glob("[0-9]*")), "no version was committed"


def test_a_column_without_a_vocabulary_is_named_when_a_model_asks_for_it(clicks, tmp_path):
    summary = prepare_dataset(clicks, tmp_path / "ds", name="clicks", label="clicked", eval_fraction=0,
                              string_columns=["user", "item"], vocabularies=["user"])
    with pytest.raises(SchemaError, match=r"column 'item' has no vocabulary in this dataset \(vocabularies: user\)"):
        load_schema(summary["dataset_uri"]).vocabulary("item")
