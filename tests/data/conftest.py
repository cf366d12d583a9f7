"""Helpers for the data-layer tests: read a committed split back, check nothing was committed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def _read_split(dataset_uri: str, split: str = "train", **kwargs) -> dict[str, np.ndarray]:
    """Every example of a split, in file order, as NumPy arrays (label included)."""
    from airflow_tf.data import load_schema, make_dataset

    label = load_schema(dataset_uri).label_name
    columns: dict[str, list] = {}
    for batch in make_dataset(dataset_uri, split, batch_size=4096, epochs=1, shuffle=False, **kwargs):
        features, target = batch if label else (batch, None)
        if label:
            features = dict(features, **{label: target})
        for name, tensor in features.items():
            columns.setdefault(name, []).append(tensor.numpy())
    return {name: np.concatenate(parts) for name, parts in columns.items()}


def _assert_nothing_committed(output: Path) -> None:
    """No dataset version, no _SUCCESS and no temporary directory under ``output``."""
    if not output.exists():
        return
    leftovers = [p for p in output.rglob("*") if p.name == "_SUCCESS" or p.name.startswith((".tmp-", ".trash-"))]
    assert not leftovers, f"left behind: {leftovers}"
    versions = [p for p in output.glob("*/*") if p.is_dir()]
    assert not versions, f"a dataset version was created: {versions}"


@pytest.fixture
def write_csv(tmp_path):
    """``write_csv(name, text)``: a CSV file in the test's directory."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def read_split():
    """``read_split(uri, split="train", **make_dataset_kwargs)``: the split as NumPy arrays."""
    return _read_split


@pytest.fixture
def assert_nothing_committed():
    """``assert_nothing_committed(output)``: no version, marker or temporary directory left."""
    return _assert_nothing_committed
