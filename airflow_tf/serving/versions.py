"""The TensorFlow Serving layout: ``<serving_base>/<model_name>/<integer version>/``.

TF Serving loads every child directory whose name is an integer and ignores the rest, so an
export is built under a ``.tmp-*`` name beside the versions and renamed into place only once
it is complete and verified: a half-written export is never visible. Pure Python: no TensorFlow."""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import shutil
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from airflow_tf.cluster import path_component

from airflow_tf.files import local_path, read_json

METADATA_FILE = Path("assets.extra") / "airflow_tf.json"
"""Where an export records its run, checkpoint, dataset, metrics and training options."""
WARM_START_DIR = Path("assets.extra") / "checkpoint"
"""A copy of the exported checkpoint, so a later run can warm-start from the export alone."""
STAGING_PREFIX = ".tmp-"
STALE_STAGING_SECONDS = 24 * 3600
"""Staging directories older than this were left by an export that died; they are removed."""


def model_dir(serving_base: str | os.PathLike[str], model_name: str) -> Path:
    """``<serving_base>/<model_name>``, with the model name made a safe path component."""
    if not str(model_name).strip():
        raise ValueError("model_name: a model name is required (it becomes a directory under serving_base)")
    return local_path(serving_base, "serving_base") / path_component(model_name)


def list_versions(directory: str | os.PathLike[str]) -> list[int]:
    """The integer versions in a model directory, ascending (what TF Serving would load)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())


def read_metadata(export_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The export's ``assets.extra/airflow_tf.json``, or {} for a SavedModel made elsewhere."""
    path = Path(export_path) / METADATA_FILE
    if not path.is_file():
        return {}
    metadata = read_json(path)
    warm = Path(export_path) / WARM_START_DIR
    if warm.is_dir():
        metadata["warm_start_from"] = str(warm)
    return metadata


def latest_export(serving_base: str | os.PathLike[str], model_name: str) -> dict[str, Any] | None:
    """The highest version of a model, ``{"version", "path", "metadata"}`` (JSON, fit for
    XCom), or None if it has none.

    ``metadata["warm_start_from"]`` (when present) is a checkpoint directory inside the export
    that a new training run can start from (``TrainingConfig.warm_start_from``)."""
    directory = model_dir(serving_base, model_name)
    versions = list_versions(directory)
    if not versions:
        return None
    path = directory / str(versions[-1])
    return {"version": versions[-1], "path": str(path), "metadata": read_metadata(path)}


@contextmanager
def staging_dir(directory: Path) -> Iterator[Path]:
    """A fresh hidden directory inside ``directory`` to build an export in; removed on exit
    unless it was published (renamed away) meanwhile."""
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(directory)
    path = directory / f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)


def publish(staged: Path, directory: Path, max_attempts: int = 100) -> tuple[int, Path]:
    """Rename a complete export to the next free integer version in ``directory``.

    Never replaces an existing version: when another export takes the version between the
    listing and the rename, the rename fails (the target is not empty) and the next one is tried."""
    for _ in range(max_attempts):
        versions = list_versions(directory)
        version = versions[-1] + 1 if versions else 1
        target = directory / str(version)
        if target.exists():  # a non-directory or stray entry with an integer name
            version = _next_free(directory, version)
            target = directory / str(version)
        try:
            _rename_no_replace(staged, target)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                continue
            raise
        return version, target
    raise RuntimeError(
        f"{directory}: could not find a free version after {max_attempts} attempts; "
        "another process keeps creating versions there"
    )


def _rename_no_replace(source: Path, target: Path) -> None:
    """``rename`` that fails with EEXIST instead of replacing an (empty) target directory:
    Linux ``renameat2(RENAME_NOREPLACE)`` where the file system supports it."""
    libc = _libc()
    if libc is not None:
        at_fdcwd, rename_noreplace = -100, 1
        if libc.renameat2(at_fdcwd, os.fsencode(source), at_fdcwd, os.fsencode(target), rename_noreplace) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(err, os.strerror(err), str(target))
    os.rename(source, target)


@functools.cache
def _libc() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        return libc
    except (OSError, AttributeError):
        return None


def _next_free(directory: Path, version: int) -> int:
    while (directory / str(version)).exists():
        version += 1
    return version


def _remove_stale_staging(directory: Path) -> None:
    cutoff = time.time() - STALE_STAGING_SECONDS
    for entry in directory.iterdir():
        if entry.name.startswith(STAGING_PREFIX) and entry.is_dir():
            try:
                if entry.stat().st_mtime < cutoff:
                    shutil.rmtree(entry, ignore_errors=True)
            except FileNotFoundError:
                pass
