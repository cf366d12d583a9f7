"""Reading raw input (CSV, Parquet, NumPy ``.npz``) as a stream of blocks of typed NumPy columns.

Files are read a block at a time (pyarrow's streaming CSV reader, Parquet batches, the
arrays of an ``.npz`` from their zip members), so memory follows the block size, not the
input. Every value is checked before it is handed on: a bad value is reported with the
file, the line (CSV) or row (Parquet, .npz), and the column, plus what to do about it."""

from __future__ import annotations

import csv
import functools
import glob as globlib
import io
import math
import os
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from airflow_tf.files import strip_file_scheme

from .cpus import usable_cpus
from .errors import InputDataError, SchemaError
from .object_store import InputPath, RemoteFile, StorageOptions, check_location, is_remote, open_text, resolve_remote
from .schema import FeatureSpec, Schema

CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".tsv")
PARQUET_SUFFIXES = (".parquet", ".pq")
NPZ_SUFFIXES = (".npz",)
SUPPORTED = CSV_SUFFIXES + PARQUET_SUFFIXES + NPZ_SUFFIXES
_NAN_HINT = ("pass allow_nan=True (CLI: --allow-nan), or set \"allow_nan\": true for this "
             "feature in the declared schema, if NaN/infinity are meaningful values")
# What pyarrow's CSV reader takes for a number (it also trims blanks and reads 0x hex as int64).
_NUMBER = r"^\s*[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|0[xX][0-9a-fA-F]{1,16}|(?i:nan|inf|infinity))\s*$"
_INTEGER = r"^\s*[+-]?\d+\s*$"
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


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


@dataclass
class Source:
    """Where a run of rows came from, for error messages."""

    path: InputPath
    kind: str
    start: int
    rows: int

    def where(self, row: int) -> str:
        """``file line N`` (CSV; line 1 is the header) or ``file row N`` (row index from 0)."""
        if self.kind == "csv":
            return f"{self.path} line {_csv_line(self.path, row)}"
        return f"{self.path} row {row}"


# -- blocks of raw columns ------------------------------------------------------------------
@dataclass
class _Raw:
    """A block of one file's columns before conversion: NumPy arrays or (for CSV/Parquet)
    Arrow arrays; ``start`` is the file row of its first row."""

    path: InputPath
    kind: str
    columns: dict[str, Any]
    dtypes: dict[str, str]  # inferred dtype per column (the file's, from its first block)
    shapes: dict[str, tuple[int, ...]]
    rows: int
    start: int = 0

    def where(self, row: int) -> str:
        """Where the block's row ``row`` is in its file."""
        return Source(self.path, self.kind, 0, self.start + self.rows).where(self.start + row)


def _arrow_dtype(t: pa.DataType) -> str | None:
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "int64"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "float32"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "string"
    if pa.types.is_dictionary(t):
        return _arrow_dtype(t.value_type)
    return None


_ARROW_FOR = {"int64": pa.int64(), "float32": pa.float64(), "string": pa.string()}


def _delimiter(path: InputPath) -> str:
    return "\t" if path.name.lower().endswith(".tsv") else ","


def _csv_options(path: InputPath, column_types: dict[str, pa.DataType], include_columns: Sequence[str],
                 block_bytes: int, read_ahead: bool = True) -> dict[str, Any]:
    return dict(
        # With threads, pyarrow reads and parses the next blocks ahead: wasted on a reader
        # that is dropped after its first block.
        read_options=pacsv.ReadOptions(block_size=block_bytes, use_threads=read_ahead),
        parse_options=pacsv.ParseOptions(delimiter=_delimiter(path)),
        # Only an empty cell is missing: "nan"/"NaN" stay NaN so the NaN rule can name them.
        convert_options=pacsv.ConvertOptions(
            column_types=column_types, null_values=[""], strings_can_be_null=False,
            quoted_strings_can_be_null=False, timestamp_parsers=[], include_columns=list(include_columns),
            true_values=["true", "True", "TRUE"], false_values=["false", "False", "FALSE"],
        ),
    )


def _csv_line(path: InputPath, row: int) -> int:
    """The line (as an editor numbers it) where data row ``row`` starts. pyarrow skips blank
    lines and a quoted value may span lines, so the lines are counted (error messages only)."""
    with _open_text(path) as handle:
        reader = csv.reader(handle, delimiter=_delimiter(path))
        next(reader, None)  # the header
        line, seen = reader.line_num, -1
        for fields in reader:
            if fields:
                seen += 1
                if seen == row:
                    return line + 1
            line = reader.line_num
    return row + 2


def _check_text_column(path: InputPath, name: str, column: pa.Array, start: int) -> None:
    """A column pyarrow inferred as text must hold no numbers: it takes a whole block's column
    for text for one value that does not parse. ``start``: file row of the block's first row."""
    numeric = pc.match_substring_regex(column, _NUMBER)
    count, total = pc.sum(numeric).as_py() or 0, len(column)
    if not 0 < count < total:  # all text (or, in theory, all numbers that pyarrow still refused)
        return
    if not pc.any(pc.match_substring_regex(pc.filter(column, numeric), r"\d")).as_py():
        return  # words such as "Nan" or "Inf" among text: no digits, not a column of numbers
    is_number = numeric.to_numpy(zero_copy_only=False)
    around = f" in data rows {start:,} to {start + total - 1:,}" if start else ""
    if count >= total - count:  # mostly numbers: the text is the odd one out
        row = int(np.argmin(is_number))
        value = column[row].as_py()
        shown = "an empty value" if not value.strip() else f"value {value!r}"
        what = f"{shown} is not a number, but {count:,} of the column's {total:,} values{around} are"
    else:
        row = int(np.argmax(is_number))
        what = (f"value {column[row].as_py()!r} is a number in a column of text "
                f"({count:,} of its {total:,} values{around} are numbers)")
    raise InputDataError(
        f"{Source(path, 'csv', 0, start + total).where(start + row)}, column {name!r}: {what}; "
        f"fix the value, or if {name!r} is a text column, pass string_columns=[{name!r}] "
        f"(CLI: --string-columns {name}) or declare it as string in a schema"
    )


def _check_int64_overflow(path: InputPath, name: str, column: pa.Array, as_text: Callable[[], pa.Array]) -> None:
    """pyarrow reads an integer beyond int64 as a float, which turns an integer column into
    float32. Only a first block with a value that large is read again, as text, to tell."""
    bounds = pc.min_max(column)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None or (low > _INT64_MIN and high < 2.0**63):
        return
    text = as_text()
    if not pc.all(pc.match_substring_regex(text, _INTEGER)).as_py():
        return  # a float column (other values have a fraction or exponent)
    values = column.to_numpy(zero_copy_only=False)
    for row in np.flatnonzero(np.abs(values) >= 2.0**63):
        number = int(text[int(row)].as_py())
        if not _INT64_MIN <= number <= _INT64_MAX:
            raise InputDataError(
                f"{Source(path, 'csv', 0, len(column)).where(int(row))}, column {name!r}: integer {number} is "
                f"beyond the int64 range ({_INT64_MIN} to {_INT64_MAX}); fix the value, or declare the column "
                "as float32 (large values lose precision) or as string in a schema"
            )



def _csv_batches(path: InputPath, column_types: dict[str, pa.DataType], block_bytes: int,
                 include_columns: Sequence[str] = (), read_ahead: bool = True
                 ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """pyarrow's streaming CSV reader: the column types (inferred from the first block unless
    given) and the batches, one per ``block_bytes`` of text."""
    try:
        source = path.open_stream() if isinstance(path, RemoteFile) else path
        reader = pacsv.open_csv(source, **_csv_options(path, column_types, include_columns, block_bytes, read_ahead))
    except pa.ArrowInvalid as exc:
        raise InputDataError(_diagnose_csv(path, column_types) or f"cannot read CSV file {path}: {exc}") from None

    def batches() -> Iterator[pa.RecordBatch]:
        while True:
            try:
                yield reader.read_next_batch()
            except StopIteration:
                return
            except pa.ArrowInvalid as exc:
                # A later block that contradicts the types: name the line, column and value.
                found = _diagnose_csv(path, {f.name: f.type for f in reader.schema})
                inferred = "" if column_types else (
                    f" (the types of {path}'s columns are inferred from its first {block_bytes:,} bytes: "
                    "declare them in a schema, or name text columns in string_columns)")
                raise InputDataError((found or f"cannot read CSV file {path}: {exc}") + inferred) from None

    return reader.schema, batches()


def _csv_text_block(path: InputPath, name: str, index: int, block_bytes: int) -> pa.Array:
    """Column ``name`` of block ``index`` read again as text (blocks split at the same bytes)."""
    _, batches = _csv_batches(path, {name: pa.string()}, block_bytes, [name], read_ahead=False)
    for i, batch in enumerate(batches):
        if i == index:
            return batch.column(0)
    raise InputDataError(f"{path} changed while it was read; prepare it again")


def _check_unique_names(path: InputPath, names: Sequence[str]) -> None:
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InputDataError(f"{path}: column names {duplicates} appear more than once in the header")


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _open_parquet(path: InputPath) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path.open_random() if isinstance(path, RemoteFile) else path)
    except (pa.ArrowException, OSError) as exc:
        raise InputDataError(f"cannot read Parquet file {path}: {exc}") from None


def _parquet_dtype(path: InputPath, field: pa.Field) -> str:
    """The dtype of a Parquet column (of a list column: of its values); other types are refused."""
    dtype = _arrow_dtype(field.type.value_type if _is_list(field.type) else field.type)
    if dtype is None:
        raise InputDataError(
            f"{path}, column {field.name!r}: Arrow type {field.type} is not supported; "
            "use integers, floats, strings, or fixed-length lists of numbers"
        )
    return dtype


def _check_list_lengths(path: InputPath, name: str, column: pa.Array, start: int,
                        shapes: dict[str, tuple[int, ...]]) -> None:
    """Every row of a list column holds as many values as the file's row 0 (whose length the
    first batch records in ``shapes``)."""
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if start == 0 and len(lengths):
        shapes[name] = (int(lengths[0]),)
    want = shapes[name][0] if shapes[name] else 1
    if len(lengths) and (lengths != want).any():
        bad = int(np.argmax(lengths != want))
        raise InputDataError(
            f"{path} row {start + bad}, column {name!r}: list of {lengths[bad]} values where "
            f"row 0 has {want}; every row of a feature needs the same number of values"
        )


class _FileReader:
    """One input file read block by block: its columns' inferred dtypes and shapes (from the
    first block, or the file's metadata) and then its blocks as :class:`_Raw`."""

    def __init__(self, path: InputPath, declared: Schema | None, string_columns: Sequence[str], block_bytes: int,
                 read_ahead: bool = True):
        self.path, self.kind, self.block_bytes = path, _kind(path), block_bytes
        self.declared, self.string_columns = declared, string_columns
        self._first: _Raw | None = None
        self._rest: Iterator[_Raw] | None = None
        self.estimated_rows = 0
        self._open(read_ahead)

    # -- the first block fixes the types; it is kept until blocks() hands it out ------------
    def _open(self, read_ahead: bool = True) -> None:
        """Read the first block. Without ``read_ahead`` (a reader to be released) a CSV file's
        later blocks are not read ahead; blocks() opens it again to stream them."""
        blocks = self._csv(read_ahead) if self.kind == "csv" else self._parquet() if self.kind == "parquet" else self._npz()
        self._first = next(blocks, None)
        self._rest = blocks
        if self._first is None:  # no rows: the columns come from the header or metadata alone
            self._first = self._empty
        first = self._first
        self.columns = list(first.columns)
        self.dtypes, self.shapes = dict(first.dtypes), dict(first.shapes)

    def blocks(self) -> Iterator[_Raw]:
        """Every block of the file, the first one included (read once; then the file is closed)."""
        if self._rest is None:  # the first block was dropped to save memory: read it again
            self._open()
        first, rest = self._first, self._rest
        self._first = self._rest = None
        if first is not None and first.rows:
            yield first
        yield from rest or ()

    def release(self) -> None:
        """Forget the first block (it is read again when the file's turn comes)."""
        self._first = self._rest = None

    @property
    def first_bytes(self) -> int:
        return _raw_bytes(self._first) if self._first is not None else 0

    # -- CSV -------------------------------------------------------------------------------
    def _csv_column_types(self) -> dict[str, pa.DataType]:
        """The types the reader is told (declared, or text for ``string_columns``); the rest are inferred."""
        if self.declared is not None:
            return {f.name: _ARROW_FOR[f.dtype] for f in self.declared.features}
        return {name: pa.string() for name in self.string_columns}

    def _csv_column(self, name: str, column: pa.Array, *, dtype: str, inferred: bool, index: int,
                    start: int) -> pa.Array:
        """A column of block ``index`` as handed on: types pyarrow has no dtype for (dates, times)
        become text; an inferred type must be honest (no number among text, no integer beyond int64)."""
        if _arrow_dtype(column.type) is None:
            return pc.cast(column, pa.string())
        if not inferred:
            return column
        if dtype == "string":
            _check_text_column(self.path, name, column, start)
        elif index == 0 and dtype == "float32" and pa.types.is_floating(column.type):
            _check_int64_overflow(self.path, name, column,
                                  functools.partial(_csv_text_block, self.path, name, 0, self.block_bytes))
        return column

    def _csv(self, read_ahead: bool) -> Iterator[_Raw]:
        path = self.path
        column_types = self._csv_column_types()
        schema, batches = _csv_batches(path, column_types, self.block_bytes, read_ahead=read_ahead)
        names = schema.names
        _check_unique_names(path, names)
        dtypes = {f.name: _arrow_dtype(f.type) or "string" for f in schema}  # dates, times...: text
        shapes: dict[str, tuple[int, ...]] = {n: () for n in names}
        self._empty = _Raw(path, "csv", {n: pa.array([], pa.string()) for n in names}, dtypes, shapes, 0)
        size = path.stat().st_size * (4 if path.name.lower().endswith((".gz", ".bz2")) else 1)
        start = 0
        for index, batch in enumerate(batches):
            columns = {name: self._csv_column(name, column, dtype=dtypes[name], inferred=name not in column_types,
                                              index=index, start=start)
                       for name, column in zip(names, batch.columns, strict=True)}
            if index == 0:  # the first block is block_bytes of text, or the whole file
                self.estimated_rows = max(batch.num_rows, round(batch.num_rows * size / self.block_bytes))
            yield _Raw(path, "csv", columns, dtypes, dict(shapes), batch.num_rows, start)
            start += batch.num_rows

    # -- Parquet ---------------------------------------------------------------------------
    def _parquet(self) -> Iterator[_Raw]:
        path = self.path
        handle = _open_parquet(path)
        schema = handle.schema_arrow
        self.estimated_rows = handle.metadata.num_rows
        dtypes = {f.name: _parquet_dtype(path, f) for f in schema}
        shapes: dict[str, tuple[int, ...]] = {f.name: () for f in schema}
        self._empty = _Raw(path, "parquet", {f.name: pa.array([], f.type) for f in schema}, dtypes, shapes, 0)
        row_bytes = max(1, sum(handle.metadata.row_group(i).total_byte_size
                               for i in range(handle.metadata.num_row_groups)) // max(1, self.estimated_rows))
        batch_rows = max(1024, self.block_bytes // row_bytes)
        start = 0
        try:
            for batch in handle.iter_batches(batch_size=batch_rows):
                columns = {}
                for f, read in zip(schema, batch.columns, strict=True):
                    column = read.dictionary_decode() if pa.types.is_dictionary(read.type) else read
                    if _is_list(column.type):
                        _check_list_lengths(path, f.name, column, start, shapes)
                    columns[f.name] = column
                yield _Raw(path, "parquet", columns, dtypes, dict(shapes), batch.num_rows, start)
                start += batch.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise InputDataError(f"cannot read Parquet file {path}: {exc}") from None

    # -- NumPy .npz: each array's rows read from its member stream, never the whole array ---
    def _npz(self) -> Iterator[_Raw]:
        path = self.path
        try:
            archive = zipfile.ZipFile(path.open_random() if isinstance(path, RemoteFile) else path)
        except (OSError, zipfile.BadZipFile) as exc:
            raise InputDataError(f"cannot read NumPy file {path}: {exc}") from None
        with archive:
            streams, layouts = {}, {}
            rows = None
            for member in archive.namelist():
                name = member[:-4] if member.endswith(".npy") else member
                stream = archive.open(member)
                shape, fortran, dtype = _npy_header(path, name, stream)
                if rows is None:
                    rows = shape[0]
                elif shape[0] != rows:
                    raise InputDataError(
                        f"{path}, array {name!r} has {shape[0]} rows where the other arrays have {rows}; "
                        "all arrays of a .npz file must have the same first dimension"
                    )
                kind = {"i": "int64", "u": "int64", "b": "int64", "f": "float32", "U": "string", "S": "string"}
                if dtype.kind not in kind:
                    raise InputDataError(f"{path}, array {name!r}: dtype {dtype} is not supported")
                if fortran and len(shape) > 1:  # column-major: rows are not contiguous, read it whole
                    stream = io.BytesIO(np.ascontiguousarray(
                        np.frombuffer(stream.read(), dtype=dtype).reshape(shape, order="F")).tobytes())
                streams[name] = stream
                layouts[name] = (dtype, tuple(shape[1:]), kind[dtype.kind])
            if not streams:
                raise InputDataError(f"input file {path} holds no arrays; add one array per column")
            rows = rows or 0
            self.estimated_rows = rows
            dtypes = {n: layout[2] for n, layout in layouts.items()}
            shapes = {n: layout[1] for n, layout in layouts.items()}
            self._empty = _Raw(path, "npz", {n: np.empty((0, *s), d) for n, (d, s, _) in layouts.items()},
                               dtypes, shapes, 0)
            row_bytes = max(1, sum(d.itemsize * math.prod(s) for d, s, _ in layouts.values()))
            step = max(1024, self.block_bytes // row_bytes)
            for start in range(0, rows, step):
                n = min(step, rows - start)
                columns = {}
                for name, (dtype, shape, _) in layouts.items():
                    size = dtype.itemsize * math.prod(shape) * n
                    data = streams[name].read(size)
                    if len(data) != size:
                        raise InputDataError(f"{path}, array {name!r} is truncated; write the file again")
                    columns[name] = np.frombuffer(data, dtype=dtype).reshape((n, *shape))
                yield _Raw(path, "npz", columns, dtypes, shapes, n, start)


def _npy_header(path: InputPath, name: str, stream: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) of one .npy member of a .npz file, read from its header;
    object arrays and scalars are refused."""
    try:
        version = np.lib.format.read_magic(stream)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(stream)
    except ValueError as exc:
        raise InputDataError(f"cannot read NumPy file {path}, array {name!r}: {exc}") from None
    if dtype.hasobject:
        raise InputDataError(f"{path}, array {name!r}: object arrays are not supported")
    if len(shape) == 0:
        raise InputDataError(f"{path}, array {name!r} is a scalar; each array needs one entry per row")
    return shape, fortran, dtype


def _raw_bytes(raw: _Raw) -> int:
    return sum(c.nbytes for c in raw.columns.values())


def _parse_number(text: str, dtype: str) -> Any:
    if dtype == "int64":
        value = int(text.strip())
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise OverflowError(f"beyond the int64 range ({_INT64_MIN} to {_INT64_MAX})")
        return value
    return float(text)


def _diagnose_csv(path: InputPath, column_types: dict[str, pa.DataType]) -> str | None:
    """Why pyarrow refused a CSV file, found again with Python's csv module (slow, error path
    only) to name the line and column; None when no problem is found."""
    wanted = {n: "int64" if pa.types.is_integer(t) else "float32"
              for n, t in column_types.items() if pa.types.is_integer(t) or pa.types.is_floating(t)}
    with _open_text(path) as handle:
        reader = csv.reader(handle, delimiter=_delimiter(path))
        header = next(reader, None)
        if header is None:
            return f"input file {path} is empty; remove it or fill it with data"
        for row in reader:
            line = reader.line_num
            if len(row) != len(header):
                return (f"{path} line {line}: expected {len(header)} fields (the header's), "
                        f"found {len(row)}; fix or remove that row")
            for name, text in zip(header, row, strict=True):
                want = wanted.get(name)
                if want is None:
                    continue
                try:
                    _parse_number(text, want)
                except OverflowError as exc:
                    return (f"{path} line {line}, column {name!r}: integer {text.strip()} is {exc}; fix the value, "
                            "or declare the column as float32 (large values lose precision) or as string")
                except ValueError:
                    shown = "an empty value" if text == "" else f"value {text!r}"
                    return (f"{path} line {line}, column {name!r}: {shown} does not parse as {want}; "
                            f"fix the value or declare the column as {'float32' if want == 'int64' else 'string'}"
                            " in the schema")
    return None


def _widen(a: str, b: str) -> str:
    """The dtype holding values of both: int64 and float32 give float32; text wins otherwise."""
    if a == b:
        return a
    return "float32" if {a, b} == {"int64", "float32"} else "string"


def _open_text(path: InputPath) -> Any:
    if isinstance(path, RemoteFile):
        return open_text(path)
    name = path.name.lower()
    if name.endswith(".gz"):
        import gzip

        return gzip.open(path, "rt", encoding="utf-8", newline="")
    if name.endswith(".bz2"):
        import bz2

        return bz2.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


# -- conversion to the schema's dtypes -----------------------------------------------------
def _to_numpy(raw: _Raw, name: str) -> np.ndarray:
    column = raw.columns[name]
    if isinstance(column, np.ndarray):
        return column
    if column.null_count:
        row = int(np.argmax(column.is_null().to_numpy(zero_copy_only=False)))
        raise InputDataError(
            f"{raw.where(row)}, column {name!r}: missing (empty) value; fill it in or drop the row"
        )
    if raw.shapes[name]:
        flat = pc.list_flatten(column)
        if flat.null_count:
            raise InputDataError(f"{raw.path}, column {name!r}: a list holds a missing value; fill it in")
        values = flat.to_numpy(zero_copy_only=False)
        return values.reshape((len(column),) + raw.shapes[name])
    if pa.types.is_boolean(column.type):
        return column.to_numpy(zero_copy_only=False).astype(np.int64)
    return column.to_numpy(zero_copy_only=False)


def _first_bad(mask: np.ndarray) -> int:
    """Row index of the first True in a (rows, ...) mask."""
    return int(np.argmax(mask.reshape(len(mask), -1).any(axis=1)))


def _convert(raw: _Raw, spec: FeatureSpec) -> np.ndarray:
    values = _to_numpy(raw, spec.name)
    where = lambda row: f"{raw.where(row)}, column {spec.name!r}"
    if values.shape[1:] != spec.shape:
        raise SchemaError(
            f"{raw.path}, column {spec.name!r} has shape {list(values.shape[1:])} per row but the schema "
            f"declares {list(spec.shape)}; fix the schema or the data"
        )
    kind = values.dtype.kind
    if spec.dtype == "string":
        if kind in "US":
            return values.astype(object)
        if kind == "O":
            return values
        raise SchemaError(
            f"{raw.path}, column {spec.name!r} holds numbers but is declared string (schema or string_columns); "
            "only CSV text is read as string: declare it as int64 or float32, or store it as text"
        )
    if kind not in "iufb":
        raise SchemaError(
            f"{raw.path}, column {spec.name!r} holds text but the schema declares {spec.dtype}; "
            "declare it as string or fix the data"
        )
    if spec.dtype == "int64":
        if kind == "f":
            bad = ~np.isfinite(values) | (values != np.round(values))
            if bad.any():
                row = _first_bad(bad)
                raise InputDataError(
                    f"{where(row)}: value {_first_value(values, bad, row)!r} is not an integer "
                    "but the schema declares int64; declare the column as float32 or fix the value"
                )
        if kind == "u" and values.dtype.itemsize == 8 and (values > np.iinfo(np.int64).max).any():
            row = _first_bad(values > np.iinfo(np.int64).max)
            raise InputDataError(f"{where(row)}: value exceeds the int64 range")
        return values.astype(np.int64)
    # float32. Values beyond its range become infinite in the cast, so one check finds both.
    with np.errstate(over="ignore"):
        narrow = values.astype(np.float32)
    if np.isfinite(narrow).all():
        return narrow
    wide = values.astype(np.float64, copy=False)
    too_big = np.isfinite(wide) & ~np.isfinite(narrow)
    if too_big.any():
        row = _first_bad(too_big)
        raise InputDataError(
            f"{where(row)}: value {_first_value(wide, too_big, row)!r} is out of the float32 range "
            "(about 3.4e38); rescale the column"
        )
    if not spec.allow_nan:
        bad = ~np.isfinite(wide)
        row = _first_bad(bad)
        raise InputDataError(f"{where(row)}: {_first_value(wide, bad, row)!r} is not allowed; {_NAN_HINT}")
    return narrow


def _first_value(values: np.ndarray, mask: np.ndarray, row: int) -> float:
    """The first flagged value of ``row`` (rows may hold vectors), as a Python float."""
    return float(values.reshape(len(values), -1)[row][mask.reshape(len(mask), -1)[row]][0])


def _infer(raws: Sequence[_Raw | _FileReader], allow_nan: bool, string_columns: Sequence[str]) -> Schema:
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


def _check_declared(raws: Sequence[_Raw | _FileReader], declared: Schema) -> None:
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


def column_names(value: str | Sequence[str] | None) -> list[str]:
    """Column names from a list and/or comma-separated text (``"zip,id"``), as options give them."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    names = [part.strip() for item in items for part in str(item).split(",")]
    return list(dict.fromkeys(n for n in names if n))


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

    def __init__(self, paths: list[InputPath], readers: list[_FileReader], schema: Schema) -> None:
        self.paths, self._readers, self.schema = paths, readers, schema

    @property
    def estimated_rows(self) -> int:
        """Rows in all files: exact for Parquet and .npz, from the first block's size for CSV."""
        return sum(r.estimated_rows for r in self._readers)

    def blocks(self) -> Iterator[Block]:
        for reader in self._readers:
            for raw in reader.blocks():
                yield Block(raw.path, raw.start, {spec.name: _convert(raw, spec) for spec in self.schema.features})


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
    keep = 4 * block_bytes if keep_bytes is None else keep_bytes
    readers: list[_FileReader] = []
    kept = 0
    if schema_only:
        with ThreadPoolExecutor(max_workers=min(len(paths), usable_cpus()), thread_name_prefix="airflow-tf-open") as pool:
            first_blocks = list(pool.map(functools.partial(
                _FileReader, declared=declared, string_columns=string_columns, block_bytes=block_bytes,
                read_ahead=False), paths))
    for i, path in enumerate(paths):
        # Only a reader that will be kept reads ahead: the others are read again in their turn.
        reader = first_blocks[i] if schema_only else _FileReader(
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
    if declared is not None:
        _check_declared(readers, declared)
        schema = declared
        if allow_nan:
            schema = Schema(tuple(FeatureSpec(f.name, f.dtype, f.shape, f.allow_nan or f.dtype == "float32")
                                  for f in declared.features), declared.label_name)
    else:
        schema = _infer(readers, allow_nan, string_columns)
    if all(r.estimated_rows == 0 for r in readers):
        names = ", ".join(str(r.path) for r in readers)
        raise InputDataError(f"input has no rows (only headers) in {names}; add data rows")
    return Inputs(paths, readers, schema)
