"""One dataset version written by several parts in parallel, then committed in one step.

``plan_parts`` decides the schema once (declared, or inferred from the first block of every
input file) and gives each part a share of the input files, balanced by size. Each
``prepare_part`` (an Airflow mapped task, a pod, any process) streams its files into a
directory of its own and marks it complete last. ``commit_parts`` checks that every part is
complete and intact, links their shard files into one version with one ``_SUCCESS``, and
commits it exactly as a single prepare does. A part that failed or was killed has no marker:
the commit refuses, and no version appears.

Each row's split is a hash of (file, row number, seed), independent of which part reads it,
so the committed version holds the same records per split as one ``prepare_dataset`` call."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import uuid
from datetime import datetime, UTC
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

from ..cluster.names import path_component
from ..deprecation import renamed
from ..files import fsync_dir, read_json, strip_file_scheme, write_json
from .errors import DataError, DatasetExistsError
from .inputs import open_inputs, resolve_inputs
from .object_store import InputPath, StorageOptions, is_remote
from .options import PrepareOptions, with_label
from .progress import Progress, Reporter
from .sharding import shard_name
from .split import check_split_key
from .stream import buffer_plan, write_stream
from .schema import FORMAT_VERSION, SCHEMA_FILE, SUCCESS_FILE, Schema
from .versions import check_dataset_name, commit, commit_next, make_root, remove_stale_temporaries, resolve_version_name

PLAN_FILE = "plan.json"
PART_MARKER = "_PART"


def _balanced(paths: list[InputPath], parts: int) -> list[list[str]]:
    """Files into ``parts`` lists of about equal bytes (largest first into the lightest)."""
    loads = [0] * parts
    shares: list[list[str]] = [[] for _ in range(parts)]
    for path in sorted(paths, key=lambda p: (-p.stat().st_size, str(p))):
        lightest = loads.index(min(loads))
        shares[lightest].append(str(path))
        loads[lightest] += path.stat().st_size
    return [sorted(share) for share in shares if share]


def plan_parts(
    input: str | os.PathLike | Sequence[str | os.PathLike],
    output: str | os.PathLike,
    name: str,
    parts: int | None = None,
    version: int | str | None = None,
    *,
    options: PrepareOptions | None = None,
    overwrite: bool = False,
    storage_options: StorageOptions | None = None,
    partitions: int | None = None,
    **values: Any,
) -> dict[str, Any]:
    """Check the options and the input, decide the schema and each part's files; write the
    plan under ``<output>/<name>/.parts-<id>/`` and return it (``plan["parts"]`` lists each
    part's files; ``plan["directory"]`` is where the parts write).

    The options are ``options=PrepareOptions(...)`` or given one by one (``label="y"``,
    ``eval_fraction=0.25``), as to :func:`~airflow_tf.data.prepare_dataset`; the plan records
    them for its parts. The input is split by files: ``parts`` larger than the number of input
    files gives one part per file. Inputs may be in ``s3://``/``gs://`` (``storage_options``
    here and to :func:`prepare_part`); the output is a directory every part and the commit
    share. ``partitions`` is the deprecated name of ``parts`` (until 0.3.0)."""
    parts = renamed("plan_parts", "partitions", "parts", partitions, parts)
    options = PrepareOptions.given(options, "plan_parts", values)
    if is_remote(output):
        raise DataError(f"output {os.fspath(output)!r}: parallel parts write into a directory they share, and "
                        "object storage has none; give a shared volume (or a mount of the bucket), or prepare "
                        "the version in one task (PrepareTFRecordsOperator) to write it to object storage")
    if isinstance(parts, bool) or not str(parts).strip().isdigit() or int(parts) < 1:
        raise DataError(f"parts must be a whole number of parallel parts, at least 1, got {parts!r}")
    if options.vocabularies:
        raise DataError("vocabularies are counted over all the training rows, which no part sees: prepare the "
                        "version in one task (PrepareTFRecordsOperator) to keep vocabularies")
    name = check_dataset_name(name)
    root = Path(strip_file_scheme(output)) / path_component(name)
    version_name = resolve_version_name(version, root)
    if version is not None and (root / version_name).exists() and not overwrite:
        raise DatasetExistsError(
            f"dataset version {root / version_name} already exists; choose another version, leave the "
            "version out to get the next one, or ask to overwrite it"
        )
    block_bytes, _ = buffer_plan(options.buffer_mib)
    inputs = open_inputs(input, options.schema, options.allow_nan, options.string_columns, block_bytes=block_bytes,
                         schema_only=True, storage_options=storage_options)
    decided = with_label(inputs.schema, options.label)
    check_split_key(decided, options.split_key)
    paths = resolve_inputs(input, storage_options)
    make_root(root)
    remove_stale_temporaries(root)
    directory = root / f".parts-{uuid.uuid4().hex[:12]}"
    directory.mkdir()
    shares = _balanced(paths, min(int(parts), len(paths)))
    plan = {
        "format_version": FORMAT_VERSION,
        "token": directory.name,
        "directory": str(directory.resolve()),
        "name": name,
        "version": None if version is None else version_name,
        "overwrite": bool(overwrite),
        "schema": decided.to_dict(),
        "files": [str(p) for p in paths],
        "parts": shares,
        # The schema is decided above for every part; the parts read with it, not with the options'.
        "options": {**options.to_dict(), "schema": None, "string_columns": []},
        "estimated_rows": inputs.estimated_rows,
    }
    write_json(directory / PLAN_FILE, plan)
    return plan


def _load_plan(plan: dict[str, Any] | str | os.PathLike) -> dict[str, Any]:
    location = plan["directory"] if isinstance(plan, dict) else plan
    path = Path(strip_file_scheme(location))
    path = path / PLAN_FILE if path.is_dir() else path
    try:
        return read_json(path)
    except FileNotFoundError:
        raise DataError(f"no plan at {path}: it was committed or cleaned up already, or never made; "
                        "run the plan step again") from None


def prepare_part(plan: dict[str, Any] | str | os.PathLike, index: int, encode_threads: int | None = None,
                 progress: Callable[[Progress], None] | None = None, progress_every: float = 5.0, *,
                 storage_options: StorageOptions | None = None, workers: int | None = None) -> dict[str, Any]:
    """Stream part ``index``'s files into ``<plan directory>/part-<index>``; the part's
    ``_PART`` marker (its counts and files) is written last. Running a part again replaces it.
    ``encode_threads`` (default: the plan's, else the cores this process may use) encode in
    parallel; ``workers`` is its deprecated name (until 0.3.0)."""
    encode_threads = renamed("prepare_part", "workers", "encode_threads", workers, encode_threads)
    plan = _load_plan(plan)
    shares = plan["parts"]
    if not 0 <= int(index) < len(shares):
        raise DataError(f"part index {index} is out of range: the plan has {len(shares)} parts (0 to {len(shares) - 1})")
    directory = Path(plan["directory"])
    options = PrepareOptions.from_dict(plan["options"])
    schema = Schema.from_dict(plan["schema"])
    files = shares[int(index)]
    block_bytes, in_flight = buffer_plan(options.buffer_mib)
    reporter = Reporter(progress, progress_every)
    inputs = open_inputs(files, schema, block_bytes=block_bytes, storage_options=storage_options)
    inputs.schema = schema
    if options.shards is not None:  # the plan's file count, shared in proportion to the part's rows
        share = inputs.estimated_rows / max(1, plan["estimated_rows"])
        options = dataclasses.replace(options, shards=max(1, round(options.shards * share)))
    if encode_threads is not None:
        options = dataclasses.replace(options, encode_threads=encode_threads)
    final = directory / f"part-{int(index)}"
    temporary = directory / f".tmp-part-{int(index)}-{uuid.uuid4().hex[:8]}"
    reporter.begin("write")
    try:
        temporary.mkdir()
        splits, rows = write_stream(
            inputs, temporary, options, in_flight=in_flight,
            report=lambda done, expected: reporter("write", done, expected, done), require_splits=False,
        )
        reporter("write", rows, rows, rows, final=True)
        write_json(temporary / PART_MARKER, {"token": plan["token"], "index": int(index), "files": files,
                                             "rows": rows, "splits": splits})
        fsync_dir(temporary)
        if final.exists():  # an earlier attempt of this part finished: this one replaces it
            shutil.rmtree(final)
        os.rename(temporary, final)
    finally:
        if temporary.exists():
            shutil.rmtree(temporary, ignore_errors=True)
    return {"index": int(index), "rows": rows, "counts": {s: info["examples"] for s, info in splits.items()}}


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links: copy
        shutil.copyfile(source, target)


def _part_markers(plan: dict[str, Any], directory: Path) -> list[dict[str, Any]]:
    """The marker of every part of the plan, each checked against the plan and the files it lists."""
    markers = []
    for index in range(len(plan["parts"])):
        marker = directory / f"part-{index}" / PART_MARKER
        try:
            data = read_json(marker)
        except FileNotFoundError:
            raise DataError(
                f"part {index} of {len(plan['parts'])} of dataset {plan['name']!r} did not finish ({marker} is "
                "missing: the part failed or was stopped); run that part again, then commit"
            ) from None
        if data.get("token") != plan["token"]:
            raise DataError(f"{marker} belongs to another plan; run part {index} again")
        for split, info in data["splits"].items():
            for shard in info["shards"]:
                path = marker.parent / split / shard["file"]
                size = path.stat().st_size if path.exists() else None
                if size != shard["bytes"]:
                    raise DataError(f"part {index}: {path} is {'missing' if size is None else f'{size} bytes'} "
                                    f"where the part wrote {shard['bytes']}; run part {index} again")
        markers.append(data)
    return markers


def commit_parts(plan: dict[str, Any] | str | os.PathLike) -> dict[str, Any]:
    """Check every part of the plan and commit them as one dataset version (``_SUCCESS``
    last), then remove the parts' directory. Refuses, committing nothing, when a part is
    missing or its files do not match its marker. Returns the same summary as
    :func:`~airflow_tf.data.prepare_dataset`."""
    started = time.monotonic()
    plan = _load_plan(plan)
    directory = Path(plan["directory"])
    root = directory.parent
    options = PrepareOptions.from_dict(plan["options"])
    compression = options.compression
    markers = _part_markers(plan, directory)
    rows = sum(m["rows"] for m in markers)
    splits_seen = [s for s in ("train", "eval") if any(s in m["splits"] for m in markers)]
    if "train" not in splits_seen:
        raise DataError(f"no rows for training in any part ({rows} rows); add rows or lower the eval fraction")
    if options.eval_fraction > 0 and "eval" not in splits_seen:
        raise DataError(f"no row hashed into the eval split ({rows} rows, eval fraction "
                        f"{options.eval_fraction}); add rows, a larger eval fraction, another seed, or eval_fraction=0")
    version = plan["version"]
    version_name = version or resolve_version_name(None, root)
    temporary = root / f".tmp-{version_name}-{uuid.uuid4().hex[:12]}"
    final = root / version_name
    try:
        temporary.mkdir()
        manifest_splits: dict[str, Any] = {}
        for split in splits_seen:
            (temporary / split).mkdir()
            pieces = [(m["index"], s) for m in markers for s in m["splits"].get(split, {}).get("shards", [])]
            entries = []
            for number, (index, shard) in enumerate(pieces):
                name = shard_name(number, len(pieces), compression)
                _link(directory / f"part-{index}" / split / shard["file"], temporary / split / name)
                entries.append({"file": name, "examples": shard["examples"], "bytes": shard["bytes"]})
            fsync_dir(temporary / split)
            manifest_splits[split] = {"examples": sum(e["examples"] for e in entries), "shards": entries}
        schema = Schema.from_dict(plan["schema"])
        write_json(temporary / SCHEMA_FILE, schema.to_dict())
        manifest = {
            "format_version": FORMAT_VERSION, "name": plan["name"], "version": version_name,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "compression": compression, "splits": manifest_splits,
            "split": {"eval_fraction": options.eval_fraction, "seed": options.seed, "split_key": options.split_key},
            "source": {"files": plan["files"], "rows": rows, "parts": len(markers)},
        }

        def write_marker(committed_as: str) -> None:
            manifest["version"] = committed_as
            write_json(temporary / SUCCESS_FILE, manifest)
            fsync_dir(temporary)

        if version is None:
            version_name = commit_next(temporary, root, int(version_name), write_marker)
            final = root / version_name
        else:
            write_marker(version_name)
            commit(temporary, final, plan["overwrite"])
    except OSError as exc:
        raise DataError(f"committing dataset {final} failed: {exc}") from None
    finally:
        if temporary.exists():
            shutil.rmtree(temporary, ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)
    seconds = time.monotonic() - started
    return {
        "dataset_uri": str(final.resolve()), "name": plan["name"], "version": version_name,
        "counts": {split: info["examples"] for split, info in manifest_splits.items()},
        "shards": {split: len(info["shards"]) for split, info in manifest_splits.items()},
        "compression": compression, "schema": plan["schema"], "rows": rows, "parts": len(markers),
        "seconds": round(seconds, 3),
    }


def prepare_partitioned(input: Any, output: str | os.PathLike, name: str, parts: int | None = None,
                        encode_threads: int | None = None, *, partitions: int | None = None,
                        workers: int | None = None, **options: Any) -> dict[str, Any]:
    """Plan, run every part in this process one after the other, and commit: the same
    version the parts give when run in parallel (for tests and scripts). ``partitions`` and
    ``workers`` are the deprecated names of ``parts`` and ``encode_threads`` (until 0.3.0)."""
    parts = renamed("prepare_partitioned", "partitions", "parts", partitions, parts)
    encode_threads = renamed("prepare_partitioned", "workers", "encode_threads", workers, encode_threads)
    plan = plan_parts(input, output, name, parts, **options)
    for index in range(len(plan["parts"])):
        prepare_part(plan, index, encode_threads)
    return commit_parts(plan)
