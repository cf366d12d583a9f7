"""The ``tf.data`` input pipeline over a prepared dataset, for training and evaluation.

TensorFlow is imported inside the functions, so importing :mod:`airflow_tf.data` stays cheap."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from airflow_tf.files import training_location_problem

from .errors import DataError
from .schema import Schema, compression_of, load_schema, split_files, split_info

_MAX_SHUFFLE_BUFFER = 10_000
_INTERLEAVE_BLOCK = 64
_PREFETCH_BATCHES = 2
"""Batches made ahead of the trainer: enough to hide the pipeline's latency behind a step;
AUTOTUNE keeps more and spends a core on them that the step needs on a small machine."""
_LOAD_BATCH = 8192
_STRING_BYTES = 64
"""A guess of a parsed string value's size, for the in-memory estimate."""


def parse_spec(schema: Schema) -> dict[str, Any]:
    """``{name: tf.io.FixedLenFeature(shape, dtype)}`` for ``tf.io.parse_example``, label included."""
    import tensorflow as tf

    return {
        f.name: tf.io.FixedLenFeature(list(f.shape), tf.dtypes.as_dtype(f.dtype))
        for f in schema.features
    }


def make_dataset(  # noqa: PLR0917  public signature: callers pass these positionally
    dataset_uri: str | os.PathLike,
    split: str = "train",
    batch_size: int = 64,
    num_shards: int = 1,
    shard_index: int = 0,
    epochs: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    drop_remainder: bool = False,
    shuffle_buffer: int | None = None,
    in_memory_bytes: int = 0,
    features_as_matrix: bool = False,
):
    """Batches of ``(features, label)`` from one split of a prepared dataset.

    ``features`` maps each input feature name to a ``[batch, *shape]`` tensor; ``label`` is
    ``[batch, *label_shape]``. A dataset without a label yields the features dict alone.

    ``num_shards``/``shard_index`` give each of ``num_shards`` workers a disjoint share: whole
    files when the split has at least ``num_shards`` files, else every ``num_shards``-th
    record. ``epochs=None`` repeats forever. ``shuffle=False`` gives a deterministic order.
    Records are batched first and parsed with one ``tf.io.parse_example`` per batch.

    ``in_memory_bytes``: when this share's parsed values (estimated from the schema) fit in it,
    the share is read and parsed once into memory and each batch is gathered from there, the
    whole share reshuffled every epoch; 0 always streams from the files.

    ``features_as_matrix``: when the share is held in memory and every feature is a float32
    scalar, ``features`` is one ``[batch, n]`` float32 matrix, its columns the features in schema
    order, rather than a dict (one gather of whole rows, no split); otherwise the dict."""
    import tensorflow as tf

    if int(batch_size) < 1:
        raise DataError(f"batch_size must be at least 1, got {batch_size}")
    if int(num_shards) < 1 or not 0 <= int(shard_index) < int(num_shards):
        raise DataError(
            f"shard_index must be in [0, num_shards); got shard_index={shard_index}, num_shards={num_shards}"
        )
    if epochs is not None and int(epochs) < 1:
        raise DataError(f"epochs must be at least 1 (or None to repeat forever), got {epochs}")
    problem = training_location_problem(os.fspath(dataset_uri), "dataset")
    if problem:  # before TensorFlow's own, less helpful "scheme not implemented"
        raise DataError(problem)
    schema = load_schema(dataset_uri)
    share = _Share.of(dataset_uri, split, int(num_shards), int(shard_index))
    if in_memory_bytes and share.examples * _row_bytes(schema) <= in_memory_bytes:
        ds = _in_memory(share, schema, batch_size, epochs, drop_remainder=drop_remainder, shuffle=shuffle, seed=seed,
                        as_matrix=features_as_matrix)
    else:
        ds = _records(share, shuffle=shuffle, seed=seed, shuffle_buffer=shuffle_buffer).repeat(epochs)
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
        # In order even when shuffled: an out-of-order map lets the partial batch overtake a full one,
        # and only the last batch may be partial.
        ds = ds.map(_parser(schema), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.prefetch(_PREFETCH_BATCHES)


@dataclass(frozen=True)
class _Share:
    """One worker's share of a split: its files, and whether it is every ``num_shards``-th record
    of them (fewer files than workers) rather than whole files."""

    files: list[str]
    num_shards: int
    shard_index: int
    by_file: bool
    compression: str
    examples: int
    """The share's examples (exact for one worker, else the split's divided evenly)."""

    @classmethod
    def of(cls, dataset_uri, split: str, num_shards: int, shard_index: int) -> _Share:
        files = split_files(dataset_uri, split)
        info = split_info(dataset_uri, split)
        compression = {"gzip": "GZIP", "zlib": "ZLIB"}.get(compression_of(dataset_uri) or "", "")
        by_file = len(files) >= num_shards
        if by_file:
            files = files[shard_index::num_shards]
        if not files:
            raise DataError(f"split {split!r} of dataset {dataset_uri} has no files")
        examples = max(1, -(-int(info["examples"]) // num_shards))
        return cls(files, num_shards, shard_index, by_file, compression, examples)


EMPTY_SHARE_REMEDY = "prepare more rows, or train with fewer workers than the split has records"
"""What to do about a worker's share of a split that holds no record (fewer records than workers)."""


def _row_bytes(schema: Schema) -> int:
    """An example's parsed size (strings guessed at :data:`_STRING_BYTES` a value)."""
    return sum(f.size * (_STRING_BYTES if f.dtype == "string" else 8 if f.dtype == "int64" else 4)
               for f in schema.features)


def _records(share: _Share, *, shuffle: bool, seed: int, shuffle_buffer: int | None):
    """The share's serialized records, shuffled through a buffer when ``shuffle``."""
    import tensorflow as tf

    files = share.files
    if len(files) == 1:  # nothing to interleave: one reader, no threads handing records over
        ds = tf.data.TFRecordDataset(files, compression_type=share.compression)
    else:
        ds = tf.data.Dataset.from_tensor_slices(files)
        if shuffle and share.by_file:
            ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        ds = ds.interleave(
            lambda path: tf.data.TFRecordDataset(path, compression_type=share.compression),
            cycle_length=min(len(files), 8),
            # Runs of records per file: handing over single records between threads costs
            # more CPU than parsing them.
            block_length=_INTERLEAVE_BLOCK,
            num_parallel_calls=tf.data.AUTOTUNE,
            # Record sharding needs the same order in every worker, and shuffle=False promises one.
            deterministic=not (shuffle and share.by_file),
        )
    if not share.by_file:
        ds = ds.shard(share.num_shards, share.shard_index)
    if shuffle:
        ds = ds.shuffle(shuffle_buffer or min(share.examples, _MAX_SHUFFLE_BUFFER), seed=seed,
                        reshuffle_each_iteration=True)
    return ds


def _parser(schema: Schema, split_label: bool = True):
    """A batch of serialized records -> ``(features, label)`` (or the features alone), parsed
    with one ``tf.io.parse_example``; ``split_label=False`` keeps the label among the columns."""
    import tensorflow as tf

    spec = parse_spec(schema)
    label = schema.label_name if split_label else None

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        if label is None:
            return parsed
        target = parsed.pop(label)
        return parsed, target

    return parse


def _load(share: _Share, schema: Schema) -> dict[str, Any]:
    """Every column of the share as a NumPy array, in record order (read in a graph of its own,
    whatever graph or device the caller builds in)."""
    import numpy as np
    import tensorflow as tf

    parts: dict[str, list] = {f.name: [] for f in schema.features}
    with tf.Graph().as_default():
        ds = _records(share, shuffle=False, seed=0, shuffle_buffer=None).batch(_LOAD_BATCH).map(
            _parser(schema, split_label=False))
        batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        with tf.compat.v1.Session() as session:
            while True:
                try:
                    values = session.run(batch)
                except tf.errors.OutOfRangeError:
                    break
                for name, value in values.items():
                    parts[name].append(value)
    if not any(parts.values()):
        # np.concatenate would fail saying only "need at least one array".
        raise DataError(f"this worker's share of {len(share.files)} file(s) ({share.files[0]}, ...) holds no "
                        f"record: {EMPTY_SHARE_REMEDY}")
    return {name: np.concatenate(chunks) for name, chunks in parts.items()}


def _in_memory(share: _Share, schema: Schema, batch_size: int, epochs: int | None, *, drop_remainder: bool,
               shuffle: bool, seed: int, as_matrix: bool):
    """Batches gathered from the share held in memory: a batch of example indices (the whole
    share reshuffled every epoch, epochs joined as the streaming pipeline joins them) picks its
    rows from each column; ``as_matrix``: see :func:`make_dataset`'s ``features_as_matrix``."""
    import numpy as np
    import tensorflow as tf

    loaded = _load(share, schema)
    count = len(next(iter(loaded.values())))
    label = schema.label_name
    labels = None if label is None else tf.constant(loaded.pop(label))
    # The scalar features of one dtype are held as the columns of one matrix, so that a batch is
    # one gather of whole rows: a gather per column reads each example's scattered values once
    # per column (on a 64-column share, ~2 ms of a 20 ms step: bench/step_breakdown.py).
    by_dtype: dict[Any, list[str]] = {}
    for name, values in loaded.items():
        if values.ndim == 1 and values.dtype != object:
            by_dtype.setdefault(values.dtype, []).append(name)
    matrices = [(group, tf.constant(np.stack([loaded.pop(n) for n in group], axis=1)))
                for group in by_dtype.values() if len(group) > 1]
    columns = {name: tf.constant(values) for name, values in loaded.items()}
    del loaded
    whole = not columns and len(matrices) == 1 and matrices[0][0] == list(schema.feature_names) \
        and matrices[0][1].dtype == tf.float32
    ds = tf.data.Dataset.range(count)
    if shuffle:
        ds = ds.shuffle(count, seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat(epochs).batch(batch_size, drop_remainder=drop_remainder)

    def gather(indices):
        if as_matrix and whole:
            features = tf.gather(matrices[0][1], indices)
        else:
            features = {name: tf.gather(values, indices) for name, values in columns.items()}
            for group, matrix in matrices:
                features.update(zip(group, tf.unstack(tf.gather(matrix, indices), axis=1), strict=True))
        return features if labels is None else (features, tf.gather(labels, indices))

    return ds.map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
