"""Reading a CSV file (or TSV, gzip or bzip2 compressed) block by block with pyarrow's streaming reader,
its inferred column types checked to be honest."""

from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from .csv_text import INT64_MAX, INT64_MIN, delimiter, diagnose_csv
from .errors import InputDataError
from .object_store import InputPath, RemoteFile
from .raw import FileReader, Raw, Source, arrow_dtype

# What pyarrow's CSV reader takes for a number (it also trims blanks and reads 0x hex as int64).
_NUMBER = r"^\s*[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|0[xX][0-9a-fA-F]{1,16}|(?i:nan|inf|infinity))\s*$"
_INTEGER = r"^\s*[+-]?\d+\s*$"

_ARROW_FOR = {"int64": pa.int64(), "float32": pa.float64(), "string": pa.string()}


def _csv_options(path: InputPath, column_types: dict[str, pa.DataType], include_columns: Sequence[str],
                 block_bytes: int, read_ahead: bool = True) -> dict[str, Any]:
    return dict(
        # With threads, pyarrow reads and parses the next blocks ahead: wasted on a reader
        # that is dropped after its first block.
        read_options=pacsv.ReadOptions(block_size=block_bytes, use_threads=read_ahead),
        parse_options=pacsv.ParseOptions(delimiter=delimiter(path)),
        # Only an empty cell is missing: "nan"/"NaN" stay NaN so the NaN rule can name them.
        convert_options=pacsv.ConvertOptions(
            column_types=column_types, null_values=[""], strings_can_be_null=False,
            quoted_strings_can_be_null=False, timestamp_parsers=[], include_columns=list(include_columns),
            true_values=["true", "True", "TRUE"], false_values=["false", "False", "FALSE"],
        ),
    )


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
    if low is None or (low > INT64_MIN and high < 2.0**63):
        return
    text = as_text()
    if not pc.all(pc.match_substring_regex(text, _INTEGER)).as_py():
        return  # a float column (other values have a fraction or exponent)
    values = column.to_numpy(zero_copy_only=False)
    for row in np.flatnonzero(np.abs(values) >= 2.0**63):
        number = int(text[int(row)].as_py())
        if not INT64_MIN <= number <= INT64_MAX:
            raise InputDataError(
                f"{Source(path, 'csv', 0, len(column)).where(int(row))}, column {name!r}: integer {number} is "
                f"beyond the int64 range ({INT64_MIN} to {INT64_MAX}); fix the value, or declare the column "
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
        raise InputDataError(diagnose_csv(path, column_types) or f"cannot read CSV file {path}: {exc}") from None

    def batches() -> Iterator[pa.RecordBatch]:
        while True:
            try:
                yield reader.read_next_batch()
            except StopIteration:
                return
            except pa.ArrowInvalid as exc:
                # A later block that contradicts the types: name the line, column and value.
                found = diagnose_csv(path, {f.name: f.type for f in reader.schema})
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


class CsvReader(FileReader):
    """A CSV file: the first block (``block_bytes`` of text) fixes the inferred types."""

    kind = "csv"

    def _csv_column_types(self) -> dict[str, pa.DataType]:
        """The types the reader is told (declared, or text for ``string_columns``); the rest are inferred."""
        if self.declared is not None:
            return {f.name: _ARROW_FOR[f.dtype] for f in self.declared.features}
        return {name: pa.string() for name in self.string_columns}

    def _csv_column(self, name: str, column: pa.Array, *, dtype: str, inferred: bool, index: int,
                    start: int) -> pa.Array:
        """A column of block ``index`` as handed on: types pyarrow has no dtype for (dates, times)
        become text; an inferred type must be honest (no number among text, no integer beyond int64)."""
        if arrow_dtype(column.type) is None:
            return pc.cast(column, pa.string())
        if not inferred:
            return column
        if dtype == "string":
            _check_text_column(self.path, name, column, start)
        elif index == 0 and dtype == "float32" and pa.types.is_floating(column.type):
            _check_int64_overflow(self.path, name, column,
                                  functools.partial(_csv_text_block, self.path, name, 0, self.block_bytes))
        return column

    def _read(self, read_ahead: bool = True) -> Iterator[Raw]:
        path = self.path
        column_types = self._csv_column_types()
        schema, batches = _csv_batches(path, column_types, self.block_bytes, read_ahead=read_ahead)
        names = schema.names
        _check_unique_names(path, names)
        dtypes = {f.name: arrow_dtype(f.type) or "string" for f in schema}  # dates, times...: text
        shapes: dict[str, tuple[int, ...]] = {n: () for n in names}
        self._empty = Raw(path, "csv", {n: pa.array([], pa.string()) for n in names}, dtypes, shapes, 0)
        size = path.stat().st_size * (4 if path.name.lower().endswith((".gz", ".bz2")) else 1)
        start = 0
        for index, batch in enumerate(batches):
            columns = {name: self._csv_column(name, column, dtype=dtypes[name], inferred=name not in column_types,
                                              index=index, start=start)
                       for name, column in zip(names, batch.columns, strict=True)}
            if index == 0:  # the first block is block_bytes of text, or the whole file
                self.estimated_rows = max(batch.num_rows, round(batch.num_rows * size / self.block_bytes))
            yield Raw(path, "csv", columns, dtypes, dict(shapes), batch.num_rows, start)
            start += batch.num_rows
