"""A dataset version in object storage (``s3://``, ``gs://``): prepared in a local staging
directory, then uploaded with ``_SUCCESS`` last, or swapped in for the version it replaces."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from collections.abc import Callable

from ..cluster.names import path_component
from ..files import write_json
from . import object_store
from .cache import reuse_cached
from .errors import DataError, DatasetExistsError
from .object_store import StorageOptions
from .progress import rate
from .schema import SUCCESS_FILE
from .versions import existing_versions, remove_stale_temporaries, resolve_version_name

log = logging.getLogger("airflow_tf.data.prepare")  # the prepare step's logger (its name before the split)


def prepare_into_object_storage(output: str, name: str, version: int | str | None, *, overwrite: bool,
                                fingerprint: str | None, storage_options: StorageOptions | None,
                                stage: Callable[..., dict[str, Any]], started: float) -> dict[str, Any]:
    """A version in ``s3://``/``gs://``: prepared by ``stage`` (:func:`prepare_dataset` with the
    other options) into a local staging directory, then uploaded with ``_SUCCESS`` last. A
    store has no rename: the marker is the commit, and readers refuse a version without it."""
    root = object_store.join(output, path_component(name))
    if fingerprint:
        reused = reuse_cached(root, name, fingerprint, started, storage_options)
        if reused is not None:
            return reused
    versions = existing_versions(root, storage_options)
    version_name = str(versions[-1] + 1 if versions else 1) if version is None else resolve_version_name(version, None)
    final = object_store.join(root, version_name)
    if object_store.exists(final, storage_options) and not overwrite:
        raise DatasetExistsError(
            f"dataset version {final} already exists; choose another version, leave the version "
            "out to get the next one, or ask to overwrite it"
        )
    remove_stale_temporaries(root, storage_options)
    staging = Path(tempfile.mkdtemp(prefix="airflow-tf-stage-"))
    try:
        summary = stage(staging, name, version=version_name)
        local = Path(summary["dataset_uri"])
        if fingerprint:  # the staged run had nothing to compare with: the manifest records it here
            manifest = json.loads((local / SUCCESS_FILE).read_text(encoding="utf-8"))
            write_json(local / SUCCESS_FILE, {**manifest, "fingerprint": fingerprint})
        replacing = overwrite and object_store.exists(final, storage_options)
        # The version being replaced stays whole until the new one is in the store: it is
        # uploaded beside it (a name no reader takes for a version), then copied in there.
        target = object_store.join(root, f".tmp-{version_name}-{uuid.uuid4().hex[:12]}") if replacing else final
        size = sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
        log.info("Uploading dataset version %s (%.1f MB) to %s", version_name, size / 1e6, target)
        try:
            uploaded = sum(1 for _ in object_store.upload_tree(local, target, storage_options, last=SUCCESS_FILE))
        except DataError as exc:
            left = _remove_partial_upload(target, storage_options)
            raise DataError(f"{exc}; {left}" + (f"; {final} is as it was" if replacing else "")) from None
        if replacing:
            _replace_version(target, final, storage_options)
        log.info("Uploaded %d files; %s is committed", uploaded, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    seconds = time.monotonic() - started
    return {**summary, "dataset_uri": final, "seconds": round(seconds, 3), "rows_per_sec": rate(summary["rows"], seconds),
            **({"fingerprint": fingerprint} if fingerprint else {})}


def _replace_version(staged: str, final: str, storage_options: StorageOptions | None) -> None:
    """Swap an uploaded version in for the one at ``final``: delete that (``_SUCCESS`` first),
    copy the staged objects in (``_SUCCESS`` last), then delete the staged ones."""
    object_store.delete(final, storage_options)
    try:
        object_store.copy_tree(staged, final, storage_options, last=SUCCESS_FILE)
    except DataError as exc:
        raise DataError(f"{exc}; the new version is complete under {staged}: prepare again with overwrite, "
                        f"or copy it to {final} (_SUCCESS last)") from None
    object_store.delete(staged, storage_options)


def _remove_partial_upload(final: str, storage_options: StorageOptions | None) -> str:
    """Delete what a failed upload wrote (it has no ``_SUCCESS``, so no reader takes it, but it
    would hold the version number); says what is left."""
    try:
        object_store.delete(final, storage_options)
    except DataError:
        return (f"the files uploaded so far are still under {final} without _SUCCESS (readers refuse them): "
                "delete them, or prepare that version again with overwrite")
    return f"nothing is left under {final}; prepare again"
