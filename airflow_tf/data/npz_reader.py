"""Reading a NumPy ``.npz`` file: each array's rows from its zip member's stream, never the whole array."""

from __future__ import annotations

import io
import math
import zipfile
from typing import Any
from collections.abc import Iterator

import numpy as np

from .errors import InputDataError
from .object_store import InputPath, RemoteFile
from .raw import FileReader, Raw


class NpzReader(FileReader):
    """A ``.npz`` file: one column per array, rows along the first dimension."""

    kind = "npz"

    def _read(self, read_ahead: bool = True) -> Iterator[Raw]:
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
            self._empty = Raw(path, "npz", {n: np.empty((0, *s), d) for n, (d, s, _) in layouts.items()},
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
                yield Raw(path, "npz", columns, dtypes, shapes, n, start)


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
