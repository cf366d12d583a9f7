"""Raw files -> a committed TFRecord dataset version, streamed in bounded memory.

``<output>/<name>/<version>/{train,eval}/part-NNNNN-of-MMMMM.tfrecord[.gz]``, ``schema.json``
and ``_SUCCESS`` (counts per split and per shard). Rows are read a block at a time, split by a
per-row hash, encoded on threads and appended to the shard files as they arrive. Everything is
written into a hidden temporary directory beside the final one and renamed into place at the
end, so a reader never sees a partial dataset; ``_SUCCESS`` is the last file written."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import time
import uuid
from datetime import datetime, UTC
from pathlib import Path
from collections.abc import Mapping
from typing import Any
from collections.abc import Callable, Sequence

from ..cluster.names import path_component
from ..files import strip_file_scheme, write_json
from . import object_store
from .cache import input_fingerprint, reuse_cached
from .errors import DataError
from .inputs import open_inputs
from .object_store import StorageOptions, is_remote
from .options import DEFAULTS, RENAMED, PrepareOptions, with_label
from .progress import Progress, Reporter, rate
from .schema import FORMAT_VERSION, SCHEMA_FILE, Schema
from .split import check_split_key
from .staging import prepare_into_object_storage
from .stream import buffer_plan, write_stream
from .versions import check_dataset_name, commit_version, make_root, refuse_existing, remove_stale_temporaries, resolve_version_name
from .vocabulary import VocabularyCounter, vocabulary_sizes

__all__ = ["PrepareOptions", "Progress", "prepare_dataset"]

log = logging.getLogger(__name__)


def prepare_dataset(  # noqa: PLR0917  the public signature of 0.1.0 (positional calls keep working)
    input: str | os.PathLike | Sequence[str | os.PathLike],
    output: str | os.PathLike,
    name: str,
    version: int | str | None = None,
    label: str | None = DEFAULTS.label,
    eval_fraction: float = DEFAULTS.eval_fraction,
    shards: int | None = DEFAULTS.shards,
    target_shard_mib: float | None = DEFAULTS.target_shard_mib,
    compression: str | None = DEFAULTS.compression,
    schema: Schema | dict | str | os.PathLike | None = None,
    string_columns: str | Sequence[str] | None = None,
    seed: int = DEFAULTS.seed,
    split_key: str | None = DEFAULTS.split_key,
    overwrite: bool = False,
    allow_nan: bool = DEFAULTS.allow_nan,
    encode_threads: int | None = DEFAULTS.encode_threads,
    progress: Callable[[Progress], None] | None = None,
    progress_every: float = 5.0,
    buffer_mib: float = DEFAULTS.buffer_mib,
    cache: bool = False,
    partition_key: str | None = None,
    vocabularies: Mapping[str, int] | Sequence[str] | str | None = DEFAULTS.vocabularies,
    storage_options: StorageOptions | None = None,
    *,
    options: PrepareOptions | None = None,
    target_shard_mb: float | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """Convert CSV/Parquet/.npz files into a sharded TFRecord dataset version, streaming.

    The options (``label`` to ``buffer_mib``, see :class:`~airflow_tf.data.options.PrepareOptions`)
    are given one by one or whole as ``options=PrepareOptions(...)``, not both.

    Rows are read, checked, split, encoded and written a block at a time: memory follows
    ``buffer_mib`` (default 512 MiB), not the size of the input. A row goes to eval when a
    hash of (input file name, row number, seed), or of its ``split_key`` value, falls below
    ``eval_fraction``: the split is deterministic and the eval share is ``eval_fraction`` of
    the rows up to sampling noise. Without ``version`` the dataset becomes the next integer
    version, decided when it is committed, so concurrent runs of one dataset each commit a
    version of their own. ``string_columns`` names CSV columns to read as text (an inferred
    numeric column with a value that does not parse is an error). ``encode_threads`` threads
    encode in parallel (default: the cores this process may use). Returns a summary:
    ``dataset_uri`` (the version directory), ``name``, ``version``, ``counts`` and ``shards``
    per split, ``compression``, ``schema`` (as a dict), ``rows``, ``sources`` (the input files
    read: absolute paths or URIs), ``seconds`` and ``rows_per_sec``. Raises a :class:`DataError` naming the file, line and column of bad
    input; nothing is committed then.

    With ``cache=True`` (and no ``version``) the input's content and the options are
    fingerprinted first (one extra read of the input) and recorded in ``_SUCCESS``; when a
    committed version has the same fingerprint it is returned as it is (``"cached": True``)
    and nothing is encoded.

    ``partition_key`` (e.g. a day, ``"2026-11-20"``) makes this version the data of one
    partition: it is named by the key unless ``version`` is given, and recorded in
    ``_SUCCESS`` so that :func:`~airflow_tf.data.window.make_window` can join the last N.

    ``vocabularies`` (``{"user": 100000}``, or column names for the default size) counts those
    columns' values over the training rows and keeps each one's top K in the version, for the
    model to read as ``schema.vocabulary("user")`` (see :mod:`airflow_tf.data.vocabulary`).

    ``input`` and ``output`` may be ``s3://`` or ``gs://`` URIs (``storage_options``: per
    scheme, pyarrow's file system options, e.g. credentials; see
    :mod:`airflow_tf.data.object_store`). Inputs are streamed from the store; a version in
    object storage is written in a local staging directory and then uploaded, ``_SUCCESS`` last.

    ``target_shard_mb`` and ``workers`` are the deprecated names of ``target_shard_mib`` and
    ``encode_threads`` (until 0.3.0)."""
    started = time.monotonic()
    given = locals()  # the option parameters above are PrepareOptions' fields, by name
    values = {key: given[key] for key in (*PrepareOptions.names(), *RENAMED) if given[key] is not None}
    options = PrepareOptions.given(options, "prepare_dataset", values)
    name = check_dataset_name(name)
    if partition_key is not None:
        partition_key = str(partition_key)
        version = path_component(partition_key) if version is None else version
    fingerprint = None
    if cache and version is None:
        fingerprint = input_fingerprint(input, options.fingerprint(), storage_options)
    if is_remote(output):
        object_store.check_location(output, "output")
        stage = functools.partial(prepare_dataset, input, options=options, progress=progress,
                                  progress_every=progress_every, partition_key=partition_key,
                                  storage_options=storage_options)
        return prepare_into_object_storage(os.fspath(output), name, version, overwrite=overwrite,
                                           fingerprint=fingerprint, storage_options=storage_options,
                                           stage=stage, started=started)
    root = Path(strip_file_scheme(output)) / path_component(name)
    version_name = resolve_version_name(version, root)
    final = root / version_name
    refuse_existing(final, version, overwrite)
    reporter = Reporter(progress, progress_every)
    block_bytes, in_flight = buffer_plan(options.buffer_mib)
    reused = reuse_cached(root, name, fingerprint, started) if fingerprint else None
    if reused is not None:
        return reused

    reporter.begin("read")
    inputs = open_inputs(input, options.schema, options.allow_nan, options.string_columns, block_bytes=block_bytes,
                         on_file=lambda done, total: reporter("read", done, total, 0, done == total),
                         storage_options=storage_options)
    inputs.schema = with_label(inputs.schema, options.label)
    check_split_key(inputs.schema, options.split_key)
    counter = VocabularyCounter(vocabulary_sizes(options.vocabularies, inputs.schema))

    make_root(root)
    remove_stale_temporaries(root)
    temporary = root / f".tmp-{version_name}-{uuid.uuid4().hex[:12]}"
    reporter.begin("write")
    try:
        temporary.mkdir()
        manifest_splits, total = write_stream(
            inputs, temporary, options, in_flight=in_flight,
            report=lambda done, expected: reporter("write", done, expected, done),
            on_train_rows=(lambda block, rows: counter.update(block.columns, rows)) if counter.sizes else None,
        )
        reporter("write", total, total, total, final=True)
        inputs.schema = _with_vocabularies(inputs.schema, counter, temporary)
        write_json(temporary / SCHEMA_FILE, inputs.schema.to_dict())
        manifest = {
            "format_version": FORMAT_VERSION,
            "name": name,
            "version": version_name,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "compression": options.compression,
            "splits": manifest_splits,
            "split": {"eval_fraction": options.eval_fraction, "seed": options.seed, "split_key": options.split_key},
            "source": {"files": [str(p) for p in inputs.paths], "rows": total},
            **_optional_entries(fingerprint, partition_key),
        }
        version_name = commit_version(temporary, root, version_name, manifest, explicit=version is not None,
                                      overwrite=overwrite)
        final = root / version_name
    except OSError as exc:
        raise DataError(f"writing dataset {final} failed: {exc}") from None
    finally:
        if temporary.exists():
            shutil.rmtree(temporary, ignore_errors=True)
    seconds = time.monotonic() - started
    return {
        "dataset_uri": str(final.resolve()),
        "name": name,
        "version": version_name,
        "counts": {split: info["examples"] for split, info in manifest_splits.items()},
        "shards": {split: len(info["shards"]) for split, info in manifest_splits.items()},
        "compression": options.compression,
        "schema": inputs.schema.to_dict(),
        "rows": total,
        "sources": [object_store.identity(p) for p in inputs.paths],  # the lineage's inputs
        "seconds": round(seconds, 3),
        "rows_per_sec": rate(total, seconds),
        "cached": False,
        **_optional_entries(fingerprint, partition_key),
    }


def _optional_entries(fingerprint: str | None, partition_key: str | None) -> dict[str, Any]:
    """The manifest's and summary's entries that only some versions have."""
    return {**({"fingerprint": fingerprint} if fingerprint else {}),
            **({"partition": partition_key} if partition_key is not None else {})}


def _with_vocabularies(schema: Schema, counter: VocabularyCounter, directory: Path) -> Schema:
    """The schema recording the vocabularies ``counter`` counted, written into ``directory``."""
    if not counter.sizes:
        return schema
    kept = counter.write(directory)
    for column, info in kept.items():
        log.info("Vocabulary of %r: %d of %d distinct values kept (top %d)", column, info["size"],
                 info["distinct"], info["top_k"])
    return dataclasses.replace(schema, vocabularies=kept)
