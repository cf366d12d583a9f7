"""CSV read as text with Python's csv module, the slow exact path of error messages: opening a
file (compressed or remote), its delimiter, the line of a data row, and why pyarrow refused it."""

from __future__ import annotations

import csv
from typing import Any

import pyarrow as pa

from .object_store import InputPath, RemoteFile, open_text

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def delimiter(path: InputPath) -> str:
    return "\t" if path.name.lower().endswith(".tsv") else ","


def csv_line(path: InputPath, row: int) -> int:
    """The line (as an editor numbers it) where data row ``row`` starts. pyarrow skips blank
    lines and a quoted value may span lines, so the lines are counted (error messages only)."""
    with open_csv_text(path) as handle:
        reader = csv.reader(handle, delimiter=delimiter(path))
        next(reader, None)  # the header
        line, seen = reader.line_num, -1
        for fields in reader:
            if fields:
                seen += 1
                if seen == row:
                    return line + 1
            line = reader.line_num
    return row + 2


def _parse_number(text: str, dtype: str) -> Any:
    if dtype == "int64":
        value = int(text.strip())
        if not INT64_MIN <= value <= INT64_MAX:
            raise OverflowError(f"beyond the int64 range ({INT64_MIN} to {INT64_MAX})")
        return value
    return float(text)


def diagnose_csv(path: InputPath, column_types: dict[str, pa.DataType]) -> str | None:
    """Why pyarrow refused a CSV file, found again with Python's csv module (slow, error path
    only) to name the line and column; None when no problem is found."""
    wanted = {n: "int64" if pa.types.is_integer(t) else "float32"
              for n, t in column_types.items() if pa.types.is_integer(t) or pa.types.is_floating(t)}
    with open_csv_text(path) as handle:
        reader = csv.reader(handle, delimiter=delimiter(path))
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


def open_csv_text(path: InputPath) -> Any:
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
