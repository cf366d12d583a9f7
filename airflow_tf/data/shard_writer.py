"""Writing encoded groups of records into the shard files of each split, and naming and
syncing them once complete."""

from __future__ import annotations

import math
import shutil
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from ..files import fsync_dir, fsync_file
from .sharding import shard_name
from .zlib_stream import ZLIB_END, ZLIB_HEADER, DeflatePiece, adler32_combine

MIN_GROUP_ROWS = 64  # rows encoded at once at least: fewer cost more in NumPy call overhead
_MAX_GROUPS = 64  # shards one block's rows are dealt over at most (the next block goes on from there)
_OPEN_FILES = 64  # shard files kept open while writing


class ShardWriter:
    """Appends encoded groups to the shard files of every split as they arrive.

    Each split has a fixed number of files; a block's rows are dealt out over them in groups
    (so every file gets rows from all over the input). At most ``_OPEN_FILES`` stay open."""

    def __init__(self, directory: Path, counts: dict[str, int], compression: str | None) -> None:
        self.directory, self.counts, self.compression = directory, counts, compression
        self.examples = {split: [0] * n for split, n in counts.items()}
        self.bytes = {split: [0] * n for split, n in counts.items()}
        self._next = dict.fromkeys(counts, 0)
        self._open: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self._adler: dict[tuple[str, int], int] = {}  # zlib: the Adler-32 of each shard's records so far
        for split in counts:
            directory.joinpath(split).mkdir()

    def deal(self, split: str, rows: np.ndarray, group_rows: int) -> list[tuple[int, np.ndarray]]:
        """(shard, rows) groups of a block's rows of ``split``: over as many shards as the rows
        allow (groups of ``MIN_GROUP_ROWS`` to ``group_rows`` rows, ``_MAX_GROUPS`` shards unless
        the groups need more), going on from the shard where the last block stopped."""
        count = self.counts[split]
        groups = max(math.ceil(len(rows) / group_rows), min(count, len(rows) // MIN_GROUP_ROWS, _MAX_GROUPS), 1)
        first = self._next[split]
        self._next[split] = (first + groups) % count
        return [((first + i) % count, part) for i, part in enumerate(np.array_split(rows, groups)) if len(part)]

    def _path(self, split: str, shard: int) -> Path:
        return self.directory / split / shard_name(shard, self.counts[split], self.compression)

    def write(self, split: str, shard: int, rows: int, data: bytes | np.ndarray | DeflatePiece) -> None:
        handle = self._open.pop((split, shard), None)
        if handle is None:
            if len(self._open) >= _OPEN_FILES:
                self._open.popitem(last=False)[1].close()
            # Kept open across blocks (at most _OPEN_FILES at once); close() and finish() close them.
            handle = open(self._path(split, shard), "ab")  # noqa: SIM115
        self._open[(split, shard)] = handle
        if isinstance(data, DeflatePiece):
            if (split, shard) not in self._adler:
                self._adler[(split, shard)] = 1  # the Adler-32 of nothing
                self._append(handle, split, shard, ZLIB_HEADER)
            self._adler[(split, shard)] = adler32_combine(self._adler[(split, shard)], data.adler, data.size)
            data = data.data
        self._append(handle, split, shard, data)
        self.examples[split][shard] += rows

    def _append(self, handle: Any, split: str, shard: int, data: bytes | np.ndarray) -> None:
        handle.write(data)
        self.bytes[split][shard] += len(data)

    def _end_zlib_streams(self) -> None:
        """Close each zlib shard's stream: the final block and the records' Adler-32."""
        for (split, shard), adler in self._adler.items():
            with open(self._path(split, shard), "ab") as handle:
                self._append(handle, split, shard, ZLIB_END + adler.to_bytes(4, "big"))
        self._adler.clear()

    def close(self) -> None:
        for handle in self._open.values():
            handle.close()
        self._open.clear()

    def finish(self) -> dict[str, Any]:
        """Close, drop files that got no rows, name the rest ``part-i-of-n``, fsync; returns the
        manifest's ``splits``."""
        self.close()
        self._end_zlib_streams()
        manifest: dict[str, Any] = {}
        for split, count in self.counts.items():
            kept = [i for i in range(count) if self.examples[split][i]]
            if not kept:
                shutil.rmtree(self.directory / split)
                continue
            shards = []
            for new, old in enumerate(kept):
                # A shard that got no rows has no file (files open on their first write).
                source = self._path(split, old)
                name = shard_name(new, len(kept), self.compression)
                if source.name != name:  # "-of-n" differs, so no kept file has the new name yet
                    source = source.rename(source.with_name(name))
                fsync_file(source)
                shards.append({"file": name, "examples": self.examples[split][old], "bytes": self.bytes[split][old]})
            fsync_dir(self.directory / split)
            manifest[split] = {"examples": sum(s["examples"] for s in shards), "shards": shards}
        return manifest
