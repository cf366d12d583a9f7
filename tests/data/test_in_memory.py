"""A worker's share read into memory (``make_dataset(..., in_memory_bytes=...)``): the same
examples as streaming it, every one once an epoch, reshuffled whole every epoch, the partial
last batch as the streaming pipeline gives it, and streaming when the share does not fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from airflow_tf.data import make_dataset, prepare_dataset

ROWS = 300
FITS = 1 << 20


def _dataset(tmp_path: Path, shards: int = 3) -> str:
    ids = np.arange(ROWS, dtype=np.int64)
    np.savez(tmp_path / "in.npz", id=ids, x=np.stack([ids * 0.5, -ids], axis=1).astype(np.float32),
             label=(ids % 3).astype(np.int64))
    return prepare_dataset(tmp_path / "in.npz", tmp_path / "out", f"m{shards}", label="label", eval_fraction=0,
                           shards=shards)["dataset_uri"]


def _epochs(uri: str, epochs: int, batch_size: int, **kwargs) -> list[np.ndarray]:
    """The ids of each batch, checked against their features and label."""
    batches = []
    for features, label in make_dataset(uri, batch_size=batch_size, epochs=epochs, seed=3, **kwargs):
        ids = features["id"].numpy()
        np.testing.assert_array_equal(features["x"].numpy(), np.stack([ids * 0.5, -ids], axis=1))
        np.testing.assert_array_equal(label.numpy(), ids % 3)
        batches.append(ids)
    return batches


def test_a_share_in_memory_holds_the_streamed_examples_each_once_an_epoch_reshuffled(tmp_path):
    uri = _dataset(tmp_path)
    for workers in (1, 2, 4):  # whole files, then every n-th record (4 workers, 3 files)
        for index in range(workers):
            streamed = np.concatenate(_epochs(uri, 1, 64, num_shards=workers, shard_index=index))
            in_memory = _epochs(uri, 2, 64, num_shards=workers, shard_index=index, in_memory_bytes=FITS)
            ids = np.concatenate(in_memory)
            share = len(streamed)
            assert sorted(ids[:share]) == sorted(streamed) == sorted(ids[share:]), (workers, index)
    first, second = np.split(np.concatenate(_epochs(uri, 2, 64, in_memory_bytes=FITS)), 2)
    assert not np.array_equal(first, second), "the share is reshuffled every epoch"
    assert not np.array_equal(first, np.sort(first)), "the share is shuffled"


def test_epochs_join_into_full_batches_and_only_the_last_is_partial(tmp_path):
    uri = _dataset(tmp_path, shards=1)
    for in_memory_bytes in (0, FITS):
        sizes = [len(b) for b in _epochs(uri, 2, 64, in_memory_bytes=in_memory_bytes)]
        assert sizes == [64] * 9 + [600 - 9 * 64], in_memory_bytes
        dropped = [len(b) for b in _epochs(uri, 2, 64, in_memory_bytes=in_memory_bytes, drop_remainder=True)]
        assert dropped == [64] * 9, in_memory_bytes
    in_file_order = [np.concatenate(_epochs(uri, 1, 64, in_memory_bytes=b, shuffle=False)) for b in (0, FITS)]
    np.testing.assert_array_equal(*in_file_order, err_msg="shuffle=False keeps the file order")


def test_a_share_larger_than_the_budget_streams(tmp_path, monkeypatch):
    uri = _dataset(tmp_path)
    from airflow_tf.data import reader

    loaded = []
    monkeypatch.setattr(reader, "_load", lambda *args: loaded.append(args) or {})
    row = 8 + 2 * 4 + 8  # id, x, label
    assert len(np.concatenate(_epochs(uri, 1, 64, in_memory_bytes=ROWS * row - 1))) == ROWS
    assert loaded == [], "a share over the budget was read into memory"


def test_a_share_without_records_fails_naming_its_files(tmp_path):
    import pytest

    from airflow_tf.data import DataError

    ids = np.arange(1, dtype=np.int64)
    np.savez(tmp_path / "one.npz", id=ids, label=ids)
    uri = prepare_dataset(tmp_path / "one.npz", tmp_path / "out", "one", label="label", eval_fraction=0,
                          shards=1)["dataset_uri"]
    # One record, two workers: the second worker's every-other-record share is empty.
    with pytest.raises(DataError, match=r"this worker's share of 1 file\(s\) \(.*part-.*\) holds no record"):
        make_dataset(uri, batch_size=4, num_shards=2, shard_index=1, in_memory_bytes=FITS)


def test_every_column_of_a_row_stays_with_its_row_whatever_its_type(tmp_path):
    """Scalar columns of one type are held together; each still comes back under its own name,
    beside the same row's vector and string columns, as streaming gives them."""
    ids = np.arange(ROWS, dtype=np.int64)
    np.savez(tmp_path / "mixed.npz", id=ids, a=(ids * 2.0).astype(np.float32), b=(-ids * 1.0).astype(np.float32),
             n=(ids + 7).astype(np.int64), v=np.stack([ids * 0.5, ids * 0.25], axis=1).astype(np.float32),
             s=np.array([f"r{i}" for i in ids]), label=(ids % 5).astype(np.int64))
    uri = prepare_dataset(tmp_path / "mixed.npz", tmp_path / "out", "mixed", label="label", eval_fraction=0,
                          shards=2, string_columns=["s"])["dataset_uri"]
    streamed, in_memory = (make_dataset(uri, batch_size=64, epochs=1, seed=3, in_memory_bytes=b) for b in (0, FITS))
    seen = 0
    for (features, label), (streamed_features, _) in zip(in_memory, streamed, strict=True):
        assert sorted(features) == sorted(streamed_features)
        i = features["id"].numpy()
        np.testing.assert_array_equal(features["a"].numpy(), i * 2.0)
        np.testing.assert_array_equal(features["b"].numpy(), -i * 1.0)
        np.testing.assert_array_equal(features["n"].numpy(), i + 7)
        np.testing.assert_array_equal(features["v"].numpy(), np.stack([i * 0.5, i * 0.25], axis=1))
        assert [x.decode() for x in features["s"].numpy()] == [f"r{k}" for k in i]
        np.testing.assert_array_equal(label.numpy(), i % 5)
        assert features["a"].dtype.name == "float32" and features["n"].dtype.name == "int64"
        seen += len(i)
    assert seen == ROWS


def test_features_as_matrix_gives_whole_rows_in_schema_order_only_where_each_feature_is_a_float_scalar(tmp_path):
    """What a training worker asks for when its model takes the joined features: each batch's rows
    as one float32 matrix, a row's columns the features in schema order beside its label. A share
    that streams, or holds any other feature, still gives the dict."""
    ids = np.arange(ROWS, dtype=np.float32)
    np.savez(tmp_path / "rows.npz", c=ids * 3, a=ids, b=-ids, label=(ids % 5).astype(np.int64))
    uri = prepare_dataset(tmp_path / "rows.npz", tmp_path / "out", "rows", label="label", eval_fraction=0,
                          shards=2)["dataset_uri"]
    seen = 0
    for rows, label in make_dataset(uri, batch_size=64, epochs=1, in_memory_bytes=FITS, features_as_matrix=True):
        assert rows.dtype.name == "float32" and rows.shape[1] == 3
        i = rows.numpy()[:, 1]  # the schema's order is the file's: c, a, b
        np.testing.assert_array_equal(rows.numpy(), np.stack([i * 3, i, -i], axis=1))
        np.testing.assert_array_equal(label.numpy(), i % 5)
        seen += len(i)
    assert seen == ROWS
    streamed, _ = next(iter(make_dataset(uri, batch_size=64, in_memory_bytes=0, features_as_matrix=True)))
    assert sorted(streamed) == ["a", "b", "c"]
    np.savez(tmp_path / "mixed.npz", a=ids, n=ids.astype(np.int64), label=(ids % 5).astype(np.int64))
    mixed = prepare_dataset(tmp_path / "mixed.npz", tmp_path / "out", "mixed", label="label", eval_fraction=0)
    features, _ = next(iter(make_dataset(mixed["dataset_uri"], batch_size=64, in_memory_bytes=FITS,
                                         features_as_matrix=True)))
    assert sorted(features) == ["a", "n"]
