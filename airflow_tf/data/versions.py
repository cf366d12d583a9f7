"""Dataset versions under ``<output>/<name>``: listing and naming them, and committing a finished
temporary directory as one, atomically (``_SUCCESS`` last, then a rename)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any
from collections.abc import Callable

from ..cluster.names import is_name, path_component
from ..files import fsync_dir, write_json
from . import object_store
from .errors import DataError, DatasetExistsError
from .object_store import StorageOptions
from .schema import SUCCESS_FILE

log = logging.getLogger("airflow_tf.data.prepare")  # the prepare step's logger (its name before the split)
_STALE_AFTER = 24 * 3600.0  # seconds after which a temporary directory is taken as abandoned


def check_dataset_name(name: Any) -> str:
    """``name`` when it names a dataset (a non-empty string: it becomes the directory of every
    version and the asset's name); else a DataError saying what was given."""
    if is_name(name):
        return name
    raise DataError(f"name: expected a dataset name (a non-empty string), got {name!r}")


def existing_versions(root: Path | str, storage_options: StorageOptions | None = None) -> list[int]:
    """Integer versions under ``<output>/<name>`` (a directory, or an object-storage prefix)."""
    if isinstance(root, str):
        return sorted(int(n) for n in object_store.child_directories(root, storage_options) if n.isdigit())
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


def resolve_version_name(version: int | str | None, root: Path | None) -> str:
    if version is None:
        assert root is not None, "the next version is counted under a root"
        versions = existing_versions(root)
        return str(versions[-1] + 1 if versions else 1)
    text = str(version)
    if not text or path_component(text) != text:
        raise DataError(
            f"version {text!r} is not a valid directory name; use letters, digits, '_', '-', '=' or '.' "
            "(an integer such as 3 is recommended)"
        )
    return text


def make_root(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-test-{uuid.uuid4().hex}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise DataError(
            f"cannot write to the output directory {root}: {exc.strerror or exc}; "
            "choose a writable output directory or fix its permissions"
        ) from None


def remove_stale_temporaries(root: Path | str, storage_options: StorageOptions | None = None) -> None:
    """Delete temporary directories (or, in object storage, staged uploads) that a killed
    prepare run (SIGKILL, lost node) left behind. Only old ones: a younger one may belong to a
    run still in progress."""
    if isinstance(root, str):
        try:
            for child in object_store.abandoned_children(root, ".tmp-", _STALE_AFTER, storage_options):
                log.info("Deleting %s, staged by a prepare that did not finish", object_store.join(root, child))
                object_store.delete(object_store.join(root, child), storage_options)
        except DataError as exc:  # tidying up must not fail the prepare that does it
            log.warning("Could not delete an abandoned staged upload: %s", exc)
        return
    now = time.time()
    for path in [*root.glob(".tmp-*"), *root.glob(".trash-*")]:
        try:
            if now - path.stat().st_mtime > _STALE_AFTER:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def _rename_into(temporary: Path, final: Path) -> bool:
    """Rename the finished directory to ``final``; False if a version took that name first
    (a committed version is never empty, so rename cannot replace it)."""
    try:
        os.rename(temporary, final)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise
    return True


def commit(temporary: Path, final: Path, overwrite: bool) -> None:
    if final.exists() and overwrite:
        trash = final.with_name(f".trash-{final.name}-{uuid.uuid4().hex[:8]}")
        os.rename(final, trash)
        os.rename(temporary, final)
        shutil.rmtree(trash, ignore_errors=True)
    elif not _rename_into(temporary, final):
        raise DatasetExistsError(f"dataset version {final} was created while this one was being written")
    fsync_dir(final.parent)


def commit_next(temporary: Path, root: Path, first: int, write_marker: Callable[[str], None]) -> str:
    """Commit as the next free integer version. Concurrent runs of one dataset each get their
    own: whoever renames first takes a number, the others move on to the next one."""
    number = first
    while True:
        write_marker(str(number))
        if _rename_into(temporary, root / str(number)):
            fsync_dir(root)
            return str(number)
        number = max([number, *existing_versions(root)]) + 1


def refuse_existing(final: Path, version: int | str | None, overwrite: bool) -> None:
    if version is not None and final.exists() and not overwrite:
        raise DatasetExistsError(
            f"dataset version {final} already exists; choose another version, leave the version "
            "out to get the next one, or ask to overwrite it"
        )


def commit_version(temporary: Path, root: Path, version_name: str, manifest: dict[str, Any], *,
                   explicit: bool, overwrite: bool) -> str:
    """Write ``_SUCCESS`` last and rename the finished directory into place: as the asked
    version, or as the next free integer one. Returns the version committed."""
    def write_marker(committed_as: str) -> None:  # last: marks the dataset complete
        manifest["version"] = committed_as
        write_json(temporary / SUCCESS_FILE, manifest)
        fsync_dir(temporary)

    if not explicit:
        return commit_next(temporary, root, int(version_name), write_marker)
    write_marker(version_name)
    commit(temporary, root / version_name, overwrite)
    return version_name
