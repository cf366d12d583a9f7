"""Vocabularies from the data: the most frequent values of a column, counted while the dataset
is prepared (what TFX Transform's ``vocabulary`` analyzer gives a model).

``prepare_dataset(..., vocabularies={"user": 100_000})`` counts every value of ``user`` in the
training split (never the eval split, so evaluation sees ids as new data would) and writes
``vocabularies/user.txt`` into the dataset version: the top K values, one per line, most frequent
first (ties by value), ready for ``keras.layers.StringLookup(vocabulary=...)``; and
``vocabularies/user.counts.tsv`` with each value's count. A model reads them through its schema:
``schema.vocabulary("user")``. Counting keeps one entry per distinct value in memory, not the
rows."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from airflow_tf.files import atomic_open

from .errors import DataError
from .schema import Schema

VOCABULARY_DIR = "vocabularies"
DEFAULT_VOCABULARY_SIZE = 100_000
"""Values kept when a column is named without a size."""
_TYPES = ("string", "int64")


def vocabulary_sizes(vocabularies: Mapping[str, Any] | Sequence[str] | str | None, schema: Schema) -> dict[str, int]:
    """``{column: top K}`` from what a user passes (a mapping to sizes, or column names, or names
    separated by commas), checked against the schema: each a string or integer feature, each
    size a whole number >= 1."""
    if not vocabularies:
        return {}
    if isinstance(vocabularies, str):
        vocabularies = [name.strip() for name in vocabularies.split(",") if name.strip()]
    if not isinstance(vocabularies, Mapping):
        vocabularies = {name: DEFAULT_VOCABULARY_SIZE for name in vocabularies}
    sizes = {}
    for column, size in vocabularies.items():
        if column not in schema:
            raise DataError(f"vocabularies: {column!r} is not a column of the input (columns: {', '.join(schema.names)})")
        if schema[column].dtype not in _TYPES or schema[column].shape != ():
            raise DataError(f"vocabularies: column {column!r} is {schema[column].dtype} of shape {schema[column].shape}; "
                            "a vocabulary is counted over a column of one string or integer per row "
                            "(read ids as text with string_columns)")
        if column == schema.label_name:
            raise DataError(f"vocabularies: {column!r} is the label; vocabularies are for input features")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise DataError(f"vocabularies: the size of {column!r} must be a whole number >= 1 (the top K values), "
                            f"got {size!r}")
        sizes[column] = size
    return sizes


class VocabularyCounter:
    """Counts the values of some columns over the training rows of each block."""

    def __init__(self, sizes: Mapping[str, int]):
        self.sizes = dict(sizes)
        self.counts: dict[str, Counter] = {column: Counter() for column in self.sizes}

    def update(self, columns: Mapping[str, np.ndarray], rows: np.ndarray) -> None:
        for column, counts in self.counts.items():
            values, times = np.unique(columns[column][rows], return_counts=True)
            counts.update(dict(zip(values.tolist(), times.tolist(), strict=True)))

    def write(self, directory: Path) -> dict[str, dict[str, Any]]:
        """Writes each column's top values and counts under ``directory/vocabularies``; returns
        what the schema records of them."""
        recorded = {}
        (directory / VOCABULARY_DIR).mkdir(exist_ok=True)
        for column, counts in self.counts.items():
            top = sorted(counts.items(), key=lambda item: (-item[1], str(item[0])))[: self.sizes[column]]
            tokens = [str(value) for value, _ in top]
            bad = next((t for t in tokens if "\n" in t or "\r" in t or "\t" in t), None)
            if bad is not None:
                raise DataError(f"vocabularies: column {column!r} has the value {bad!r} with a line break or tab, "
                                "which a vocabulary file (one value per line) cannot hold; clean the column")
            name = f"{VOCABULARY_DIR}/{column}.txt"
            with atomic_open(directory / name, "w", fsync=False) as handle:
                handle.writelines(f"{token}\n" for token in tokens)
            with atomic_open(directory / f"{VOCABULARY_DIR}/{column}.counts.tsv", "w", fsync=False) as handle:
                handle.writelines(f"{token}\t{count}\n" for token, (_, count) in zip(tokens, top, strict=True))
            recorded[column] = {"file": name, "size": len(tokens), "top_k": self.sizes[column],
                                "distinct": len(counts)}
        return recorded


def read_vocabulary(path: str | os.PathLike) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return handle.read().splitlines()
