"""Small sample datasets for the demo, the examples and the tests."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from airflow_tf.files import atomic_open


def write_linear_regression_csv(path: str | os.PathLike, rows: int = 1000, seed: int = 0,
                                noise: float = 0.33) -> Path:
    """The classic distributed-TensorFlow example: ``y = 2x + 10 + noise`` with ``x`` in [-1, 1].

    Writes a CSV with columns ``x`` and ``y`` (atomically: temporary name, then rename) and
    returns its path. A model trained on it should learn a weight near 2 and a bias near 10."""
    if int(rows) < 1:
        raise ValueError(f"rows must be at least 1, got {rows}")
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=int(rows))
    y = 2.0 * x + 10.0 + rng.standard_normal(int(rows)) * noise
    path = Path(path)
    with atomic_open(path, "w", fsync=False) as handle:
        handle.write("x,y\n")
        np.savetxt(handle, np.column_stack([x, y]), fmt="%.9g", delimiter=",")
    return path
