"""The one leaf helper every room may import: local paths from ``file://`` URIs, atomic writes
of files others read (temporary name beside the target, then rename), fsync, JSON.

It imports nothing of the project, nor Airflow or TensorFlow."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

FILE_SCHEME = "file://"


def strip_file_scheme(uri: str | os.PathLike[str]) -> str:
    """``file:///data/x`` -> ``/data/x``; a plain path, or another scheme's URI, as it is."""
    text = os.fspath(uri)
    return text[len(FILE_SCHEME):] if text.startswith(FILE_SCHEME) else text


def is_local(uri: str | os.PathLike[str]) -> bool:
    """A plain path or a ``file://`` URI (not ``gs://``, ``s3://``, ...)."""
    text = os.fspath(uri)
    return text.startswith(FILE_SCHEME) or "://" not in text


# The object stores the training tasks reach through TensorFlow's own file systems (tf.io.gfile in
# TensorFlow 2.19-2.21 has file and gs built in). Its s3 moved to tensorflow-io, whose last release
# (0.37.1) is built for TensorFlow 2.16: its file system plugin does not load on these versions.
TENSORFLOW_SCHEMES = ("gs",)
_MOUNT_HINT = ("mount the bucket (Cloud Storage FUSE, Mountpoint for Amazon S3, a CSI driver, or a "
               "shared volume) and pass its local path")


def training_location_problem(uri: str, what: str) -> str | None:
    """Why the training tasks cannot use ``uri`` as their ``dataset`` or ``run_dir`` (``what``),
    or None when they can: a dataset may be local or in a store TensorFlow reads; a run
    directory, where the tasks also write files of their own (progress, logs, the model's
    code), must be a local or mounted path."""
    if is_local(uri):
        return None
    scheme = uri.split("://", 1)[0].lower()
    if what == "dataset" and scheme in TENSORFLOW_SCHEMES:
        return None
    if what == "dataset" and scheme == "s3":
        return (f"dataset {uri!r}: the training tasks read the dataset through TensorFlow, which has no s3:// "
                "file system (TensorFlow 2.19-2.21; tensorflow-io's does not load on them); prepare it into "
                f"gs:// or a shared directory instead, or {_MOUNT_HINT}")
    if what == "dataset":
        return f"dataset {uri!r}: {scheme}:// is not supported; use a local path or gs://, or {_MOUNT_HINT}"
    return (f"{what} {uri!r}: the tasks write progress, logs and the model's code into it as files, so it must "
            f"be a local or mounted path; {_MOUNT_HINT}")


def local_path(uri: str | os.PathLike[str], what: str = "path") -> Path:
    """A local path from a path or ``file://`` URI; any other scheme is refused, naming ``what``."""
    if not is_local(uri):
        raise ValueError(f"{what} {os.fspath(uri)!r}: only local paths and file:// URIs are supported; "
                         "mount the storage and pass its local path")
    return Path(strip_file_scheme(uri))


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", *, fsync: bool = True) -> Iterator[IO]:
    """Open a temporary file beside ``path``; once the block ends without error it replaces
    ``path`` (readers see the old file or the complete new one), else it is removed. ``fsync``
    makes the content durable before the rename (files that must survive a machine crash)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, mode, encoding=None if "b" in mode else "utf-8") as handle:
            yield handle
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> Path:
    """Write ``data`` so that readers see either the old file or the complete new one."""
    with atomic_open(path, "wb", fsync=fsync) as handle:
        handle.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, fsync: bool = True) -> Path:
    with atomic_open(path, "w", fsync=fsync) as handle:
        handle.write(text)
    return Path(path)


def write_json(path: str | os.PathLike[str], data: Any, *, fsync: bool = True,
               default: Callable[[Any], Any] | None = None) -> Path:
    """``data`` as indented, key-sorted UTF-8 JSON, written atomically."""
    text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, default=default) + "\n"
    return atomic_write_text(path, text, fsync=fsync)


def read_json(path: str | os.PathLike[str], *, missing_ok: bool = False) -> Any:
    """The JSON in ``path`` (None for a missing file with ``missing_ok``); a file that is not
    JSON is an error naming it and what to do."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); delete or regenerate the file") from exc


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file (or, opened the same way, a directory's entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


fsync_dir = fsync_file
