"""Converting a raw block's columns to the schema's dtypes, every value checked (missing values,
integers that are not, the float32 range, NaN)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import InputDataError, SchemaError
from .raw import Raw
from .schema import FeatureSpec

_NAN_HINT = ("pass allow_nan=True (CLI: --allow-nan), or set \"allow_nan\": true for this "
             "feature in the declared schema, if NaN/infinity are meaningful values")


def _to_numpy(raw: Raw, name: str) -> np.ndarray:
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


def convert(raw: Raw, spec: FeatureSpec) -> np.ndarray:
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
