"""How many shard files each split gets (by count or by target size, within the per-file
bounds) and what they are named."""

from __future__ import annotations

import math

import numpy as np

from .encode import record_lengths
from .errors import DataError
from .inputs import Block
from .options import DEFAULT_TARGET_SHARD_MIB, MAX_SHARDS
from .schema import Schema

MIN_ROWS_PER_SHARD = 100  # fewer rows per file only add per-file overhead for every reader


def mean_record_bytes(block: Block, schema: Schema) -> float:
    sample = np.linspace(0, block.rows - 1, num=min(block.rows, 4096)).astype(np.int64)
    columns = [block.columns[f.name][sample] for f in schema.features]
    return float(record_lengths(schema.features, columns).mean())


def max_shards(rows: int) -> int:
    """The most files a split of ``rows`` rows may have."""
    return max(1, min(MAX_SHARDS, rows // MIN_ROWS_PER_SHARD))


def shard_counts(rows: dict[str, int], record_bytes: float, shards: int | None,
                 target_shard_mib: float | None) -> dict[str, int]:
    """Files per split (``rows``: expected rows per split): ``shards`` for train (eval in
    proportion), or by target size. More train files than :func:`max_shards` allows is
    refused, with the numbers."""
    train_rows = rows["train"]
    limit = max_shards(train_rows)
    rule = f"at least {MIN_ROWS_PER_SHARD} rows each, {MAX_SHARDS:,} files at most"
    target = (target_shard_mib or DEFAULT_TARGET_SHARD_MIB) * (1 << 20)
    if shards is not None and shards > limit:
        fewer = " or fewer" if limit > 1 else ""
        raise DataError(
            f"shards={shards:,} is too many for {train_rows:,} train rows (about {train_rows / shards:,.1f} "
            f"rows per file); at most {limit:,} train files are allowed ({rule}): use shards={limit}{fewer}, "
            f"or leave shards out to size files by target_shard_mib (default {DEFAULT_TARGET_SHARD_MIB:g} MiB)"
        )
    by_size = math.ceil(train_rows * record_bytes / target)
    if shards is None and by_size > limit:
        suggested = math.ceil(train_rows * record_bytes / limit / (1 << 20) * 1000) / 1000
        raise DataError(
            f"target_shard_mib={target / (1 << 20):g} would make {by_size:,} files of {train_rows:,} train rows; "
            f"at most {limit:,} are allowed ({rule}): use target_shard_mib={suggested:g} or more"
        )
    counts = {}
    for split, n in rows.items():
        if shards is not None:
            wanted = shards if split == "train" else math.ceil(shards * n / max(train_rows, 1))
        else:
            wanted = math.ceil(n * record_bytes / target)
        counts[split] = max(1, min(int(wanted), max_shards(n)))
    return counts


def shard_name(index: int, count: int, compression: str | None) -> str:
    suffix = {"gzip": ".gz", "zlib": ".zlib"}.get(compression or "", "")
    return f"part-{index:05d}-of-{count:05d}.tfrecord{suffix}"
