"""Encoding a stream of input blocks on threads and writing it into shard files, in a memory
budget: the read -> split -> encode -> write pipeline one prepare (or one part) runs."""

from __future__ import annotations

import functools
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterator

import numpy as np

from .encode import encode_examples
from .errors import InputDataError
from .inputs import Block, Inputs
from .schema import Schema
from .shard_writer import MIN_GROUP_ROWS, ShardWriter
from .sharding import mean_record_bytes, shard_counts
from .split import file_key, split_block
from .zlib_stream import DeflatePiece

if TYPE_CHECKING:
    from .options import PrepareOptions

_CHUNK_BYTES = 4 << 20  # encoded bytes per task: large enough for NumPy, small enough to stream
_MAX_BLOCK_BYTES = 16 << 20  # input read at once at most (also the CSV type-inference sample)
_GZIP_LEVEL = 6


def _encode_group(schema: Schema, block: Block, rows: np.ndarray,
                  compression: str | None) -> bytes | np.ndarray | DeflatePiece:
    """The framed records of ``rows`` of a block (bytes-like): one gzip member, or one
    :class:`DeflatePiece` of a zlib stream, if asked."""
    columns = [block.columns[f.name][rows] for f in schema.features]
    # Rows come in a seeded random order. Inside this group, rows with the same byte layout
    # are written together (each group keeping that order): it saves a copy of every byte,
    # and readers shuffle across groups and files anyway.
    data = encode_examples(schema.features, columns, keep_order=False)
    if compression == "gzip":
        # Each group is a complete gzip member; a file of concatenated members is valid gzip.
        packer = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31)
        return packer.compress(np.ascontiguousarray(data).data) + packer.flush()
    if compression == "zlib":
        raw = np.ascontiguousarray(data).data
        packer = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, -15)
        return DeflatePiece(packer.compress(raw) + packer.flush(zlib.Z_FULL_FLUSH), zlib.adler32(raw), raw.nbytes)
    return data


def _ordered(pool: ThreadPoolExecutor, tasks: Iterator[tuple[Any, Callable[[], Any]]], depth: int):
    """Run tasks on the pool, yielding (key, result) in submission order, ``depth`` in flight
    (so encoded data waiting to be written stays bounded)."""
    pending: deque[tuple[Any, Future]] = deque()
    for key, task in tasks:
        pending.append((key, pool.submit(task)))
        if len(pending) >= depth:
            first_key, future = pending.popleft()
            yield first_key, future.result()
    while pending:
        key, future = pending.popleft()
        yield key, future.result()


def buffer_plan(buffer_mib: float) -> tuple[int, int]:
    """(bytes of input text per read block, encoding tasks in flight) for a memory budget.

    Memory holds about two read blocks (as Arrow data, then as NumPy columns being split and
    encoded) and the encoded groups in flight; the rest of the budget is headroom for
    pyarrow's and NumPy's temporaries (measured: peak RSS stays below the budget)."""
    budget = int(float(buffer_mib) * (1 << 20))
    block = max(256 << 10, min(_MAX_BLOCK_BYTES, budget // 16))
    return block, max(2, min(16, budget // 8 // encode_chunk_bytes(buffer_mib)))


def encode_chunk_bytes(buffer_mib: float) -> int:
    """Encoded bytes per encoding task: 4 MiB, less under a small budget (encoding takes
    several times its output in temporaries)."""
    return max(256 << 10, min(_CHUNK_BYTES, int(float(buffer_mib) * (1 << 20)) // 32))


def write_stream(inputs: Inputs, directory: Path, options: PrepareOptions, *, in_flight: int,
                 report: Callable[[int, int], None], require_splits: bool = True,
                 on_train_rows: Callable[[Block, np.ndarray], None] | None = None) -> tuple[dict[str, Any], int]:
    """Encode and write the rows of ``inputs`` block by block into shard files under
    ``directory``, split, sharded and compressed as ``options`` say, on ``options.threads``
    threads; returns the manifest's ``splits`` and the number of rows. Without
    ``require_splits`` (one part of several) a split, or all, may end up empty.
    ``on_train_rows(block, rows)`` sees each block's training rows (vocabularies count them)."""
    schema = inputs.schema
    eval_fraction, seed, split_key = options.eval_fraction, options.seed, options.split_key
    compression, chunk_bytes = options.compression, encode_chunk_bytes(options.buffer_mib)
    keys = {path: file_key(path, seed) for path in inputs.paths}
    state: dict[str, Any] = {"rows": 0, "expected": inputs.estimated_rows}

    def tasks() -> Iterator[tuple[Any, Callable[[], Any]]]:
        writer = None
        for block in inputs.blocks():
            if writer is None:  # the first block sizes the records and so the number of files
                record_bytes = mean_record_bytes(block, schema)
                expected = max(inputs.estimated_rows, block.rows)
                train = max(1, round(expected * (1 - eval_fraction)))
                expected_rows = {"train": train, "eval": expected - train} if eval_fraction > 0 else {"train": train}
                counts = shard_counts(expected_rows, record_bytes, options.shards, options.target_shard_mib)
                writer = state["writer"] = ShardWriter(directory, counts, compression)
                group_rows = int(min(65536, max(MIN_GROUP_ROWS, chunk_bytes // max(record_bytes, 1))))
            for split, rows in split_block(block, eval_fraction, seed, split_key, keys[block.path]).items():
                if split == "train" and on_train_rows is not None:
                    on_train_rows(block, rows)
                if split not in writer.counts:
                    continue
                for shard, part in writer.deal(split, rows, group_rows):
                    yield ((split, shard, len(part)), functools.partial(_encode_group, schema, block, part, compression))
            state["rows"] += block.rows
            state["expected"] = max(inputs.estimated_rows, state["rows"])

    written = 0
    with ThreadPoolExecutor(max_workers=options.threads, thread_name_prefix="airflow-tf-encode") as pool:
        try:
            for (split, shard, rows), data in _ordered(pool, tasks(), depth=in_flight):
                state["writer"].write(split, shard, rows, data)
                written += rows
                report(written, state["expected"])
        finally:
            if "writer" in state:
                state["writer"].close()
    if "writer" not in state and not require_splits:
        return {}, 0
    if "writer" not in state:
        raise InputDataError(f"input has no rows (only headers) in {', '.join(map(str, inputs.paths))}; add data rows")
    splits = state["writer"].finish()
    if not require_splits:
        return splits, written
    train = splits.get("train", {}).get("examples", 0)
    if not train:
        raise InputDataError(
            f"no rows left for training: {written} input rows with eval fraction {eval_fraction}; "
            "add rows or lower the eval fraction"
        )
    if eval_fraction > 0 and "eval" not in splits:
        by = f"no row's {split_key!r} key" if split_key else "no row"
        raise InputDataError(
            f"{by} hashed into the eval split ({written} rows, eval fraction {eval_fraction}); "
            + ("use more distinct keys, " if split_key else "add rows, ")
            + "a larger eval fraction, another seed, or eval_fraction=0"
        )
    return splits, written
