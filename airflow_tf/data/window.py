"""Partition versions and windows over them.

A prepare per data partition (a day, an hour, a region) commits a version named by its
partition key, with ``"partition"`` in its ``_SUCCESS``. A window version is a version of the
same dataset whose ``_SUCCESS`` lists the shards of the last N partition versions (each shard
entry names the version that holds it): nothing is copied, and a reader of the window reads
exactly those shards."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from datetime import datetime, UTC
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from ..cluster.names import path_component
from ..files import fsync_dir, strip_file_scheme, write_json
from .errors import DataError, DatasetExistsError, DatasetNotReadyError
from .object_store import is_remote
from .schema import FORMAT_VERSION, SCHEMA_FILE, SUCCESS_FILE


def partition_versions(root: Path) -> list[tuple[str, str]]:
    """(partition key, version) of every committed partition version, by partition key."""
    found = []
    if root.is_dir():
        for path in root.iterdir():
            if path.name.startswith(".") or not path.is_dir():
                continue
            try:
                manifest = json.loads((path / SUCCESS_FILE).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(manifest, dict) and manifest.get("partition") is not None:
                found.append((str(manifest["partition"]), path.name))
    return sorted(found)


def _chosen_partitions(root: Path, available: list[tuple[str, str]], last: int | None,
                       partitions: Sequence[str] | None) -> list[tuple[str, str]]:
    """The (key, version) pairs of the window: the given ``partitions`` in key order, else the ``last`` N."""
    by_key = dict(available)
    if partitions is not None:
        missing = [k for k in partitions if str(k) not in by_key]
        if missing:
            raise DataError(f"partitions {missing} of dataset {root} are not prepared (prepared: {', '.join(by_key)})")
        return sorted((str(k), by_key[str(k)]) for k in dict.fromkeys(partitions))
    if last is not None and int(last) >= 1:
        return available[-int(last):]
    raise DataError(f"give last (a number of partitions, at least 1) or partitions (their keys); got last={last!r}")


def _window_root(output: str | os.PathLike, name: str) -> Path:
    """The dataset's directory; a window is a local (or mounted) version beside its partitions."""
    if is_remote(output):
        raise DataError(f"output {os.fspath(output)!r}: a window version is committed beside its partitions with a "
                        "rename, which object storage does not have; keep the partitions on a shared volume (or a "
                        "mount of the bucket) to window them")
    return Path(strip_file_scheme(output)) / path_component(str(name))


def _check_alike(chosen: list[tuple[str, str]], manifests: list[dict], schemas: list[str]) -> None:
    """A window is one dataset: every partition with the first one's schema and compression."""
    for (key, _), manifest, schema in zip(chosen, manifests, schemas, strict=True):
        if json.loads(schema) != json.loads(schemas[0]):
            raise DataError(f"partition {key!r} has another schema than partition {chosen[0][0]!r}; "
                            "a window needs one schema: prepare the partitions with the same schema")
        if manifest.get("compression") != manifests[0].get("compression"):
            raise DataError(f"partition {key!r} is compressed differently from partition {chosen[0][0]!r}; "
                            "a window needs one compression")


def _joined_splits(chosen: list[tuple[str, str]], manifests: list[dict]) -> dict[str, Any]:
    """Each split's shards of every chosen partition (each naming the version it lies in), and
    their examples summed."""
    splits: dict[str, Any] = {}
    for (_, v), manifest in zip(chosen, manifests, strict=True):
        for split, info in manifest["splits"].items():
            entry = splits.setdefault(split, {"examples": 0, "shards": []})
            entry["shards"] += [{**shard, "version": shard.get("version", v)} for shard in info["shards"]]
            entry["examples"] += info["examples"]
    return splits


def make_window(  # noqa: PLR0917  public signature: callers pass these positionally
    output: str | os.PathLike,
    name: str,
    last: int | None = None,
    partitions: Sequence[str] | None = None,
    version: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Commit a version of dataset ``name`` made of the shards of its ``last`` N partition
    versions (or of the given ``partitions`` keys), without copying them. The version is
    named ``window-<first key>--<last key>`` unless ``version`` is given. Returns the same
    summary as :func:`~airflow_tf.data.prepare_dataset`, plus ``partitions``."""
    root = _window_root(output, name)
    available = partition_versions(root)
    if not available:
        raise DatasetNotReadyError(f"dataset {root} has no partition versions; prepare partitions first "
                                   "(prepare_dataset(..., partition_key=...))")
    chosen = _chosen_partitions(root, available, last, partitions)
    manifests = [json.loads((root / v / SUCCESS_FILE).read_text(encoding="utf-8")) for _, v in chosen]
    schemas = [(root / v / SCHEMA_FILE).read_text(encoding="utf-8") for _, v in chosen]
    _check_alike(chosen, manifests, schemas)
    version_name = version or path_component(f"window-{chosen[0][0]}--{chosen[-1][0]}")
    if path_component(version_name) != version_name:
        raise DataError(f"version {version_name!r} is not a valid directory name")
    final = root / version_name
    if final.exists() and not overwrite:
        raise DatasetExistsError(f"dataset version {final} already exists; choose another version or overwrite it")
    splits = _joined_splits(chosen, manifests)
    from .versions import commit  # the same atomic commit as a prepared version

    temporary = root / f".tmp-{version_name}-{uuid.uuid4().hex[:12]}"
    temporary.mkdir()
    try:
        (temporary / SCHEMA_FILE).write_text(schemas[0], encoding="utf-8")
        manifest = {
            "format_version": FORMAT_VERSION, "name": str(name), "version": version_name,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "compression": manifests[0].get("compression"), "splits": splits,
            "window": [{"partition": key, "version": v} for key, v in chosen],
            "source": {"rows": sum(m["source"]["rows"] for m in manifests)},
        }
        write_json(temporary / SUCCESS_FILE, manifest)
        fsync_dir(temporary)
        commit(temporary, final, overwrite)
    finally:
        if temporary.exists():
            shutil.rmtree(temporary, ignore_errors=True)
    return {
        "dataset_uri": str(final.resolve()), "name": str(name), "version": version_name,
        "counts": {split: info["examples"] for split, info in splits.items()},
        "shards": {split: len(info["shards"]) for split, info in splits.items()},
        "compression": manifests[0].get("compression"), "schema": json.loads(schemas[0]),
        "rows": manifest["source"]["rows"], "partitions": [key for key, _ in chosen],
    }
