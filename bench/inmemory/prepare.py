"""Raw files -> a committed TFRecord dataset version.

``<output>/<name>/<version>/{train,eval}/part-NNNNN-of-MMMMM.tfrecord[.gz]``, ``schema.json``
and ``_SUCCESS`` (counts per split and per shard). Everything is written into a hidden
temporary directory beside the final one and renamed into place at the end, so a reader
never sees a partial dataset; ``_SUCCESS`` is the last file written."""

from __future__ import annotations

import errno
import hashlib
import math
import os
import shutil
import time
import uuid
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from airflow_tf.cluster.names import path_component
from airflow_tf.files import strip_file_scheme, write_json
from airflow_tf.data.encode import encode_examples, record_lengths
from airflow_tf.data.errors import DataError, DatasetExistsError, InputDataError, SchemaError
from .inputs import Table, read_table
from airflow_tf.data.schema import FORMAT_VERSION, SCHEMA_FILE, SUCCESS_FILE, Schema

DEFAULT_EVAL_FRACTION = 0.2
DEFAULT_TARGET_SHARD_MB = 128.0
MIN_ROWS_PER_SHARD = 100  # fewer rows per file only add per-file overhead for every reader
MAX_SHARDS = 10_000
COMPRESSIONS = ("gzip",)
_CHUNK_BYTES = 4 << 20  # encoded bytes per task: large enough for NumPy, small enough to stream
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


def split_rows(table: Table, eval_fraction: float, seed: int, split_key: str | None) -> dict[str, np.ndarray]:
    """Row indices of each split, in the (shuffled) order they are written.

    Without ``split_key`` exactly ``round(rows * eval_fraction)`` random rows go to eval; with
    it, a row goes to eval when the hash of its key falls below ``eval_fraction``, so a key
    stays in the same split whatever else the input holds."""
    n = table.num_rows
    order = np.random.default_rng(seed).permutation(n)
    if split_key is not None:
        if split_key not in table.columns:
            raise SchemaError(
                f"split key column {split_key!r} is not in the input (columns: {', '.join(table.columns)})"
            )
        if table.columns[split_key].ndim != 1:
            raise SchemaError(f"split key column {split_key!r} must hold one value per row, not a vector")
        is_eval = _key_fractions(table.columns[split_key], seed) < eval_fraction
        if eval_fraction > 0 and not is_eval.any():
            raise InputDataError(
                f"no row's {split_key!r} key hashed into the eval split ({n} rows, eval fraction "
                f"{eval_fraction}); use more distinct keys, a larger eval fraction, or another seed"
            )
        in_order = is_eval[order]
        splits = {"train": order[~in_order], "eval": order[in_order]}
    else:
        n_eval = 0 if eval_fraction == 0 else max(1, int(round(n * eval_fraction)))
        splits = {"train": order[n_eval:], "eval": order[:n_eval]}
    if len(splits["train"]) == 0:
        raise InputDataError(
            f"no rows left for training: {n} input rows with eval fraction {eval_fraction}; "
            "add rows or lower the eval fraction"
        )
    if len(splits["eval"]) == 0:
        del splits["eval"]
    return splits


# -- sharding ------------------------------------------------------------------------------
def _mean_record_bytes(table: Table) -> float:
    sample = np.linspace(0, table.num_rows - 1, num=min(table.num_rows, 4096)).astype(np.int64)
    columns = [table.columns[f.name][sample] for f in table.schema.features]
    return float(record_lengths(table.schema.features, columns).mean())


def max_shards(rows: int) -> int:
    """The most files a split of ``rows`` rows may have."""
    return max(1, min(MAX_SHARDS, rows // MIN_ROWS_PER_SHARD))


def shard_counts(splits: dict[str, np.ndarray], record_bytes: float, shards: int | None,
                 target_shard_mb: float | None) -> dict[str, int]:
    """Files per split: ``shards`` for train (eval in proportion), or by target size.

    More train files than :func:`max_shards` allows is refused, with the numbers."""
    train_rows = len(splits["train"])
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
    for split, rows in splits.items():
        if shards is not None:
            wanted = shards if split == "train" else math.ceil(shards * len(rows) / train_rows)
        else:
            wanted = math.ceil(len(rows) * record_bytes / target)
        counts[split] = max(1, min(int(wanted), max_shards(len(rows))))
    return counts


def shard_name(index: int, count: int, compression: str | None) -> str:
    return f"part-{index:05d}-of-{count:05d}.tfrecord" + (".gz" if compression == "gzip" else "")


# -- writing -------------------------------------------------------------------------------
def _encode_chunk(table: Table, rows: np.ndarray, compression: str | None) -> bytes | np.ndarray:
    """The framed records of ``rows`` (bytes-like), compressed as one gzip member if asked."""
    columns = [table.columns[f.name][rows] for f in table.schema.features]
    # The rows come in a seeded random order. Inside this block, rows with the same byte
    # layout are written together (each group keeping that order): it saves a copy of every
    # byte, and readers shuffle across blocks and files anyway.
    data = encode_examples(table.schema.features, columns, keep_order=False)
    if compression == "gzip":
        # Each chunk is a complete gzip member; a file of concatenated members is valid gzip.
        packer = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31)
        data = packer.compress(data) + packer.flush()
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


def _fsync_close(handle) -> None:
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()


def write_splits(table: Table, splits: dict[str, np.ndarray], counts: dict[str, int], directory: Path,
                 compression: str | None, workers: int, record_bytes: float,
                 report: Callable[[int], None]) -> dict[str, Any]:
    """Encode and write every shard of every split; returns the manifest's ``splits``."""
    chunk_rows = int(min(65536, max(256, _CHUNK_BYTES // max(record_bytes, 1))))
    plan = []  # (split, shard index, rows)
    for split, rows in splits.items():
        directory.joinpath(split).mkdir()
        for index, shard_rows in enumerate(np.array_split(rows, counts[split])):
            plan.append((split, index, shard_rows))

    def tasks():
        for split, index, shard_rows in plan:
            starts = range(0, len(shard_rows), chunk_rows)
            for n, start in enumerate(starts):
                chunk = shard_rows[start:start + chunk_rows]
                last = n == len(starts) - 1
                yield (split, index, len(chunk), last), (lambda c=chunk: _encode_chunk(table, c, compression))

    manifest: dict[str, Any] = {split: {"examples": int(len(rows)), "shards": []} for split, rows in splits.items()}
    done = 0
    handle = None
    written = 0
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="airflow-tf-encode") as pool:
        try:
            for (split, index, n_rows, last), data in _ordered(pool, tasks(), depth=2 * workers):
                if handle is None:
                    name = shard_name(index, counts[split], compression)
                    handle = open(directory / split / name, "wb")
                    shard_examples, written = 0, 0
                handle.write(data)
                shard_examples += n_rows
                written += len(data)
                done += n_rows
                report(done)
                if last:
                    _fsync_close(handle)
                    handle = None
                    manifest[split]["shards"].append({"file": name, "examples": shard_examples, "bytes": written})
        finally:
            if handle is not None:
                handle.close()
    return manifest


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- versions and commit -------------------------------------------------------------------
def existing_versions(root: Path) -> list[int]:
    """Committed integer versions under ``<output>/<name>``."""
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


def _version_name(version: int | str | None, root: Path) -> str:
    if version is None:
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


def _remove_stale_temporaries(root: Path, max_age: float = _STALE_AFTER) -> None:
    """Delete temporary directories that a killed prepare run (SIGKILL, lost node) left behind.
    Only old ones: a younger one may belong to a run still in progress."""
    now = time.time()
    for path in [*root.glob(".tmp-*"), *root.glob(".trash-*")]:
        try:
            if now - path.stat().st_mtime > max_age:
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
        raise DataError(f"compression {compression!r} is not supported; use 'gzip' or none")
    return str(compression).lower()


def prepare_dataset(
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
) -> dict[str, Any]:
    """Convert CSV/Parquet/.npz files into a sharded TFRecord dataset version.

    Without ``version`` the dataset becomes the next integer version, decided when it is
    committed, so concurrent runs of one dataset each commit a version of their own.
    ``string_columns`` names CSV columns to read as text (an inferred numeric column with a
    value that does not parse is an error). Returns a summary: ``dataset_uri`` (the version
    directory), ``name``, ``version``, ``counts`` and ``shards`` per split, ``compression``,
    ``schema`` (as a dict), ``rows``, ``seconds`` and ``rows_per_sec``. Raises a
    :class:`DataError` naming the file, line and column of bad input, before anything is
    committed."""
    started = time.monotonic()
    compression = _check_options(eval_fraction, shards, target_shard_mb, compression, workers)
    if not name or not str(name).strip():
        raise DataError("a dataset name is required")
    declared = Schema.coerce(schema) if schema is not None else None
    root = Path(strip_file_scheme(output)) / path_component(str(name))
    version_name = _version_name(version, root)
    final = root / version_name
    if version is not None and final.exists() and not overwrite:
        raise DatasetExistsError(
            f"dataset version {final} already exists; choose another version, leave the version "
            "out to get the next one, or ask to overwrite it"
        )
    reporter = _Reporter(progress, progress_every)

    reporter.begin("read")
    table = read_table(input, declared, allow_nan,
                       on_file=lambda done, total, rows: reporter("read", done, total, rows, done == total),
                       string_columns=string_columns or ())
    if label is not None:
        if label not in table.schema:
            raise SchemaError(
                f"label column {label!r} is not in the input (columns: {', '.join(table.schema.names)})"
            )
        if table.schema.label_name not in (None, label):
            raise SchemaError(
                f"label {label!r} differs from the declared schema's label {table.schema.label_name!r}; "
                "give one of them"
            )
        table.schema = table.schema.with_label(label)
    splits = split_rows(table, float(eval_fraction), int(seed), split_key)
    record_bytes = _mean_record_bytes(table)
    counts = shard_counts(splits, record_bytes, shards, target_shard_mb)

    _make_root(root)
    _remove_stale_temporaries(root)
    temporary = root / f".tmp-{version_name}-{uuid.uuid4().hex[:12]}"
    total = table.num_rows
    reporter.begin("write")
    try:
        temporary.mkdir()
        manifest_splits = write_splits(
            table, splits, counts, temporary, compression, int(workers or os.cpu_count() or 1), record_bytes,
            report=lambda done: reporter("write", done, total, done, done == total),
        )
        write_json(temporary / SCHEMA_FILE, table.schema.to_dict())
        manifest = {
            "format_version": FORMAT_VERSION,
            "name": str(name),
            "version": version_name,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "compression": compression,
            "splits": manifest_splits,
            "split": {"eval_fraction": float(eval_fraction), "seed": int(seed), "split_key": split_key},
            "source": {"files": [str(s.path) for s in table.sources], "rows": total},
        }

        def write_marker(committed_as: str) -> None:  # last: marks the dataset complete
            manifest["version"] = committed_as
            write_json(temporary / SUCCESS_FILE, manifest)
            _fsync_dir(temporary)

        if version is None:
            version_name = _commit_next(temporary, root, int(version_name), write_marker)
            final = root / version_name
        else:
            write_marker(version_name)
            _commit(temporary, final, overwrite)
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
        "schema": table.schema.to_dict(),
        "rows": total,
        "seconds": round(seconds, 3),
        "rows_per_sec": round(total / seconds, 1) if seconds > 0 else None,
    }
