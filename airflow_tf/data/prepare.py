"""Raw files -> a committed TFRecord dataset version, streamed in bounded memory.

``<output>/<name>/<version>/{train,eval}/part-NNNNN-of-MMMMM.tfrecord[.gz]``, ``schema.json``
and ``_SUCCESS`` (counts per split and per shard). Rows are read a block at a time, split by a
per-row hash, encoded on threads and appended to the shard files as they arrive. Everything is
written into a hidden temporary directory beside the final one and renamed into place at the
end, so a reader never sees a partial dataset; ``_SUCCESS`` is the last file written."""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
import uuid
import zlib
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, UTC
from pathlib import Path
from collections.abc import Mapping
from typing import Any
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..cluster.names import path_component
from ..files import strip_file_scheme, write_json
from . import object_store
from .encode import encode_examples, record_lengths
from .errors import DataError, DatasetExistsError, InputDataError, SchemaError
from .inputs import Block, Inputs, open_inputs, resolve_inputs, usable_cpus
from .object_store import InputPath, StorageOptions, identity, is_remote, open_binary
from .schema import FORMAT_VERSION, SCHEMA_FILE, SUCCESS_FILE, Schema
from .vocabulary import VocabularyCounter, vocabulary_sizes

DEFAULT_EVAL_FRACTION = 0.2
DEFAULT_TARGET_SHARD_MB = 128.0
MIN_ROWS_PER_SHARD = 100  # fewer rows per file only add per-file overhead for every reader
MAX_SHARDS = 10_000
COMPRESSIONS = ("gzip", "zlib")
DEFAULT_BUFFER_MIB = 512.0
_CHUNK_BYTES = 4 << 20  # encoded bytes per task: large enough for NumPy, small enough to stream
_MIN_GROUP_ROWS = 64  # rows encoded at once at least: fewer cost more in NumPy call overhead
_MAX_GROUPS = 64  # shards one block's rows are dealt over at most (the next block goes on from there)
_MAX_BLOCK_BYTES = 16 << 20  # input read at once at most (also the CSV type-inference sample)
_OPEN_FILES = 64  # shard files kept open while writing
_HASH_CHUNK = 8 << 20

log = logging.getLogger(__name__)
_GZIP_LEVEL = 6
_STALE_AFTER = 24 * 3600.0  # seconds after which a temporary directory is taken as abandoned


@dataclass(frozen=True)
class Progress:
    """How far a prepare run is: ``stage`` is ``"read"`` (input files) or ``"write"`` (rows)."""

    stage: str
    done: int
    total: int
    elapsed: float
    rows: int

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 100.0

    @property
    def rows_per_sec(self) -> float:
        return self.rows / self.elapsed if self.elapsed > 0 else 0.0

    def describe(self) -> str:
        unit = "files" if self.stage == "read" else "rows"
        return (f"prepare {self.stage}: {self.done}/{self.total} {unit} ({self.percent:.1f}%), "
                f"{self.rows} rows, {self.rows_per_sec:,.0f} rows/s")


class _Reporter:
    """Calls the user's progress callback at most every ``every`` seconds (and at the end)."""

    def __init__(self, callback: Callable[[Progress], None] | None, every: float) -> None:
        self.callback, self.every = callback, every
        self.stage, self.start, self.last = "", 0.0, -math.inf

    def __call__(self, stage: str, done: int, total: int, rows: int, final: bool = False) -> None:
        now = time.monotonic()
        if stage != self.stage:  # rows/s of each stage counts from the stage's start
            self.stage, self.start, self.last = stage, now, now
        if self.callback and (final or now - self.last >= self.every):
            self.last = now
            self.callback(Progress(stage, done, total, now - self.start, rows))

    def begin(self, stage: str) -> None:
        self.stage, self.start, self.last = stage, time.monotonic(), time.monotonic()


# -- train/eval split ----------------------------------------------------------------------
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


def _check_split_key(schema: Schema, split_key: str | None) -> None:
    if split_key is None:
        return
    if split_key not in schema:
        raise SchemaError(f"split key column {split_key!r} is not in the input (columns: {', '.join(schema.names)})")
    if schema[split_key].shape:
        raise SchemaError(f"split key column {split_key!r} must hold one value per row, not a vector")


# -- sharding ------------------------------------------------------------------------------
def _mean_record_bytes(block: Block, schema: Schema) -> float:
    sample = np.linspace(0, block.rows - 1, num=min(block.rows, 4096)).astype(np.int64)
    columns = [block.columns[f.name][sample] for f in schema.features]
    return float(record_lengths(schema.features, columns).mean())


def max_shards(rows: int) -> int:
    """The most files a split of ``rows`` rows may have."""
    return max(1, min(MAX_SHARDS, rows // MIN_ROWS_PER_SHARD))


def shard_counts(rows: dict[str, int], record_bytes: float, shards: int | None,
                 target_shard_mb: float | None) -> dict[str, int]:
    """Files per split (``rows``: expected rows per split): ``shards`` for train (eval in
    proportion), or by target size. More train files than :func:`max_shards` allows is
    refused, with the numbers."""
    train_rows = rows["train"]
    limit = max_shards(train_rows)
    rule = f"at least {MIN_ROWS_PER_SHARD} rows each, {MAX_SHARDS:,} files at most"
    target = (target_shard_mb or DEFAULT_TARGET_SHARD_MB) * (1 << 20)
    if shards is not None and shards > limit:
        fewer = " or fewer" if limit > 1 else ""
        raise DataError(
            f"shards={shards:,} is too many for {train_rows:,} train rows (about {train_rows / shards:,.1f} "
            f"rows per file); at most {limit:,} train files are allowed ({rule}): use shards={limit}{fewer}, "
            f"or leave shards out to size files by target_shard_mb (default {DEFAULT_TARGET_SHARD_MB:g} MB)"
        )
    by_size = math.ceil(train_rows * record_bytes / target)
    if shards is None and by_size > limit:
        suggested = math.ceil(train_rows * record_bytes / limit / (1 << 20) * 1000) / 1000
        raise DataError(
            f"target_shard_mb={target / (1 << 20):g} would make {by_size:,} files of {train_rows:,} train rows; "
            f"at most {limit:,} are allowed ({rule}): use target_shard_mb={suggested:g} or more"
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


# -- writing -------------------------------------------------------------------------------
# A ZLIB file is one zlib stream: TensorFlow's reader stops at the end of the first (it reads
# concatenated gzip members, not concatenated zlib streams: the rest of the file would be lost
# without an error). So each group is compressed on its own into deflate blocks that end on a
# byte boundary with no back-references across groups (a full flush), and the shard's file
# gets the zlib header on its first write and, once complete, an empty final block and the
# Adler-32 of everything, combined from the groups' checksums.
_ZLIB_HEADER = b"\x78\x9c"  # deflate, 32 KiB window, default level
_ZLIB_END = b"\x03\x00"  # an empty final block (fixed Huffman codes)
_ADLER_BASE = 65521


@dataclass(frozen=True)
class _DeflatePiece:
    """One group's records as raw deflate blocks, with the Adler-32 and length of the records."""

    data: bytes
    adler: int
    size: int

    def __len__(self) -> int:
        return len(self.data)


def adler32_combine(first: int, second: int, second_size: int) -> int:
    """The Adler-32 of two byte strings joined, from each one's checksum (zlib's adler32_combine)."""
    rem = second_size % _ADLER_BASE
    low = ((first & 0xFFFF) + (second & 0xFFFF) + _ADLER_BASE - 1) % _ADLER_BASE
    high = (rem * (first & 0xFFFF) + (first >> 16) + (second >> 16) + _ADLER_BASE - rem) % _ADLER_BASE
    return low | (high << 16)


def _encode_group(schema: Schema, block: Block, rows: np.ndarray,
                  compression: str | None) -> bytes | np.ndarray | _DeflatePiece:
    """The framed records of ``rows`` of a block (bytes-like): one gzip member, or one
    :class:`_DeflatePiece` of a zlib stream, if asked."""
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
        return _DeflatePiece(packer.compress(raw) + packer.flush(zlib.Z_FULL_FLUSH), zlib.adler32(raw), raw.nbytes)
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


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_fsync_dir = _fsync_file


class ShardWriter:
    """Appends encoded groups to the shard files of every split as they arrive.

    Each split has a fixed number of files; a block's rows are dealt out over them in groups
    (so every file gets rows from all over the input). At most ``_OPEN_FILES`` stay open."""

    def __init__(self, directory: Path, counts: dict[str, int], compression: str | None) -> None:
        self.directory, self.counts, self.compression = directory, counts, compression
        self.examples = {split: [0] * n for split, n in counts.items()}
        self.bytes = {split: [0] * n for split, n in counts.items()}
        self._next = dict.fromkeys(counts, 0)
        self._open: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self._adler: dict[tuple[str, int], int] = {}  # zlib: the Adler-32 of each shard's records so far
        for split in counts:
            directory.joinpath(split).mkdir()

    def deal(self, split: str, rows: np.ndarray, group_rows: int) -> list[tuple[int, np.ndarray]]:
        """(shard, rows) groups of a block's rows of ``split``: over as many shards as the rows
        allow (groups of ``_MIN_GROUP_ROWS`` to ``group_rows`` rows, ``_MAX_GROUPS`` shards unless
        the groups need more), going on from the shard where the last block stopped."""
        count = self.counts[split]
        groups = max(math.ceil(len(rows) / group_rows), min(count, len(rows) // _MIN_GROUP_ROWS, _MAX_GROUPS), 1)
        first = self._next[split]
        self._next[split] = (first + groups) % count
        return [((first + i) % count, part) for i, part in enumerate(np.array_split(rows, groups)) if len(part)]

    def _path(self, split: str, shard: int) -> Path:
        return self.directory / split / shard_name(shard, self.counts[split], self.compression)

    def write(self, split: str, shard: int, rows: int, data: bytes | np.ndarray | _DeflatePiece) -> None:
        handle = self._open.pop((split, shard), None)
        if handle is None:
            if len(self._open) >= _OPEN_FILES:
                self._open.popitem(last=False)[1].close()
            # Kept open across blocks (at most _OPEN_FILES at once); close() and finish() close them.
            handle = open(self._path(split, shard), "ab")  # noqa: SIM115
        self._open[(split, shard)] = handle
        if isinstance(data, _DeflatePiece):
            if (split, shard) not in self._adler:
                self._adler[(split, shard)] = 1  # the Adler-32 of nothing
                self._append(handle, split, shard, _ZLIB_HEADER)
            self._adler[(split, shard)] = adler32_combine(self._adler[(split, shard)], data.adler, data.size)
            data = data.data
        self._append(handle, split, shard, data)
        self.examples[split][shard] += rows

    def _append(self, handle: Any, split: str, shard: int, data: bytes | np.ndarray) -> None:
        handle.write(data)
        self.bytes[split][shard] += len(data)

    def _end_zlib_streams(self) -> None:
        """Close each zlib shard's stream: the final block and the records' Adler-32."""
        for (split, shard), adler in self._adler.items():
            with open(self._path(split, shard), "ab") as handle:
                self._append(handle, split, shard, _ZLIB_END + adler.to_bytes(4, "big"))
        self._adler.clear()

    def close(self) -> None:
        for handle in self._open.values():
            handle.close()
        self._open.clear()

    def finish(self) -> dict[str, Any]:
        """Close, drop files that got no rows, name the rest ``part-i-of-n``, fsync; returns the
        manifest's ``splits``."""
        self.close()
        self._end_zlib_streams()
        manifest: dict[str, Any] = {}
        for split, count in self.counts.items():
            kept = [i for i in range(count) if self.examples[split][i]]
            if not kept:
                shutil.rmtree(self.directory / split)
                continue
            shards = []
            for new, old in enumerate(kept):
                # A shard that got no rows has no file (files open on their first write).
                source = self._path(split, old)
                name = shard_name(new, len(kept), self.compression)
                if source.name != name:  # "-of-n" differs, so no kept file has the new name yet
                    source = source.rename(source.with_name(name))
                _fsync_file(source)
                shards.append({"file": name, "examples": self.examples[split][old], "bytes": self.bytes[split][old]})
            _fsync_dir(self.directory / split)
            manifest[split] = {"examples": sum(s["examples"] for s in shards), "shards": shards}
        return manifest


# -- versions and commit -------------------------------------------------------------------
def existing_versions(root: Path | str, storage_options: StorageOptions | None = None) -> list[int]:
    """Integer versions under ``<output>/<name>`` (a directory, or an object-storage prefix)."""
    if isinstance(root, str):
        return sorted(int(n) for n in object_store.child_directories(root, storage_options) if n.isdigit())
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


def _version_name(version: int | str | None, root: Path | None) -> str:
    if version is None:
        assert root is not None, "the next version is counted under a root"
        versions = existing_versions(root)
        return str(versions[-1] + 1 if versions else 1)
    text = str(version)
    if not text or path_component(text) != text:
        raise DataError(
            f"version {text!r} is not a valid directory name; use letters, digits, '_', '-', '=' or '.' "
            "(an integer such as 3 is recommended)"
        )
    return text


def _make_root(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-test-{uuid.uuid4().hex}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise DataError(
            f"cannot write to the output directory {root}: {exc.strerror or exc}; "
            "choose a writable output directory or fix its permissions"
        ) from None


def _remove_stale_temporaries(root: Path | str, storage_options: StorageOptions | None = None) -> None:
    """Delete temporary directories (or, in object storage, staged uploads) that a killed
    prepare run (SIGKILL, lost node) left behind. Only old ones: a younger one may belong to a
    run still in progress."""
    if isinstance(root, str):
        try:
            for child in object_store.abandoned_children(root, ".tmp-", _STALE_AFTER, storage_options):
                log.info("Deleting %s, staged by a prepare that did not finish", object_store.join(root, child))
                object_store.delete(object_store.join(root, child), storage_options)
        except DataError as exc:  # tidying up must not fail the prepare that does it
            log.warning("Could not delete an abandoned staged upload: %s", exc)
        return
    now = time.time()
    for path in [*root.glob(".tmp-*"), *root.glob(".trash-*")]:
        try:
            if now - path.stat().st_mtime > _STALE_AFTER:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def _rename_into(temporary: Path, final: Path) -> bool:
    """Rename the finished directory to ``final``; False if a version took that name first
    (a committed version is never empty, so rename cannot replace it)."""
    try:
        os.rename(temporary, final)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise
    return True


def _commit(temporary: Path, final: Path, overwrite: bool) -> None:
    if final.exists() and overwrite:
        trash = final.with_name(f".trash-{final.name}-{uuid.uuid4().hex[:8]}")
        os.rename(final, trash)
        os.rename(temporary, final)
        shutil.rmtree(trash, ignore_errors=True)
    elif not _rename_into(temporary, final):
        raise DatasetExistsError(f"dataset version {final} was created while this one was being written")
    _fsync_dir(final.parent)


def _commit_next(temporary: Path, root: Path, first: int, write_marker: Callable[[str], None]) -> str:
    """Commit as the next free integer version. Concurrent runs of one dataset each get their
    own: whoever renames first takes a number, the others move on to the next one."""
    number = first
    while True:
        write_marker(str(number))
        if _rename_into(temporary, root / str(number)):
            _fsync_dir(root)
            return str(number)
        number = max([number, *existing_versions(root)]) + 1


def _check_options(eval_fraction: float, shards: int | None, target_shard_mb: float | None,
                   compression: str | None, workers: int | None) -> str | None:
    if not 0 <= float(eval_fraction) < 1:
        raise DataError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    if shards is not None and not 1 <= int(shards) <= MAX_SHARDS:
        raise DataError(f"shards must be between 1 and {MAX_SHARDS:,}, got {shards}")
    if shards is not None and target_shard_mb is not None:
        raise DataError("give either shards or target_shard_mb, not both")
    if target_shard_mb is not None and float(target_shard_mb) <= 0:
        raise DataError(f"target_shard_mb must be positive, got {target_shard_mb}")
    if workers is not None and int(workers) < 1:
        raise DataError(f"workers must be at least 1, got {workers}")
    if compression in (None, "", "none", "NONE"):
        return None
    if str(compression).lower() not in COMPRESSIONS:
        raise DataError(f"compression {compression!r} is not supported; use 'gzip', 'zlib' or none")
    return str(compression).lower()


def buffer_plan(buffer_mib: float) -> tuple[int, int]:
    """(bytes of input text per read block, encoding tasks in flight) for a memory budget.

    Memory holds about two read blocks (as Arrow data, then as NumPy columns being split and
    encoded) and the encoded groups in flight; the rest of the budget is headroom for
    pyarrow's and NumPy's temporaries (measured: peak RSS stays below the budget)."""
    budget = int(float(buffer_mib) * (1 << 20))
    block = max(256 << 10, min(_MAX_BLOCK_BYTES, budget // 16))
    return block, max(2, min(16, budget // 8 // _chunk_bytes(buffer_mib)))


def _chunk_bytes(buffer_mib: float) -> int:
    """Encoded bytes per encoding task: 4 MiB, less under a small budget (encoding takes
    several times its output in temporaries)."""
    return max(256 << 10, min(_CHUNK_BYTES, int(float(buffer_mib) * (1 << 20)) // 32))


def _write_stream(inputs: Inputs, directory: Path, *, eval_fraction: float, seed: int, split_key: str | None,
                  shards: int | None, target_shard_mb: float | None, compression: str | None, workers: int,
                  in_flight: int, report: Callable[[int, int], None], chunk_bytes: int = _CHUNK_BYTES,
                  require_splits: bool = True,
                  on_train_rows: Callable[[Block, np.ndarray], None] | None = None) -> tuple[dict[str, Any], int]:
    """Encode and write the rows of ``inputs`` block by block into shard files under
    ``directory``; returns the manifest's ``splits`` and the number of rows. Without
    ``require_splits`` (one part of several) a split, or all, may end up empty.
    ``on_train_rows(block, rows)`` sees each block's training rows (vocabularies count them)."""
    schema = inputs.schema
    keys = {path: file_key(path, seed) for path in inputs.paths}
    state: dict[str, Any] = {"rows": 0, "expected": inputs.estimated_rows}

    def tasks() -> Iterator[tuple[Any, Callable[[], Any]]]:
        writer = None
        for block in inputs.blocks():
            if writer is None:  # the first block sizes the records and so the number of files
                record_bytes = _mean_record_bytes(block, schema)
                expected = max(inputs.estimated_rows, block.rows)
                train = max(1, round(expected * (1 - eval_fraction)))
                expected_rows = {"train": train, "eval": expected - train} if eval_fraction > 0 else {"train": train}
                counts = shard_counts(expected_rows, record_bytes, shards, target_shard_mb)
                writer = state["writer"] = ShardWriter(directory, counts, compression)
                group_rows = int(min(65536, max(_MIN_GROUP_ROWS, chunk_bytes // max(record_bytes, 1))))
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
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="airflow-tf-encode") as pool:
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


def prepare_dataset(  # noqa: PLR0917  the public signature of 0.1.0 (positional calls keep working)
    input: str | os.PathLike | Sequence[str | os.PathLike],
    output: str | os.PathLike,
    name: str,
    version: int | str | None = None,
    label: str | None = None,
    eval_fraction: float = DEFAULT_EVAL_FRACTION,
    shards: int | None = None,
    target_shard_mb: float | None = None,
    compression: str | None = None,
    schema: Schema | dict | str | os.PathLike | None = None,
    string_columns: str | Sequence[str] | None = None,
    seed: int = 0,
    split_key: str | None = None,
    overwrite: bool = False,
    allow_nan: bool = False,
    workers: int | None = None,
    progress: Callable[[Progress], None] | None = None,
    progress_every: float = 5.0,
    buffer_mib: float = DEFAULT_BUFFER_MIB,
    cache: bool = False,
    partition_key: str | None = None,
    vocabularies: Mapping[str, int] | Sequence[str] | str | None = None,
    storage_options: StorageOptions | None = None,
) -> dict[str, Any]:
    """Convert CSV/Parquet/.npz files into a sharded TFRecord dataset version, streaming.

    Rows are read, checked, split, encoded and written a block at a time: memory follows
    ``buffer_mib`` (default 512 MiB), not the size of the input. A row goes to eval when a
    hash of (input file name, row number, seed), or of its ``split_key`` value, falls below
    ``eval_fraction``: the split is deterministic and the eval share is ``eval_fraction`` of
    the rows up to sampling noise. Without ``version`` the dataset becomes the next integer
    version, decided when it is committed, so concurrent runs of one dataset each commit a
    version of their own. ``string_columns`` names CSV columns to read as text (an inferred
    numeric column with a value that does not parse is an error). Returns a summary:
    ``dataset_uri`` (the version directory), ``name``, ``version``, ``counts`` and ``shards``
    per split, ``compression``, ``schema`` (as a dict), ``rows``, ``seconds`` and
    ``rows_per_sec``. Raises a :class:`DataError` naming the file, line and column of bad
    input; nothing is committed then.

    With ``cache=True`` (and no ``version``) the input's content and the options are
    fingerprinted first (one extra read of the input) and recorded in ``_SUCCESS``; when a
    committed version has the same fingerprint it is returned as it is (``"cached": True``)
    and nothing is encoded.

    ``partition_key`` (e.g. a day, ``"2026-11-20"``) makes this version the data of one
    partition: it is named by the key unless ``version`` is given, and recorded in
    ``_SUCCESS`` so that :func:`~airflow_tf.data.window.make_window` can join the last N.

    ``vocabularies`` (``{"user": 100000}``, or column names for the default size) counts those
    columns' values over the training rows and keeps each one's top K in the version, for the
    model to read as ``schema.vocabulary("user")`` (see :mod:`airflow_tf.data.vocabulary`).

    ``input`` and ``output`` may be ``s3://`` or ``gs://`` URIs (``storage_options``: per
    scheme, pyarrow's file system options, e.g. credentials; see
    :mod:`airflow_tf.data.object_store`). Inputs are streamed from the store; a version in
    object storage is written in a local staging directory and then uploaded, ``_SUCCESS`` last."""
    started = time.monotonic()
    compression = _check_options(eval_fraction, shards, target_shard_mb, compression, workers)
    _check_budget_and_name(buffer_mib, name)
    declared = Schema.coerce(schema) if schema is not None else None
    if partition_key is not None:
        partition_key = str(partition_key)
        version = path_component(partition_key) if version is None else version
    fingerprint = None
    if cache and version is None:
        fingerprint = input_fingerprint(input, _fingerprint_options(
            label=label, eval_fraction=eval_fraction, shards=shards, target_shard_mb=target_shard_mb,
            compression=compression, declared=declared, string_columns=string_columns, seed=seed,
            split_key=split_key, allow_nan=allow_nan, vocabularies=vocabularies), storage_options)
    if is_remote(output):
        object_store.check_location(output, "output")
        stage = functools.partial(
            prepare_dataset, input, label=label, eval_fraction=eval_fraction, shards=shards,
            target_shard_mb=target_shard_mb, compression=compression, schema=declared, string_columns=string_columns,
            seed=seed, split_key=split_key, allow_nan=allow_nan, workers=workers, progress=progress,
            progress_every=progress_every, buffer_mib=buffer_mib, partition_key=partition_key,
            vocabularies=vocabularies, storage_options=storage_options)
        return _prepare_into_object_storage(os.fspath(output), str(name), version, overwrite=overwrite,
                                            fingerprint=fingerprint, storage_options=storage_options,
                                            stage=stage, started=started)
    root = Path(strip_file_scheme(output)) / path_component(str(name))
    version_name = _version_name(version, root)
    final = root / version_name
    _refuse_existing(final, version, overwrite)
    reporter = _Reporter(progress, progress_every)
    block_bytes, in_flight = buffer_plan(buffer_mib)
    reused = _reuse_cached(root, str(name), fingerprint, started) if fingerprint else None
    if reused is not None:
        return reused

    reporter.begin("read")
    inputs = open_inputs(input, declared, allow_nan, string_columns or (), block_bytes=block_bytes,
                         on_file=lambda done, total: reporter("read", done, total, 0, done == total),
                         storage_options=storage_options)
    inputs.schema = _with_label(inputs.schema, label)
    _check_split_key(inputs.schema, split_key)
    counter = VocabularyCounter(vocabulary_sizes(vocabularies, inputs.schema))

    _make_root(root)
    _remove_stale_temporaries(root)
    temporary = root / f".tmp-{version_name}-{uuid.uuid4().hex[:12]}"
    reporter.begin("write")
    try:
        temporary.mkdir()
        manifest_splits, total = _write_stream(
            inputs, temporary, eval_fraction=float(eval_fraction), seed=int(seed), split_key=split_key,
            shards=shards, target_shard_mb=target_shard_mb, compression=compression,
            workers=int(workers or usable_cpus()), in_flight=in_flight, chunk_bytes=_chunk_bytes(buffer_mib),
            report=lambda done, expected: reporter("write", done, expected, done),
            on_train_rows=(lambda block, rows: counter.update(block.columns, rows)) if counter.sizes else None,
        )
        reporter("write", total, total, total, final=True)
        inputs.schema = _with_vocabularies(inputs.schema, counter, temporary)
        write_json(temporary / SCHEMA_FILE, inputs.schema.to_dict())
        manifest = {
            "format_version": FORMAT_VERSION,
            "name": str(name),
            "version": version_name,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "compression": compression,
            "splits": manifest_splits,
            "split": {"eval_fraction": float(eval_fraction), "seed": int(seed), "split_key": split_key},
            "source": {"files": [str(p) for p in inputs.paths], "rows": total},
            **_optional_entries(fingerprint, partition_key),
        }
        version_name = _commit_version(temporary, root, version_name, manifest, explicit=version is not None,
                                       overwrite=overwrite)
        final = root / version_name
    except OSError as exc:
        raise DataError(f"writing dataset {final} failed: {exc}") from None
    finally:
        if temporary.exists():
            shutil.rmtree(temporary, ignore_errors=True)
    seconds = time.monotonic() - started
    return {
        "dataset_uri": str(final.resolve()),
        "name": str(name),
        "version": version_name,
        "counts": {split: info["examples"] for split, info in manifest_splits.items()},
        "shards": {split: len(info["shards"]) for split, info in manifest_splits.items()},
        "compression": compression,
        "schema": inputs.schema.to_dict(),
        "rows": total,
        "seconds": round(seconds, 3),
        "rows_per_sec": _rate(total, seconds),
        "cached": False,
        **_optional_entries(fingerprint, partition_key),
    }


def _fingerprint_options(*, label: str | None, eval_fraction: float, shards: int | None,
                         target_shard_mb: float | None, compression: str | None, declared: Schema | None,
                         string_columns: str | Sequence[str] | None, seed: int, split_key: str | None,
                         allow_nan: bool, vocabularies: Any) -> dict[str, Any]:
    """The options that shape a version's content, as the fingerprint records them."""
    return {
        "label": label, "eval_fraction": float(eval_fraction), "shards": shards,
        "target_shard_mb": target_shard_mb, "compression": compression,
        "schema": declared.to_dict() if declared else None, "string_columns": sorted(string_columns or ()),
        "seed": int(seed), "split_key": split_key, "allow_nan": bool(allow_nan),
        "vocabularies": vocabularies,
    }


def _refuse_existing(final: Path, version: int | str | None, overwrite: bool) -> None:
    if version is not None and final.exists() and not overwrite:
        raise DatasetExistsError(
            f"dataset version {final} already exists; choose another version, leave the version "
            "out to get the next one, or ask to overwrite it"
        )


def _optional_entries(fingerprint: str | None, partition_key: str | None) -> dict[str, Any]:
    """The manifest's and summary's entries that only some versions have."""
    return {**({"fingerprint": fingerprint} if fingerprint else {}),
            **({"partition": partition_key} if partition_key is not None else {})}


def _rate(rows: int, seconds: float) -> float | None:
    return round(rows / seconds, 1) if seconds > 0 else None


def _commit_version(temporary: Path, root: Path, version_name: str, manifest: dict[str, Any], *,
                    explicit: bool, overwrite: bool) -> str:
    """Write ``_SUCCESS`` last and rename the finished directory into place: as the asked
    version, or as the next free integer one. Returns the version committed."""
    def write_marker(committed_as: str) -> None:  # last: marks the dataset complete
        manifest["version"] = committed_as
        write_json(temporary / SUCCESS_FILE, manifest)
        _fsync_dir(temporary)

    if not explicit:
        return _commit_next(temporary, root, int(version_name), write_marker)
    write_marker(version_name)
    _commit(temporary, root / version_name, overwrite)
    return version_name


def _check_budget_and_name(buffer_mib: float, name: str) -> None:
    if not float(buffer_mib) >= 1:
        raise DataError(f"buffer_mib must be at least 1 (MiB of buffered rows), got {buffer_mib}")
    if not name or not str(name).strip():
        raise DataError("a dataset name is required")


def _reuse_cached(root: Path | str, name: str, fingerprint: str, started: float,
                  storage_options: StorageOptions | None = None) -> dict[str, Any] | None:
    """The summary of the committed version with this fingerprint (logged as reused), or None."""
    cached = find_cached(root, fingerprint, storage_options)
    if cached is None:
        return None
    log.info("Input of dataset %r unchanged (fingerprint %s): reusing version %s, nothing encoded",
             name, fingerprint, cached["version"])
    return _cached_summary(root, cached, started, storage_options)


def _prepare_into_object_storage(output: str, name: str, version: int | str | None, *, overwrite: bool,
                                 fingerprint: str | None, storage_options: StorageOptions | None,
                                 stage: Callable[..., dict[str, Any]], started: float) -> dict[str, Any]:
    """A version in ``s3://``/``gs://``: prepared by ``stage`` (:func:`prepare_dataset` with the
    other options) into a local staging directory, then uploaded with ``_SUCCESS`` last. A
    store has no rename: the marker is the commit, and readers refuse a version without it."""
    root = object_store.join(output, path_component(name))
    if fingerprint:
        reused = _reuse_cached(root, name, fingerprint, started, storage_options)
        if reused is not None:
            return reused
    versions = existing_versions(root, storage_options)
    version_name = str(versions[-1] + 1 if versions else 1) if version is None else _version_name(version, None)
    final = object_store.join(root, version_name)
    if object_store.exists(final, storage_options) and not overwrite:
        raise DatasetExistsError(
            f"dataset version {final} already exists; choose another version, leave the version "
            "out to get the next one, or ask to overwrite it"
        )
    _remove_stale_temporaries(root, storage_options)
    staging = Path(tempfile.mkdtemp(prefix="airflow-tf-stage-"))
    try:
        summary = stage(staging, name, version=version_name)
        local = Path(summary["dataset_uri"])
        if fingerprint:  # the staged run had nothing to compare with: the manifest records it here
            manifest = json.loads((local / SUCCESS_FILE).read_text(encoding="utf-8"))
            write_json(local / SUCCESS_FILE, {**manifest, "fingerprint": fingerprint})
        replacing = overwrite and object_store.exists(final, storage_options)
        # The version being replaced stays whole until the new one is in the store: it is
        # uploaded beside it (a name no reader takes for a version), then copied in there.
        target = object_store.join(root, f".tmp-{version_name}-{uuid.uuid4().hex[:12]}") if replacing else final
        size = sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
        log.info("Uploading dataset version %s (%.1f MB) to %s", version_name, size / 1e6, target)
        try:
            uploaded = sum(1 for _ in object_store.upload_tree(local, target, storage_options, last=SUCCESS_FILE))
        except DataError as exc:
            left = _remove_partial_upload(target, storage_options)
            raise DataError(f"{exc}; {left}" + (f"; {final} is as it was" if replacing else "")) from None
        if replacing:
            _replace_version(target, final, storage_options)
        log.info("Uploaded %d files; %s is committed", uploaded, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    seconds = time.monotonic() - started
    return {**summary, "dataset_uri": final, "seconds": round(seconds, 3), "rows_per_sec": _rate(summary["rows"], seconds),
            **({"fingerprint": fingerprint} if fingerprint else {})}


def _replace_version(staged: str, final: str, storage_options: StorageOptions | None) -> None:
    """Swap an uploaded version in for the one at ``final``: delete that (``_SUCCESS`` first),
    copy the staged objects in (``_SUCCESS`` last), then delete the staged ones."""
    object_store.delete(final, storage_options)
    try:
        object_store.copy_tree(staged, final, storage_options, last=SUCCESS_FILE)
    except DataError as exc:
        raise DataError(f"{exc}; the new version is complete under {staged}: prepare again with overwrite, "
                        f"or copy it to {final} (_SUCCESS last)") from None
    object_store.delete(staged, storage_options)


def _remove_partial_upload(final: str, storage_options: StorageOptions | None) -> str:
    """Delete what a failed upload wrote (it has no ``_SUCCESS``, so no reader takes it, but it
    would hold the version number); says what is left."""
    try:
        object_store.delete(final, storage_options)
    except DataError:
        return (f"the files uploaded so far are still under {final} without _SUCCESS (readers refuse them): "
                "delete them, or prepare that version again with overwrite")
    return f"nothing is left under {final}; prepare again"


def _with_vocabularies(schema: Schema, counter: VocabularyCounter, directory: Path) -> Schema:
    """The schema recording the vocabularies ``counter`` counted, written into ``directory``."""
    if not counter.sizes:
        return schema
    kept = counter.write(directory)
    for column, info in kept.items():
        log.info("Vocabulary of %r: %d of %d distinct values kept (top %d)", column, info["size"],
                 info["distinct"], info["top_k"])
    return dataclasses.replace(schema, vocabularies=kept)


def input_fingerprint(inputs: Any, options: dict[str, Any], storage_options: StorageOptions | None = None) -> str:
    """A hash of the input files' names and contents (read in chunks) and of the options that
    shape the output: equal fingerprints give equal datasets."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(json.dumps({"format_version": FORMAT_VERSION, **options}, sort_keys=True, default=str).encode())
    for path in resolve_inputs(inputs, storage_options):
        digest.update(f"\0{identity(path)}\0{path.stat().st_size}\0".encode())
        with open_binary(path) as handle:
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _read_text(root: Path | str, *parts: str, storage_options: StorageOptions | None = None) -> str:
    """A file of a dataset's directory, local or in object storage."""
    if isinstance(root, str):
        return object_store.read_text(object_store.join(root, *parts), storage_options)
    return root.joinpath(*parts).read_text(encoding="utf-8")


def find_cached(root: Path | str, fingerprint: str,
                storage_options: StorageOptions | None = None) -> dict[str, Any] | None:
    """The newest committed version of the dataset made from the same input and options."""
    for version in reversed(existing_versions(root, storage_options)):
        try:
            manifest = json.loads(_read_text(root, str(version), SUCCESS_FILE, storage_options=storage_options))
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and manifest.get("fingerprint") == fingerprint:
            return manifest
    return None


def _cached_summary(root: Path | str, manifest: dict[str, Any], started: float,
                    storage_options: StorageOptions | None = None) -> dict[str, Any]:
    version = str(manifest["version"])
    final = object_store.join(root, version) if isinstance(root, str) else str((root / version).resolve())
    splits = manifest["splits"]
    return {
        "dataset_uri": final, "name": manifest["name"], "version": version,
        "counts": {split: info["examples"] for split, info in splits.items()},
        "shards": {split: len(info["shards"]) for split, info in splits.items()},
        "compression": manifest.get("compression"),
        "schema": json.loads(_read_text(root, version, SCHEMA_FILE, storage_options=storage_options)),
        "rows": manifest["source"]["rows"], "seconds": round(time.monotonic() - started, 3), "rows_per_sec": None,
        "cached": True, "fingerprint": manifest["fingerprint"],
    }


def _with_label(schema: Schema, label: str | None) -> Schema:
    if label is None:
        return schema
    if label not in schema:
        raise SchemaError(f"label column {label!r} is not in the input (columns: {', '.join(schema.names)})")
    if schema.label_name not in (None, label):
        raise SchemaError(
            f"label {label!r} differs from the declared schema's label {schema.label_name!r}; give one of them"
        )
    return schema.with_label(label)
