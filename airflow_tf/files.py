"""The one leaf helper every room may import: local paths from ``file://`` URIs, atomic writes
of files others read (temporary name beside the target, then rename), fsync, JSON, and opening
a file below a directory without following a link (:func:`open_beneath`).

It imports nothing of the project, nor Airflow or TensorFlow."""

from __future__ import annotations

import errno
import json
import os
import stat
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
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


def _json_text(data: Any, default: Callable[[Any], Any] | None = None) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, default=default) + "\n"


def write_json(path: str | os.PathLike[str], data: Any, *, fsync: bool = True,
               default: Callable[[Any], Any] | None = None) -> Path:
    """``data`` as indented, key-sorted UTF-8 JSON, written atomically."""
    return atomic_write_text(path, _json_text(data, default), fsync=fsync)


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


# -- opening files below a directory, following no link --------------------------------------
# A path checked and then opened by name can be swapped for a link in between; a file reached
# through a symbolic link, a ``..`` or a hard link can be another directory's file. These open
# one component at a time from an open directory (``dir_fd``), never following a symbolic link,
# and check the file actually opened: whatever the path says later, the descriptor is the file.

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted under the name does not hang the open (it is then refused).
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NOT_FOLLOWED = (errno.ELOOP, errno.EMLINK, errno.ENOTDIR)  # EMLINK: the BSDs' answer to O_NOFOLLOW


class UnsafePathError(ValueError):
    """A path that is not read as it is written: a symbolic link, ``.`` or ``..`` in it, or a
    file that is hard-linked or not a regular file."""


def path_parts(relative: str) -> list[str]:
    """The names in ``relative`` (``/``-separated; empty names from ``//`` dropped); ``.`` and
    ``..`` are refused: the kernel would resolve them after a link, not as the path reads."""
    parts = [part for part in relative.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise UnsafePathError(f"{relative!r}: '.' and '..' are not followed; give the path without them")
    return parts


def plain_absolute_path(uri: str | os.PathLike[str]) -> str:
    """``uri`` (a path or ``file://`` URI) as an absolute path with no ``.``, ``..`` or empty
    names: one that reads as the kernel resolves it, unless it crosses a symbolic link (which
    :func:`open_beneath` refuses). Anything else is an :class:`UnsafePathError` naming it."""
    if not isinstance(uri, (str, os.PathLike)):
        raise UnsafePathError(f"expected a path, got {type(uri).__name__} {uri!r}")
    text = strip_file_scheme(uri)
    if not is_local(text):
        raise UnsafePathError(f"{text!r}: not a local path")
    if not text.startswith("/"):
        raise UnsafePathError(f"{text!r}: not an absolute path (each process would resolve it from its own "
                              "working directory); give the absolute path")
    return "/" + "/".join(path_parts(text))


def open_beneath(root: str | int, relative: str, *, directory: bool = False,
                 create_directories: bool = False) -> int:
    """A descriptor of ``relative`` below ``root`` (a path, opened as it is: the trusted part, or a
    directory descriptor, not closed here), opened one name at a time without following a
    symbolic link. A file must be a regular file with one link (a hard link would be another
    directory's file); ``directory``: open a directory instead. ``create_directories``: make the
    missing directories on the way (and, with ``directory``, the last one). Raises
    :class:`UnsafePathError` for a link, ``..``, a hard-linked or special file, else OSError
    (FileNotFoundError when a name is missing). The caller closes the descriptor."""
    parts = path_parts(relative)
    fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW) if isinstance(root, str) else os.dup(root)
    base = f"{root.rstrip('/')}/" if isinstance(root, str) else ""  # for messages: the path as given
    try:
        for index, name in enumerate(parts):
            last = index == len(parts) - 1
            want_dir = directory or not last
            where = base + "/".join(parts[:index + 1])
            if want_dir and create_directories:
                with suppress(FileExistsError):
                    os.mkdir(name, dir_fd=fd)
            try:
                child = os.open(name, _DIR_FLAGS if want_dir else _FILE_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in _NOT_FOLLOWED:
                    raise
                raise UnsafePathError(f"{where} is a symbolic link{' or not a directory' if want_dir else ''}: "
                                      "not followed") from None
            os.close(fd)
            fd = child
        if not directory:
            if not parts:
                raise UnsafePathError(f"{relative!r}: names no file")
            check_single_file(fd, base + "/".join(parts))
        return fd
    except BaseException:
        os.close(fd)
        raise


def check_single_file(fd: int, what: str) -> os.stat_result:
    """The status of the open file ``fd``, refused unless it is a regular file with one link."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePathError(f"{what} is not a regular file: not read")
    if info.st_nlink != 1:
        raise UnsafePathError(f"{what} has {info.st_nlink} hard links (another directory's file may be one of "
                              "them): not read")
    return info


READ_LIMIT = 1 << 20
"""The most :func:`read_beneath` reads: the small JSON records and reports it is for."""


def read_beneath(root: str | int, relative: str, *, limit: int = READ_LIMIT) -> bytes:
    """The bytes of file ``relative`` below ``root``, opened by :func:`open_beneath`; a file
    larger than ``limit`` is an :class:`UnsafePathError`."""
    fd = open_beneath(root, relative)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise UnsafePathError(f"{relative} is larger than {limit} bytes: not read")
    return data


def read_json_beneath(root: str | int, relative: str) -> Any:
    """The JSON in file ``relative`` below ``root`` (see :func:`read_beneath`); a file that is
    not JSON is a ValueError naming it."""
    try:
        return json.loads(read_beneath(root, relative).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{relative}: not valid JSON ({exc})") from exc


def write_json_at(dir_fd: int, name: str, data: Any, *, fsync: bool = True) -> None:
    """``data`` as :func:`write_json` writes it, as ``name`` in the open directory ``dir_fd``:
    a temporary file created there exclusively, then renamed over ``name`` (which replaces a
    link planted under that name instead of writing through it)."""
    tmp = f".{name}.tmp-{uuid.uuid4().hex[:8]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(_json_text(data))
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        if fsync:
            os.fsync(dir_fd)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
