"""The train/eval split of each row: a hash of (file name, row number, seed), or of a key
column's value, so every row's split is decided alone, however the input is read."""

from __future__ import annotations

import hashlib

import numpy as np

from .errors import SchemaError
from .inputs import Block
from .object_store import InputPath, identity
from .schema import Schema


def _key_fractions(values: np.ndarray, seed: int) -> np.ndarray:
    """A number in [0, 1) per row from a hash of its key: equal keys always agree."""
    uniques, inverse = np.unique(values, return_inverse=True)
    salt = str(int(seed)).encode()
    fractions = np.empty(len(uniques), dtype=np.float64)
    for i, value in enumerate(uniques):
        if isinstance(value, bytes):
            text = value
        elif isinstance(value, (float, np.floating)):
            text = repr(float(value)).encode()
        else:
            text = str(value.item() if isinstance(value, np.generic) else value).encode("utf-8")
        digest = hashlib.blake2b(text, digest_size=8, key=salt).digest()
        fractions[i] = int.from_bytes(digest, "big") / 2.0**64
    return fractions[inverse.ravel()]


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A bijective mix of 64-bit integers (SplitMix64's finaliser): neighbours map far apart."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def file_key(path: InputPath | str, seed: int) -> int:
    """A 64-bit number naming an input file under ``seed``: of its name, not of where it lives, so
    the same file splits the same way in another directory, on another mount or in object storage."""
    name = identity(path).rstrip("/").rsplit("/", 1)[-1]
    text = f"{int(seed)}\0{name}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def row_fractions(key: int, start: int, rows: int) -> np.ndarray:
    """A number in [0, 1) per row from a hash of (file name, row number, seed) (``key`` from
    :func:`file_key`): the same row always gets the same number, however the input is read."""
    with np.errstate(over="ignore"):
        mixed = _splitmix64(np.arange(start, start + rows, dtype=np.uint64) ^ np.uint64(key))
    return (mixed >> np.uint64(11)).astype(np.float64) * 2.0**-53


def split_block(block: Block, eval_fraction: float, seed: int, split_key: str | None,
                key: int) -> dict[str, np.ndarray]:
    """Row indices of each split of one block, in a seeded random order.

    A row goes to eval when its hash falls below ``eval_fraction``: of the file, row number and
    seed, or with ``split_key`` of that column's value (a key stays in one split whatever else
    the input holds). Each row's split depends on nothing else, so blocks, files and parallel
    parts can be split independently and agree with one sequential run."""
    n = block.rows
    if split_key is not None:
        is_eval = _key_fractions(block.columns[split_key], seed) < eval_fraction
    else:
        is_eval = row_fractions(key, block.start, n) < eval_fraction
    order = np.random.default_rng([int(seed), key & 0xFFFFFFFF, key >> 32, block.start]).permutation(n)
    in_order = is_eval[order]
    return {"train": order[~in_order], "eval": order[in_order]}


def check_split_key(schema: Schema, split_key: str | None) -> None:
    if split_key is None:
        return
    if split_key not in schema:
        raise SchemaError(f"split key column {split_key!r} is not in the input (columns: {', '.join(schema.names)})")
    if schema[split_key].shape:
        raise SchemaError(f"split key column {split_key!r} must hold one value per row, not a vector")
