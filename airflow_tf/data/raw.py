"""A block of one input file's columns as read, before conversion (:class:`Raw`), where its rows
came from (:class:`Source`), and what every format's reader shares (:class:`FileReader`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .csv_text import csv_line
from .object_store import InputPath
from .schema import Schema


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
            return f"{self.path} line {csv_line(self.path, row)}"
        return f"{self.path} row {row}"


@dataclass
class Raw:
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


def arrow_dtype(t: pa.DataType) -> str | None:
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "int64"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "float32"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "string"
    if pa.types.is_dictionary(t):
        return arrow_dtype(t.value_type)
    return None


def raw_bytes(raw: Raw) -> int:
    return sum(c.nbytes for c in raw.columns.values())


class FileReader:
    """One input file read block by block: its columns' inferred dtypes and shapes (from the
    first block, or the file's metadata) and then its blocks as :class:`Raw`. A subclass per
    format reads the blocks (:meth:`_read`) and sets ``kind``, ``estimated_rows`` and ``_empty``
    (the columns of a file without rows)."""

    kind: str
    _empty: Raw

    def __init__(self, path: InputPath, declared: Schema | None, string_columns: Sequence[str], block_bytes: int,
                 read_ahead: bool = True):
        self.path, self.block_bytes = path, block_bytes
        self.declared, self.string_columns = declared, string_columns
        self._first: Raw | None = None
        self._rest: Iterator[Raw] | None = None
        self.estimated_rows = 0
        self._open(read_ahead)

    # -- the first block fixes the types; it is kept until blocks() hands it out ------------
    def _open(self, read_ahead: bool = True) -> None:
        """Read the first block. Without ``read_ahead`` (a reader to be released) a CSV file's
        later blocks are not read ahead; blocks() opens it again to stream them."""
        blocks = self._read(read_ahead)
        self._first = next(blocks, None)
        self._rest = blocks
        if self._first is None:  # no rows: the columns come from the header or metadata alone
            self._first = self._empty
        first = self._first
        self.columns = list(first.columns)
        self.dtypes, self.shapes = dict(first.dtypes), dict(first.shapes)

    def blocks(self) -> Iterator[Raw]:
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
        return raw_bytes(self._first) if self._first is not None else 0

    def _read(self, read_ahead: bool) -> Iterator[Raw]:
        """The file's blocks, from the first; sets the attributes the class docstring names."""
        raise NotImplementedError
