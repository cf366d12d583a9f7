"""Vectorised ``tf.train.Example`` encoding and TFRecord framing with NumPy.

Building one protobuf object per row costs microseconds of Python per value. Here a whole
chunk of rows is encoded at once: an Example is a nest of length-delimited fields, so each
row's bytes are a fixed sequence of *pieces* (constant tag bytes, varint lengths, value
bytes). The lengths are computed per row with array arithmetic and every piece is copied
into place with one NumPy operation per feature. When every row has the same layout (all
float32 features, small ints) the chunk is a plain 2-D byte matrix; rows of a few different
layouts (an int64 id takes 1-10 bytes) are encoded one layout group at a time; text columns
fall back to assembling rows of any length byte by byte.

Wire format (field numbers from tensorflow/core/example/{example,feature}.proto)::

    Example   = 0x0A len Features
    Features  = (0x0A len MapEntry)*          map<string, Feature> feature = 1
    MapEntry  = 0x0A len key 0x12 len Feature
    Feature   = 0x0A len BytesList | 0x12 len FloatList | 0x1A len Int64List
    FloatList = 0x0A len float32-LE*          packed
    Int64List = 0x0A len varint*              packed
    BytesList = (0x0A len bytes)*

TFRecord framing per record: uint64-LE length, masked CRC32C of the length, data, masked
CRC32C of the data. CRC32C is computed for all rows at once, using its linearity: the
contribution of a byte depends only on its value and its distance from the end of the
record, so a record's CRC is an XOR of table lookups (zero-padding on the left changes
nothing, which lets rows of different lengths share one matrix).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from collections.abc import Sequence
from typing import cast

import numpy as np

from .schema import FeatureSpec

# -- CRC32C (Castagnoli, reflected polynomial 0x82F63B78) ---------------------------------
_POLY = np.uint32(0x82F63B78)
_BLOCK = 512  # distance-table depth: bytes further than this from the end are folded in blocks
_HEAD, _TAIL = 12, 4  # TFRecord framing around each record: length + its CRC, then the data's CRC
_MAX_LAYOUTS = 32  # beyond this many distinct row layouts in a chunk, assemble rows byte by byte


def _byte_table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ _POLY, t >> 1).astype(np.uint32)
    return t


_TABLE = _byte_table()


def _zero_byte(x: np.ndarray) -> np.ndarray:
    """Advance CRC registers ``x`` over one zero byte."""
    return (x >> np.uint32(8)) ^ _TABLE[x & np.uint32(0xFF)]


def _distance_table() -> np.ndarray:
    # _DIST[d, v]: contribution of byte value v followed by d bytes, flattened for np.take.
    rows = np.empty((_BLOCK, 256), dtype=np.uint32)
    rows[0] = _TABLE
    for d in range(1, _BLOCK):
        rows[d] = _zero_byte(rows[d - 1])
    return rows.ravel()


_DIST = _distance_table()
_INIT = np.empty(_BLOCK, dtype=np.uint32)  # _INIT[r]: the initial register after r zero bytes
_reg = np.array([0xFFFFFFFF], dtype=np.uint32)
for _r in range(_BLOCK):
    _INIT[_r] = _reg[0]
    _reg = _zero_byte(_reg)
del _reg, _r
_SHIFTS: list[np.ndarray] = []  # _SHIFTS[q]: 4x256 tables advancing a register by q*_BLOCK zero bytes
# Prepare's encode threads grow _SHIFTS together: unguarded, two appending the same step left a
# wrong table at the next index, and every CRC the process wrote after it was wrong.
_SHIFTS_GROWING = threading.Lock()


def _shift_tables(q: int) -> np.ndarray:
    if len(_SHIFTS) > q:
        return _SHIFTS[q]
    with _SHIFTS_GROWING:
        _grow_shift_tables(q)
    return _SHIFTS[q]


def _grow_shift_tables(q: int) -> None:
    while len(_SHIFTS) <= q:
        if not _SHIFTS:
            x = np.arange(256, dtype=np.uint32)
            _SHIFTS.append(np.stack([x << np.uint32(8 * j) for j in range(4)]))
            continue
        values = _SHIFTS[-1]
        if len(_SHIFTS) == 1:
            for _ in range(_BLOCK):
                values = _zero_byte(values)
        else:
            values = _apply_shift(_SHIFTS[1], values)
        _SHIFTS.append(values)


def _apply_shift(tables: np.ndarray, x: np.ndarray) -> np.ndarray:
    return (tables[0][x & 0xFF] ^ tables[1][(x >> 8) & 0xFF]
            ^ tables[2][(x >> 16) & 0xFF] ^ tables[3][x >> 24])


def _contributions(rows: np.ndarray, distance: np.ndarray) -> np.ndarray:
    """XOR over the columns of ``rows`` of each byte's contribution at its distance from the end."""
    acc = np.zeros(len(rows), dtype=np.uint32)
    blocks = distance // _BLOCK
    for q in np.unique(blocks):
        cols = np.nonzero(blocks == q)[0]
        index = rows[:, cols] + (distance[cols] % _BLOCK * 256)
        part = np.bitwise_xor.reduce(np.take(_DIST, index), axis=1)
        acc ^= _apply_shift(_shift_tables(int(q)), part) if q else part
    return acc


def _linear_part(rows: np.ndarray, varying: np.ndarray | None = None) -> np.ndarray:
    """XOR of the byte contributions of each row of a uint8 matrix (zero initial register).

    ``varying`` marks the columns that may differ between rows (found by comparing if None)."""
    n, width = rows.shape
    if n == 0 or width == 0:
        return np.zeros(n, dtype=np.uint32)
    distance = np.arange(width - 1, -1, -1, dtype=np.intp)
    # Bytes equal in every row (tags, names, lengths, constant values) contribute the same to
    # every CRC: count them once from the first row, look up only the columns that vary.
    if varying is None:
        varying = (rows != rows[0]).any(axis=0)
    constant = _contributions(rows[:1, ~varying], distance[~varying])[0]
    if not varying.any():
        return np.full(n, constant, dtype=np.uint32)
    return _contributions(rows[:, varying], distance[varying]) ^ constant


def _initial_part(lengths: np.ndarray) -> np.ndarray:
    """The initial register 0xFFFFFFFF advanced over ``lengths`` bytes."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out = _INIT[lengths % _BLOCK]
    blocks = lengths // _BLOCK
    for q in np.unique(blocks[blocks > 0]):
        sel = blocks == q
        out[sel] = _apply_shift(_shift_tables(int(q)), out[sel])
    return out


def crc32c_matrix(rows: np.ndarray, varying: np.ndarray | None = None) -> np.ndarray:
    """CRC32C of every row of a uint8 matrix (``varying``: see :func:`_linear_part`)."""
    init = _initial_part(np.full(1, rows.shape[1]))[0]
    return _linear_part(rows, varying) ^ init ^ np.uint32(0xFFFFFFFF)


def crc32c_ragged(flat: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """CRC32C of each record of a ragged byte buffer (records back to back)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.empty(len(lengths), dtype=np.uint32)
    # Rows of similar length share one right-aligned, zero-padded matrix (padding stays < 2x).
    buckets = np.ceil(np.log2(np.maximum(lengths, 1))).astype(np.int8)
    single = len(lengths) and buckets.min() == buckets.max()
    byte_bucket = None if single else np.repeat(buckets, lengths)
    for b in np.unique(buckets):
        rows = slice(None) if single else buckets == b
        lens = lengths[rows]
        data = flat if single else flat[byte_bucket == b]
        out[rows] = _linear_part(right_aligned(data, lens)) ^ _initial_part(lens) ^ np.uint32(0xFFFFFFFF)
    return out


def right_aligned(flat: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Records back to back -> one zero-padded row per record, bytes at the right end."""
    width = int(lengths.max()) if len(lengths) else 0
    matrix = np.zeros((len(lengths), width), dtype=np.uint8)
    matrix[np.arange(width)[None, :] >= (width - lengths)[:, None]] = flat
    return matrix


def crc32c(data: bytes) -> int:
    """CRC32C of one byte string."""
    return int(crc32c_matrix(np.frombuffer(data, dtype=np.uint8).reshape(1, -1))[0])


def mask_crc(crc: np.ndarray) -> np.ndarray:
    """TFRecord's masked CRC: rotate right by 15 bits and add a constant."""
    crc = crc.astype(np.uint32)
    return (((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(0xA282EAD8)).astype(np.uint32)


# -- varints and byte pieces --------------------------------------------------------------
def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    out = np.zeros(len(values), dtype=np.int64)
    np.cumsum(values[:-1], out=out[1:])
    return out


def varint_length(values: np.ndarray | int) -> np.ndarray:
    """Bytes taken by the base-128 varint of each unsigned value (1..10)."""
    v = np.asarray(values).astype(np.uint64)
    n = np.ones(v.shape, dtype=np.int64)
    top = int(v.max()) if v.size else 0
    for k in range(1, 10):
        if top < 1 << (7 * k):
            break
        n += v >= np.uint64(1 << (7 * k))
    return n


def varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints of many uint64 values: (bytes back to back, length of each)."""
    v = values.astype(np.uint64).ravel()
    lengths = varint_length(v)
    width = int(lengths.max()) if len(v) else 1
    groups = ((v[:, None] >> np.arange(0, 7 * width, 7, dtype=np.uint64)) & np.uint64(0x7F)).astype(np.uint8)
    positions = np.arange(width)
    groups[positions[None, :] < (lengths - 1)[:, None]] |= 0x80
    if (lengths == width).all():
        return groups.ravel(), lengths
    return groups[positions[None, :] < lengths[:, None]], lengths


@dataclass
class Ragged:
    """Per-row byte strings of varying length, back to back."""

    data: np.ndarray  # uint8
    lengths: np.ndarray  # int64 per row


Piece = bytes | np.ndarray | Ragged  # same bytes every row | (rows x width) uint8 | ragged
FixedPiece = bytes | np.ndarray  # a piece of rows that all have the same byte layout


def _varint_piece(values: np.ndarray, n: int) -> Piece:
    """Varints of ``values`` (``n`` rows, row-major): a fixed-width matrix when every row
    takes the same number of bytes (the common case: all lengths below 128), else ragged."""
    data, sizes = varints(values)
    row_sizes = sizes.reshape(n, -1).sum(axis=1)
    if (row_sizes == row_sizes[0]).all():
        return data.reshape(n, -1)
    return Ragged(data, row_sizes)


def _length_piece(lengths: np.ndarray | int, n: int) -> Piece:
    """The varint of a per-row length: constant when every row has the same length."""
    if np.ndim(lengths) == 0:
        return varint(int(lengths))
    per_row = np.asarray(lengths)
    first = int(per_row[0])
    if (per_row == first).all():
        return varint(first)
    if per_row.max() < 0x80:  # one byte each, the usual case
        return per_row.astype(np.uint8).reshape(n, 1)
    return _varint_piece(per_row, n)


def _piece_width(piece: Piece) -> np.ndarray | int:
    if isinstance(piece, bytes):
        return len(piece)
    if isinstance(piece, Ragged):
        return piece.lengths
    return piece.shape[1]


# -- Example layout -----------------------------------------------------------------------
def _values_piece(spec: FeatureSpec, values: np.ndarray) -> tuple[bytes, list[Piece]]:
    """(Feature kind tag, value list bytes) of one feature for every row."""
    n = len(values)
    if spec.dtype == "float32":
        raw = np.ascontiguousarray(values, dtype="<f4").reshape(n, -1).view(np.uint8)
        return b"\x12", [b"\x0a" + varint(raw.shape[1]), raw]
    if spec.dtype == "int64":
        packed = _varint_piece(np.ascontiguousarray(values, dtype=np.int64).view(np.uint64), n)
        return b"\x1a", [b"\x0a", _length_piece(_piece_width(packed), n), packed]
    # Strings: one Python join per row (the protobuf layout of text has no fixed shape).
    rows = values.reshape(n, -1)
    encoded = []
    for row in rows:
        parts = []
        for value in row:
            raw_value = value if isinstance(value, bytes) else str(value).encode("utf-8")
            parts.append(b"\x0a" + varint(len(raw_value)) + raw_value)
        encoded.append(b"".join(parts))
    lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=n)
    return b"\x0a", [Ragged(np.frombuffer(b"".join(encoded), dtype=np.uint8), lengths)]


def _total(pieces: Sequence[Piece]) -> np.ndarray | int:
    total: np.ndarray | int = 0
    for piece in pieces:
        total = total + _piece_width(piece)
    return total


def _delimited(tag: bytes, body: list[Piece], n: int) -> list[Piece]:
    return [tag, _length_piece(_total(body), n), *body]


def example_pieces(features: Sequence[FeatureSpec], columns: Sequence[np.ndarray]) -> list[Piece]:
    """The byte pieces of the serialized Example of every row."""
    n = len(columns[0])
    entries: list[Piece] = []
    for spec, values in zip(features, columns, strict=True):
        kind, value_list = _values_piece(spec, values)
        feature = _delimited(kind, value_list, n)
        key = spec.name.encode("utf-8")
        entry = [b"\x0a" + varint(len(key)) + key, *_delimited(b"\x12", feature, n)]
        entries += _delimited(b"\x0a", entry, n)
    return _delimited(b"\x0a", entries, n)


def _copy_columns(out: np.ndarray, start: int, piece: np.ndarray) -> None:
    """``out[:, start:start+w] = piece``, moving each row's ``w`` bytes as one item: far faster
    than a byte-wise copy for the narrow pieces of an Example (4 bytes per float)."""
    width = piece.shape[1]
    item = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(width) or np.dtype(f"V{width}")
    out[:, start:start + width].view(item)[...] = np.ascontiguousarray(piece).view(item)


def _fixed_records(pieces: Sequence[FixedPiece], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every row the same length: a (rows x (12 + width + 4)) matrix with the record bytes in
    place and the TFRecord header and footer columns still to fill, and the mask of record
    columns that come from values (the others are the same in every row)."""
    width = int(_total(pieces))
    template = np.frombuffer(b"".join(p if isinstance(p, bytes) else bytes(p.shape[1]) for p in pieces),
                             dtype=np.uint8)
    out = np.empty((n, _HEAD + width + _TAIL), dtype=np.uint8)
    out[:, _HEAD:_HEAD + width] = template  # constant bytes of all rows in one broadcast copy
    varying = np.zeros(width, dtype=bool)
    offset = 0
    for piece in pieces:
        if isinstance(piece, bytes):
            offset += len(piece)
        else:
            _copy_columns(out, _HEAD + offset, piece)
            varying[offset:offset + piece.shape[1]] = True
            offset += piece.shape[1]
    return out, varying


def _ragged_records(pieces: list[Piece], n: int) -> Ragged:
    """Rows of different lengths, back to back."""
    row_lengths = np.broadcast_to(np.asarray(_total(pieces), dtype=np.int64), (n,)).copy()
    out = np.empty(int(row_lengths.sum()), dtype=np.uint8)
    offset = _exclusive_cumsum(row_lengths)
    for piece in pieces:
        if isinstance(piece, Ragged):
            lengths = piece.lengths
            shift = offset - _exclusive_cumsum(lengths)
            out[np.repeat(shift, lengths) + np.arange(len(piece.data))] = piece.data
        else:
            rows = np.frombuffer(piece, dtype=np.uint8) if isinstance(piece, bytes) else piece
            lengths = rows.shape[-1]
            out[offset[:, None] + np.arange(lengths)] = rows
        offset += lengths
    return Ragged(out, row_lengths)


def _crc_bytes(crc: np.ndarray) -> np.ndarray:
    return mask_crc(crc).astype("<u4").view(np.uint8).reshape(len(crc), 4)


def _length_header(lengths: np.ndarray) -> np.ndarray:
    """The 12-byte TFRecord header of each record: uint64-LE length + its masked CRC."""
    n = len(lengths)
    header = np.empty((n, _HEAD), dtype=np.uint8)
    header[:, :8] = lengths.astype("<u8").view(np.uint8).reshape(n, 8)
    header[:, 8:] = _crc_bytes(crc32c_matrix(header[:, :8]))
    return header


def encode_examples(features: Sequence[FeatureSpec], columns: Sequence[np.ndarray],
                    keep_order: bool = True) -> np.ndarray:
    """TFRecord-framed serialized Examples of all rows of ``columns`` (one array per feature),
    as one contiguous uint8 array (a bytes-like object: write it to a file as it is).

    ``keep_order=False`` lets rows that share a byte layout be written next to each other
    (each group in row order), which saves one copy when a column's values take different
    numbers of bytes (int64 ids, for example)."""
    n = len(columns[0])
    if n == 0:
        return np.empty(0, dtype=np.uint8)
    pieces = _merge_runs(example_pieces(features, columns))
    ragged = [p for p in pieces if isinstance(p, Ragged)]
    if not ragged:
        return _frame_fixed(cast("list[FixedPiece]", pieces), n).reshape(-1)
    # Rows whose variable-length pieces have the same lengths share one fixed layout. When
    # there are few such layouts (an int64 column: at most 10), each group takes the fixed path.
    lengths = np.stack([p.lengths for p in ragged], axis=1)
    keys, first, group = np.unique(_row_keys(lengths), return_index=True, return_inverse=True)
    if len(keys) > _MAX_LAYOUTS:
        return _frame_ragged(pieces, n)
    layouts, group = lengths[first], group.ravel()
    starts = [_exclusive_cumsum(p.lengths) for p in ragged]
    framed = []
    for g, layout in enumerate(layouts):
        rows = np.nonzero(group == g)[0]
        sub: list[FixedPiece] = []
        i = 0  # index among the ragged pieces
        for piece in pieces:
            if isinstance(piece, bytes):
                sub.append(piece)
            elif isinstance(piece, Ragged):
                sub.append(piece.data[starts[i][rows][:, None] + np.arange(int(layout[i]))])
                i += 1
            else:
                sub.append(piece[rows])
        framed.append((rows, _frame_fixed(sub, len(rows))))
    if not keep_order:
        return np.concatenate([matrix.reshape(-1) for _, matrix in framed])
    sizes = np.empty(n, dtype=np.int64)
    for rows, matrix in framed:
        sizes[rows] = matrix.shape[1]
    at = _exclusive_cumsum(sizes)
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    for rows, matrix in framed:
        out[at[rows][:, None] + np.arange(matrix.shape[1])] = matrix
    return out


def _row_keys(lengths: np.ndarray) -> np.ndarray:
    """One integer per row, equal for rows with equal length tuples (rows x pieces)."""
    low = lengths.min(axis=0)
    span = lengths.max(axis=0) - low + 1
    if np.prod(span.astype(np.float64)) < 2.0**62:
        return ((lengths - low) * np.concatenate([[1], np.cumprod(span[:-1])])).sum(axis=1)
    # Too many combinations for one integer: number the distinct rows instead (slower).
    return np.unique(lengths, axis=0, return_inverse=True)[1].ravel()


def _frame_fixed(pieces: Sequence[FixedPiece], n: int) -> np.ndarray:
    """Framed records of rows that all have the same layout: a (rows x framed size) matrix."""
    out, varying = _fixed_records(pieces, n)
    width = len(varying)
    out[:, :_HEAD] = _length_header(np.full(n, width, dtype=np.int64))
    out[:, _HEAD + width:] = _crc_bytes(crc32c_matrix(out[:, _HEAD:_HEAD + width], varying))
    return out


def _frame_ragged(pieces: list[Piece], n: int) -> np.ndarray:
    """Framed records of rows of many different layouts (text columns), back to back."""
    records = _ragged_records(pieces, n)
    lengths = records.lengths
    out = np.empty(len(records.data) + (_HEAD + _TAIL) * n, dtype=np.uint8)
    starts = _exclusive_cumsum(lengths) + (_HEAD + _TAIL) * np.arange(n)
    out[starts[:, None] + np.arange(_HEAD)] = _length_header(lengths)
    data_at = np.repeat(starts + _HEAD - _exclusive_cumsum(lengths), lengths) + np.arange(len(records.data))
    out[data_at] = records.data
    out[(starts + _HEAD + lengths)[:, None] + np.arange(_TAIL)] = _crc_bytes(crc32c_ragged(records.data, lengths))
    return out


def _merge_runs(pieces: list[Piece]) -> list[Piece]:
    """Join neighbouring constant pieces into one."""
    merged: list[Piece] = []
    for piece in pieces:
        if isinstance(piece, bytes) and merged and isinstance(merged[-1], bytes):
            merged[-1] = merged[-1] + piece
        else:
            merged.append(piece)
    return merged


def record_lengths(features: Sequence[FeatureSpec], columns: Sequence[np.ndarray]) -> np.ndarray:
    """Framed size in bytes of each row's record."""
    n = len(columns[0])
    total = _total(example_pieces(features, columns))
    return np.broadcast_to(np.asarray(total, dtype=np.int64), (n,)) + _HEAD + _TAIL
