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


def write_clicks_csv(path: str | os.PathLike, rows: int = 200_000, users: int = 120_000, items: int = 150_000,
                     seed: int = 0) -> Path:
    """Click logs of a recommender: columns ``user`` and ``item`` (string ids such as ``u1234``,
    drawn with a long tail as real traffic is: a few ids often, most rarely) and ``clicked``
    (0/1). Whether a pair is clicked follows a hidden liking of each user and each item, so a
    model with an embedding per id learns to rank clicks above the rest (AUC above 0.5).
    Written atomically; returns the path."""
    if int(rows) < 1 or int(users) < 1 or int(items) < 1:
        raise ValueError(f"rows, users and items must be at least 1, got {rows}, {users}, {items}")
    rng = np.random.default_rng(seed)
    # A power law: id k of n is drawn about (k/n)^(-2/3) times as often as the rarest.
    user = (int(users) * rng.random(int(rows)) ** 3).astype(np.int64)
    item = (int(items) * rng.random(int(rows)) ** 3).astype(np.int64)
    # Ids by a random permutation: the popular ones are spread over the id space, not the first few.
    user, item = rng.permutation(int(users))[user], rng.permutation(int(items))[item]
    liking = rng.normal(0.0, 3.0, int(users))[user] + rng.normal(0.0, 3.0, int(items))[item]
    clicked = (rng.random(int(rows)) < 1.0 / (1.0 + np.exp(-(liking - 1.0)))).astype(np.int64)
    path = Path(path)
    with atomic_open(path, "w", fsync=False) as handle:
        handle.write("user,item,clicked\n")
        for start in range(0, int(rows), 100_000):
            stop = start + 100_000
            handle.writelines(f"u{u},i{i},{c}\n" for u, i, c in zip(user[start:stop], item[start:stop], clicked[start:stop], strict=True))
    return path
