"""Opening the raw input (CSV, Parquet, NumPy ``.npz``) as a stream of blocks of typed NumPy columns:
the input files found, a reader per file by its format, the schema decided, each block converted.

Files are read a block at a time (pyarrow's streaming CSV reader, Parquet batches, the
arrays of an ``.npz`` from their zip members: one module per format), so memory follows the
block size, not the input. Every value is checked before it is handed on: a bad value is reported with the
file, the line (CSV) or row (Parquet, .npz), and the column, plus what to do about it."""

from __future__ import annotations

import functools
import glob as globlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from airflow_tf.files import strip_file_scheme

from .convert import convert
from .cpus import usable_cpus
from .csv_reader import CsvReader
from .errors import InputDataError, SchemaError
from .npz_reader import NpzReader
from .options import column_names
from .object_store import InputPath, StorageOptions, check_location, is_remote, resolve_remote
from .parquet_reader import ParquetReader
from .raw import FileReader, Raw
from .schema import FeatureSpec, Schema

CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".tsv")
PARQUET_SUFFIXES = (".parquet", ".pq")
NPZ_SUFFIXES = (".npz",)
SUPPORTED = CSV_SUFFIXES + PARQUET_SUFFIXES + NPZ_SUFFIXES


def _kind(path: InputPath) -> str:
    name = path.name.lower()
    if name.endswith(CSV_SUFFIXES):
        return "csv"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(NPZ_SUFFIXES):
        return "npz"
    raise InputDataError(
        f"input file {path} has an unsupported type; use {', '.join(SUPPORTED)} files"
    )


_READERS: dict[str, type[FileReader]] = {"csv": CsvReader, "parquet": ParquetReader, "npz": NpzReader}


def _open_file(path: InputPath, declared: Schema | None, string_columns: Sequence[str], block_bytes: int,
               read_ahead: bool = True) -> FileReader:
    """The reader of ``path``'s format, its first block read."""
    return _READERS[_kind(path)](path, declared, string_columns, block_bytes, read_ahead)


def resolve_inputs(inputs: str | os.PathLike | Sequence[str | os.PathLike],
                   storage_options: StorageOptions | None = None) -> list[InputPath]:
    """Input files from a path, a directory, a glob, or a list of those (sorted, deduplicated);
    ``s3://`` and ``gs://`` URIs are listed through ``pyarrow.fs`` (``storage_options``: see
    :mod:`airflow_tf.data.object_store`)."""
    items = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    if not items:
        raise InputDataError("no input given; pass a file, a directory or a glob such as 'data/*.csv'")
    files: list[InputPath] = []
    for item in items:
        text = strip_file_scheme(item)
        check_location(text, "input")
        if is_remote(text):
            files += resolve_remote(text, storage_options, SUPPORTED)
        elif any(ch in text for ch in "*?["):
            matches = sorted(globlib.glob(text, recursive=True))
            matched = [Path(m) for m in matches if Path(m).is_file()]
            if not matched:
                raise InputDataError(f"input glob {text!r} matches no files; check the path and pattern")
            files += matched
        elif Path(text).is_dir():
            inside = sorted(p for p in Path(text).iterdir() if p.is_file() and p.name.lower().endswith(SUPPORTED))
            if not inside:
                raise InputDataError(f"input directory {text} holds no {', '.join(SUPPORTED)} files")
            files += inside
        elif Path(text).is_file():
            files.append(Path(text))
        else:
            raise InputDataError(f"input {text} does not exist; check the path")
    unique = list(dict.fromkeys(files))
    for path in unique:
        _kind(path)
        if path.stat().st_size == 0:
            raise InputDataError(f"input file {path} is empty; remove it or fill it with data")
    return unique


def _widen(a: str, b: str) -> str:
    """The dtype holding values of both: int64 and float32 give float32; text wins otherwise."""
    if a == b:
        return a
    return "float32" if {a, b} == {"int64", "float32"} else "string"


def _infer(raws: Sequence[Raw | FileReader], allow_nan: bool, string_columns: Sequence[str]) -> Schema:
    """The schema from each file's columns (CSV: types of its first block), widened across files."""
    first = raws[0]
    names = list(first.columns)
    for raw in raws[1:]:
        if list(raw.columns) != names and set(raw.columns) != set(names):
            missing = sorted(set(names) - set(raw.columns))
            extra = sorted(set(raw.columns) - set(names))
            raise InputDataError(
                f"{raw.path} has different columns than {first.path}"
                + (f"; missing: {missing}" if missing else "") + (f"; extra: {extra}" if extra else "")
                + "; all input files need the same columns"
            )
    features = []
    for name in names:
        dtype = first.dtypes[name]
        shape = first.shapes[name]
        for raw in raws[1:]:
            other = raw.dtypes[name]
            if raw.shapes[name] != shape:
                raise InputDataError(
                    f"column {name!r} has {list(shape)} values per row in {first.path} but "
                    f"{list(raw.shapes[name])} in {raw.path}; all files need the same shape"
                )
            widened = _widen(dtype, other)
            if widened == "string" and dtype != other:
                raise InputDataError(
                    f"column {name!r} is {dtype} in {first.path} but {other} in {raw.path}; "
                    "fix the data or declare the column's dtype with a schema"
                )
            dtype = widened
        if name in string_columns:
            dtype = "string"
        features.append(FeatureSpec(name, dtype, shape, allow_nan=allow_nan and dtype == "float32"))
    return Schema(tuple(features))


def _check_declared(raws: Sequence[Raw | FileReader], declared: Schema) -> None:
    for raw in raws:
        missing = [n for n in declared.names if n not in raw.columns]
        if missing:
            raise SchemaError(
                f"the declared schema has features {missing} that {raw.path} does not have "
                f"(its columns: {', '.join(raw.columns)}); fix the schema or the input"
            )
        extra = [n for n in raw.columns if n not in declared]
        if extra:
            raise SchemaError(
                f"{raw.path} has columns {extra} that the declared schema does not list; "
                "add them to the schema or remove them from the input"
            )


@dataclass
class Block:
    """Consecutive rows of one input file, converted to the schema's dtypes."""

    path: InputPath
    start: int  # index of the block's first row in its file (from 0)
    columns: dict[str, np.ndarray]  # one array per feature, schema order

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values())))


class Inputs:
    """The input files, opened: :attr:`schema` is known (declared, or inferred from the first
    block of every file) before any row is converted; :meth:`blocks` then streams them."""

    def __init__(self, paths: list[InputPath], readers: list[FileReader], schema: Schema) -> None:
        self.paths, self._readers, self.schema = paths, readers, schema

    @property
    def estimated_rows(self) -> int:
        """Rows in all files: exact for Parquet and .npz, from the first block's size for CSV."""
        return sum(r.estimated_rows for r in self._readers)

    def blocks(self) -> Iterator[Block]:
        for reader in self._readers:
            for raw in reader.blocks():
                yield Block(raw.path, raw.start, {spec.name: convert(raw, spec) for spec in self.schema.features})


def open_inputs(  # noqa: PLR0917  public signature: callers pass these positionally
    inputs: str | os.PathLike | Sequence[str | os.PathLike],
    declared: Schema | None = None,
    allow_nan: bool = False,
    string_columns: Sequence[str] = (),
    block_bytes: int = 16 << 20,
    keep_bytes: int | None = None,
    on_file: Callable[[int, int], None] | None = None,
    storage_options: StorageOptions | None = None,
    schema_only: bool = False,
) -> Inputs:
    """Open and check every input file; the columns follow the declared schema or are inferred.

    An inferred CSV column is numeric when its values in the file's first block (``block_bytes``
    of text) are numbers; a value that is not, in that block or a later one, stops the read with
    its file, line and column. ``string_columns`` names the columns to read as text instead (CSV
    values kept verbatim, e.g. zip codes with leading zeros). The first block of each file is
    kept for the stream while they fit in ``keep_bytes`` (default ``4 * block_bytes``), and read
    again otherwise. ``on_file(files_done, files_total)`` is called after each file is opened.
    ``storage_options``: credentials and endpoints for ``s3://``/``gs://`` inputs, per scheme.
    ``schema_only``: only the schema and the row estimate are wanted now (a plan): the files'
    first blocks are read side by side, one thread each, and none is kept."""
    string_columns = column_names(string_columns)
    if declared is not None and string_columns:
        raise SchemaError(
            f"string_columns {string_columns} and a declared schema were both given; "
            "with a schema, declare those columns' dtype as string there"
        )
    paths = resolve_inputs(inputs, storage_options)
    readers = _open_readers(paths, declared, string_columns, block_bytes,
                            4 * block_bytes if keep_bytes is None else keep_bytes, on_file, schema_only)
    schema = _schema_of(readers, declared, allow_nan, string_columns)
    if all(r.estimated_rows == 0 for r in readers):
        names = ", ".join(str(r.path) for r in readers)
        raise InputDataError(f"input has no rows (only headers) in {names}; add data rows")
    return Inputs(paths, readers, schema)


def _open_readers(paths: list[InputPath], declared: Schema | None, string_columns: list[str], block_bytes: int,  # noqa: PLR0917
                  keep: int, on_file: Callable[[int, int], None] | None, schema_only: bool) -> list[FileReader]:
    """Each file opened in order, its first block kept while the kept ones fit in ``keep`` bytes
    (none kept for a plan: ``schema_only`` reads the first blocks side by side)."""
    if schema_only:
        with ThreadPoolExecutor(max_workers=min(len(paths), usable_cpus()), thread_name_prefix="airflow-tf-open") as pool:
            first_blocks = list(pool.map(functools.partial(
                _open_file, declared=declared, string_columns=string_columns, block_bytes=block_bytes,
                read_ahead=False), paths))
    readers: list[FileReader] = []
    kept = 0
    for i, path in enumerate(paths):
        # Only a reader that will be kept reads ahead: the others are read again in their turn.
        reader = first_blocks[i] if schema_only else _open_file(
            path, declared, string_columns, block_bytes, read_ahead=i == 0 or kept < keep)
        unknown = [n for n in string_columns if n not in reader.columns]
        if unknown:
            raise SchemaError(
                f"string_columns {unknown} are not columns of {reader.path} (its columns: {', '.join(reader.columns)})"
            )
        kept += reader.first_bytes
        if schema_only or (i > 0 and kept > keep):
            reader.release()
        readers.append(reader)
        if on_file:
            on_file(i + 1, len(paths))
    return readers


def _schema_of(readers: list[FileReader], declared: Schema | None, allow_nan: bool,
               string_columns: list[str]) -> Schema:
    """The declared schema (checked against the files; ``allow_nan`` for every float feature), or
    the one inferred from them."""
    if declared is None:
        return _infer(readers, allow_nan, string_columns)
    _check_declared(readers, declared)
    if not allow_nan:
        return declared
    return Schema(tuple(FeatureSpec(f.name, f.dtype, f.shape, f.allow_nan or f.dtype == "float32")
                        for f in declared.features), declared.label_name)
