"""The ``tf.data`` input pipeline over a prepared dataset, for training and evaluation.

TensorFlow is imported inside the functions, so importing :mod:`airflow_tf.data` stays cheap."""

from __future__ import annotations

import os
from typing import Any

from airflow_tf.files import training_location_problem

from .errors import DataError
from .schema import Schema, compression_of, load_schema, split_files, split_info

_MAX_SHUFFLE_BUFFER = 10_000
_INTERLEAVE_BLOCK = 64


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
):
    """Batches of ``(features, label)`` from one split of a prepared dataset.

    ``features`` maps each input feature name to a ``[batch, *shape]`` tensor; ``label`` is
    ``[batch, *label_shape]``. A dataset without a label yields the features dict alone.

    ``num_shards``/``shard_index`` give each of ``num_shards`` workers a disjoint share: whole
    files when the split has at least ``num_shards`` files, else every ``num_shards``-th
    record. ``epochs=None`` repeats forever. ``shuffle=False`` gives a deterministic order.
    Records are batched first and parsed with one ``tf.io.parse_example`` per batch."""
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
    files = split_files(dataset_uri, split)
    info = split_info(dataset_uri, split)
    compression = {"gzip": "GZIP", "zlib": "ZLIB"}.get(compression_of(dataset_uri) or "", "")
    by_file = len(files) >= num_shards
    if by_file:
        files = files[shard_index::num_shards]
    if not files:
        raise DataError(f"split {split!r} of dataset {dataset_uri} has no files")
    examples = max(1, int(info["examples"]) // (1 if by_file else num_shards))

    ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle and by_file:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type=compression),
        cycle_length=min(len(files), 8),
        # Runs of records per file: handing over single records between threads costs
        # more CPU than parsing them.
        block_length=_INTERLEAVE_BLOCK,
        num_parallel_calls=tf.data.AUTOTUNE,
        # Record sharding needs the same order in every worker, and shuffle=False promises one.
        deterministic=not (shuffle and by_file),
    )
    if not by_file:
        ds = ds.shard(num_shards, shard_index)
    if shuffle:
        buffer = shuffle_buffer or min(examples, _MAX_SHUFFLE_BUFFER)
        ds = ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat(epochs)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    spec = parse_spec(schema)
    label = schema.label_name

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        if label is None:
            return parsed
        target = parsed.pop(label)
        return parsed, target

    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=not shuffle)
    return ds.prefetch(tf.data.AUTOTUNE)
