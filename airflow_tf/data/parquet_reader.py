"""Reading a Parquet file in batches, its column types from the file's metadata."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import InputDataError
from .object_store import InputPath, RemoteFile
from .raw import FileReader, Raw, arrow_dtype


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _open_parquet(path: InputPath) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path.open_random() if isinstance(path, RemoteFile) else path)
    except (pa.ArrowException, OSError) as exc:
        raise InputDataError(f"cannot read Parquet file {path}: {exc}") from None


def _parquet_dtype(path: InputPath, field: pa.Field) -> str:
    """The dtype of a Parquet column (of a list column: of its values); other types are refused."""
    dtype = arrow_dtype(field.type.value_type if _is_list(field.type) else field.type)
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


class ParquetReader(FileReader):
    """A Parquet file, read in batches of about ``block_bytes``."""

    kind = "parquet"

    def _read(self, read_ahead: bool = True) -> Iterator[Raw]:
        path = self.path
        handle = _open_parquet(path)
        schema = handle.schema_arrow
        self.estimated_rows = handle.metadata.num_rows
        dtypes = {f.name: _parquet_dtype(path, f) for f in schema}
        shapes: dict[str, tuple[int, ...]] = {f.name: () for f in schema}
        self._empty = Raw(path, "parquet", {f.name: pa.array([], f.type) for f in schema}, dtypes, shapes, 0)
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
                yield Raw(path, "parquet", columns, dtypes, dict(shapes), batch.num_rows, start)
                start += batch.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise InputDataError(f"cannot read Parquet file {path}: {exc}") from None
