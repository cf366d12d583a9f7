"""Joining separately compressed pieces into one zlib stream, the only form of a ZLIB TFRecord
file TensorFlow reads whole."""

from __future__ import annotations

from dataclasses import dataclass

# A ZLIB file is one zlib stream: TensorFlow's reader stops at the end of the first (it reads
# concatenated gzip members, not concatenated zlib streams: the rest of the file would be lost
# without an error). So each group is compressed on its own into deflate blocks that end on a
# byte boundary with no back-references across groups (a full flush), and the shard's file
# gets the zlib header on its first write and, once complete, an empty final block and the
# Adler-32 of everything, combined from the groups' checksums.
ZLIB_HEADER = b"\x78\x9c"  # deflate, 32 KiB window, default level
ZLIB_END = b"\x03\x00"  # an empty final block (fixed Huffman codes)
_ADLER_BASE = 65521


@dataclass(frozen=True)
class DeflatePiece:
    """One group's records as raw deflate blocks, with the Adler-32 and length of the records."""

    data: bytes
    adler: int
    size: int

    def __len__(self) -> int:
        return len(self.data)


def adler32_combine(first: int, second: int, second_size: int) -> int:
    """The Adler-32 of two byte strings joined, from each one's checksum (zlib's adler32_combine)."""
    rem = second_size % _ADLER_BASE
    low = ((first & 0xFFFF) + (second & 0xFFFF) + _ADLER_BASE - 1) % _ADLER_BASE
    high = (rem * (first & 0xFFFF) + (first >> 16) + (second >> 16) + _ADLER_BASE - rem) % _ADLER_BASE
    return low | (high << 16)
