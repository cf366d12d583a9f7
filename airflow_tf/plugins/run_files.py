"""How the mounted TensorBoard reads the runs' event files: each one opened below its runs
directory by :func:`airflow_tf.files.open_beneath` (no symbolic link or ``..`` on the way, a
regular file with one link), then read from that descriptor only.

TensorBoard's own loader opens an event file by its path, in a background thread, every few
seconds; a check made on the path at request time says nothing of what it opened. Here the
check is the open: whatever the path is swapped for later (a link to another run's events, a
hard link), the loader reads the file it checked, and a file it refused is never read.

TensorBoard is imported when the mount builds it (:func:`checked_data_provider`), not with this module."""

from __future__ import annotations

import functools
import logging
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from airflow_tf.files import open_beneath

from .access import log_once

log = logging.getLogger(__name__)


@functools.cache
def _crc32c() -> Callable[[bytes], int]:
    """CRC-32C: the C library when installed (google-crc32c), else TensorBoard's own, in Python."""
    try:
        import google_crc32c
    except ImportError:  # the Airflow image may lack it
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c

        return crc32c
    return lambda data: int(google_crc32c.value(data))


def _masked_crc(data: bytes) -> int:
    """The checksum TFRecord files store (CRC-32C, rotated and offset)."""
    crc = _crc32c()(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_HEADER = struct.Struct("<QI")  # record length, its masked CRC
_FOOTER = struct.Struct("<I")  # the data's masked CRC


class CheckedEventFileLoader:
    """TensorBoard's event file loader (``Load()`` yields the file's new events, migrated as
    TensorBoard's ``EventFileLoader`` does) over the file ``relative`` below ``root``, opened
    by :func:`open_beneath` at the first ``Load()`` that finds it acceptable and read from that
    descriptor from then on. A refused file yields nothing (logged once) and is tried again at
    the next ``Load()``: a link replaced by the run's own file is then read."""

    def __init__(self, root: str, relative: str) -> None:
        self._root = root
        self._relative = relative
        self._file: BinaryIO | None = None
        self._offset = 0
        self._broken = False
        self._initial_metadata: dict[str, Any] = {}  # per tag, for dataclass_compat

    def _opened(self) -> BinaryIO | None:
        if self._file is None:
            try:
                self._file = os.fdopen(open_beneath(self._root, self._relative), "rb")
            except FileNotFoundError:
                return None
            except (OSError, ValueError) as exc:
                log_once(("event file", self._root, self._relative, str(exc)),
                         "TensorBoard does not read %s/%s: %s", self._root, self._relative, exc)
                return None
        return self._file

    def Load(self) -> Iterator[Any]:
        from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
        from tensorboard import data_compat, dataclass_compat
        from tensorboard.compat.proto import event_pb2

        handle = None if self._broken else self._opened()
        if handle is None:
            return
        while (record := self._next_record(handle)) is not None:
            try:
                event = event_pb2.Event.FromString(record)
            except DecodeError as exc:
                self._stop(f"a record that is not an event ({exc})")
                return
            yield from dataclass_compat.migrate_event(data_compat.migrate_event(event), self._initial_metadata)

    def _next_record(self, handle: BinaryIO) -> bytes | None:
        """The next whole record after the last one read, or None (none yet: a record being
        written is read at a later Load)."""
        handle.seek(self._offset)
        header = handle.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None
        length, length_crc = _HEADER.unpack(header)
        if _masked_crc(header[:8]) != length_crc:
            self._stop(f"a corrupt record header at byte {self._offset}")
            return None
        body = handle.read(length + _FOOTER.size)
        if len(body) < length + _FOOTER.size:
            return None
        data = body[:length]
        if _masked_crc(data) != _FOOTER.unpack(body[length:])[0]:
            self._stop(f"a corrupt record at byte {self._offset}")
            return None
        self._offset += _HEADER.size + len(body)
        return data

    def _stop(self, why: str) -> None:
        self._broken = True
        log.warning("TensorBoard stops reading %s/%s at %s", self._root, self._relative, why)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __del__(self) -> None:
        self.close()


@functools.cache
def _checked_multiplexer_class() -> type:
    """TensorBoard's multiplexer whose runs' event files are loaded by :class:`CheckedEventFileLoader`
    (built on first use: TensorBoard's classes are imported then)."""
    from tensorboard.backend.event_processing import (directory_watcher, io_wrapper, plugin_event_accumulator,
                                                      plugin_event_multiplexer)

    class _CheckedAccumulator(plugin_event_accumulator.EventAccumulator):
        """TensorBoard's accumulator for run directory ``relative`` below ``root``, its event files
        loaded by :class:`CheckedEventFileLoader` (in their order, as TensorBoard's watcher does)."""

        def __init__(self, root: str, relative: str, path: str, **options: Any) -> None:
            # For a directory, TensorBoard's generator is a watcher that has read nothing yet; it is
            # replaced before anything loads.
            super().__init__(path, **options)
            self._generator = directory_watcher.DirectoryWatcher(
                path, lambda file: CheckedEventFileLoader(root, f"{relative}/{os.path.basename(file)}"),
                io_wrapper.IsSummaryEventsFile)

    class _CheckedMultiplexer(plugin_event_multiplexer.EventMultiplexer):
        """TensorBoard's multiplexer whose runs are :class:`_CheckedAccumulator` s of the roots'
        directories."""

        def __init__(self, roots: dict[str, str], **options: Any) -> None:
            super().__init__(**options)
            self._roots = roots

        def _below_root(self, path: str) -> tuple[str, str] | None:
            for root in self._roots.values():
                if path.startswith(root.rstrip("/") + "/"):
                    return root, path[len(root.rstrip("/")) + 1:].strip("/")
                if path.rstrip("/") == root.rstrip("/"):
                    return root, ""
            return None

        def AddRun(self, path: str, name: str | None = None) -> Any:
            # As TensorBoard's AddRun, with the checked accumulator; a directory named like an
            # event file (TensorBoard would open it as one) or outside the roots is no run.
            name = name or path
            found = self._below_root(path)
            if found is None or io_wrapper.IsSummaryEventsFile(path):
                log_once(("run", path), "TensorBoard leaves out %s: not a run directory below %s", path,
                         ", ".join(self._roots.values()))
                return self
            accumulator = None
            with self._accumulators_mutex:
                if name not in self._accumulators or self._paths[name] != path:
                    accumulator = _CheckedAccumulator(
                        *found, path, size_guidance=self._size_guidance,
                        tensor_size_guidance=self._tensor_size_guidance, purge_orphaned_data=self.purge_orphaned_data)
                    self._accumulators[name] = accumulator
                    self._paths[name] = path
            if accumulator is not None and self._reload_called:
                accumulator.Reload()
            return self

    return _CheckedMultiplexer


def checked_data_provider(flags: Any, roots: dict[str, str], reload_interval: float) -> Any:
    """TensorBoard's data provider over ``roots`` (prefix -> runs directory, as
    :func:`.links.run_roots`), its event files read through :class:`CheckedEventFileLoader`,
    reloaded every ``reload_interval`` seconds in a daemon thread (which ends once the provider
    is gone). Replaces TensorBoard's ``LocalDataIngester`` for the mount."""
    from tensorboard.backend.event_processing import data_ingester, data_provider
    from tensorboard.compat import tf

    # TensorFlow (or TensorBoard's stand-in for it) resolved here, as TensorBoard's own ingester
    # does when built: the first reload lists the runs at once instead of importing it first.
    getattr(tf, "__version__", None)
    roots = {prefix: os.path.normpath(os.path.expanduser(root)) for prefix, root in roots.items()}
    multiplexer = _checked_multiplexer_class()(
        roots, size_guidance=data_ingester.DEFAULT_SIZE_GUIDANCE,
        tensor_size_guidance={**data_ingester.DEFAULT_TENSOR_SIZE_GUIDANCE, **flags.samples_per_plugin},
        purge_orphaned_data=flags.purge_orphaned_data, max_reload_threads=flags.max_reload_threads)
    _start_reloading(weakref.ref(multiplexer), roots, reload_interval)
    return data_provider.MultiplexerDataProvider(multiplexer, ", ".join(roots.values()))


def reload_once(multiplexer: Any, roots: dict[str, str]) -> None:
    """One pass of the reload: new runs of the roots added, every run's new events loaded."""
    for prefix, root in sorted(roots.items()):
        multiplexer.AddRunsFromDirectory(root, prefix or None)
    multiplexer.Reload()


def _start_reloading(multiplexer: Callable[[], Any], roots: dict[str, str], interval: float) -> None:
    def reload() -> None:
        while (current := multiplexer()) is not None:
            try:
                reload_once(current, roots)
            except Exception:  # one bad pass must not end the reloading for good
                log.exception("TensorBoard could not reload the runs of %s", ", ".join(roots.values()))
            del current
            time.sleep(interval)

    threading.Thread(target=reload, name="airflow-tf TensorBoard reload", daemon=True).start()
