"""The input cache: a fingerprint of the input files and the options that shape a version, and
the committed version that has it (reused instead of encoding the input again)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from . import object_store
from .inputs import resolve_inputs
from .object_store import StorageOptions, identity, open_binary
from .schema import FORMAT_VERSION, SCHEMA_FILE, SUCCESS_FILE
from .versions import existing_versions

log = logging.getLogger("airflow_tf.data.prepare")  # the prepare step's logger (its name before the split)
_HASH_CHUNK = 8 << 20


def reuse_cached(root: Path | str, name: str, fingerprint: str, started: float,
                 storage_options: StorageOptions | None = None) -> dict[str, Any] | None:
    """The summary of the committed version with this fingerprint (logged as reused), or None."""
    cached = find_cached(root, fingerprint, storage_options)
    if cached is None:
        return None
    log.info("Input of dataset %r unchanged (fingerprint %s): reusing version %s, nothing encoded",
             name, fingerprint, cached["version"])
    return _cached_summary(root, cached, started, storage_options)


def input_fingerprint(inputs: Any, options: dict[str, Any], storage_options: StorageOptions | None = None) -> str:
    """A hash of the input files' names and contents (read in chunks) and of the options that
    shape the output (``PrepareOptions.fingerprint()``): equal fingerprints give equal datasets."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(json.dumps({"format_version": FORMAT_VERSION, **options}, sort_keys=True, default=str).encode())
    for path in resolve_inputs(inputs, storage_options):
        digest.update(f"\0{identity(path)}\0{path.stat().st_size}\0".encode())
        with open_binary(path) as handle:
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _read_text(root: Path | str, *parts: str, storage_options: StorageOptions | None = None) -> str:
    """A file of a dataset's directory, local or in object storage."""
    if isinstance(root, str):
        return object_store.read_text(object_store.join(root, *parts), storage_options)
    return root.joinpath(*parts).read_text(encoding="utf-8")


def find_cached(root: Path | str, fingerprint: str,
                storage_options: StorageOptions | None = None) -> dict[str, Any] | None:
    """The newest committed version of the dataset made from the same input and options."""
    for version in reversed(existing_versions(root, storage_options)):
        try:
            manifest = json.loads(_read_text(root, str(version), SUCCESS_FILE, storage_options=storage_options))
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and manifest.get("fingerprint") == fingerprint:
            return manifest
    return None


def _cached_summary(root: Path | str, manifest: dict[str, Any], started: float,
                    storage_options: StorageOptions | None = None) -> dict[str, Any]:
    version = str(manifest["version"])
    final = object_store.join(root, version) if isinstance(root, str) else str((root / version).resolve())
    splits = manifest["splits"]
    return {
        "dataset_uri": final, "name": manifest["name"], "version": version,
        "counts": {split: info["examples"] for split, info in splits.items()},
        "shards": {split: len(info["shards"]) for split, info in splits.items()},
        "compression": manifest.get("compression"),
        "schema": json.loads(_read_text(root, version, SCHEMA_FILE, storage_options=storage_options)),
        "rows": manifest["source"]["rows"], "sources": manifest["source"].get("files", []),
        "seconds": round(time.monotonic() - started, 3), "rows_per_sec": None,
        "cached": True, "fingerprint": manifest["fingerprint"],
    }
