"""The vectorised Example encoder and TFRecord framing, checked by TensorFlow itself."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from airflow_tf.data import FeatureSpec
from airflow_tf.data.encode import crc32c, crc32c_ragged, encode_examples


def reference_crc32c(data: bytes) -> int:
    """Bit-by-bit CRC32C, independent of the table-driven code under test."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc32c_matches_the_standard_for_short_long_and_mixed_lengths():
    assert crc32c(b"123456789") == 0xE3069283  # the published CRC-32C check value
    rng = np.random.default_rng(0)
    lengths = np.array([0, 1, 7, 511, 512, 513, 1500, 3000, 40])
    flat = rng.integers(0, 256, int(lengths.sum()), dtype=np.uint8)
    got = crc32c_ragged(flat, lengths)
    start = 0
    for i, length in enumerate(lengths):
        assert got[i] == reference_crc32c(flat[start:start + length].tobytes()), f"length {length}"
        start += length


def test_threads_encoding_at_once_in_a_fresh_process_all_write_true_crcs(monkeypatch):
    """Prepare's encode threads build the CRC tables for long records together, the first time
    any is needed: each must see complete tables (a wrong one made every later record unreadable,
    ``DataLossError: corrupted record``)."""
    import threading
    import time

    from airflow_tf.data import encode

    monkeypatch.setattr(encode, "_SHIFTS", [])  # as in a fresh process
    building = encode._zero_byte
    monkeypatch.setattr(encode, "_zero_byte", lambda values: (time.sleep(0), building(values))[1])
    rng = np.random.default_rng(1)
    lengths = np.array([2000, 1100, 1600])  # past 2 and 3 blocks of 512 bytes
    flat = rng.integers(0, 256, int(lengths.sum()), dtype=np.uint8)
    expected = [reference_crc32c(part.tobytes()) for part in np.split(flat, np.cumsum(lengths)[:-1])]
    start, results = threading.Barrier(4), []

    def encode_records():
        start.wait()
        results.append(list(crc32c_ragged(flat, lengths)))

    threads = [threading.Thread(target=encode_records) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 4
    # The tables the threads built serve every later record too, the longest ones included.
    longer = rng.integers(0, 256, 8000, dtype=np.uint8)
    assert crc32c_ragged(longer, np.array([8000]))[0] == reference_crc32c(longer.tobytes())


def _write(tmp_path, features, columns):
    path = tmp_path / "data.tfrecord"
    path.write_bytes(encode_examples(features, columns))
    return path


def _parse_all(path, features):
    spec = {f.name: tf.io.FixedLenFeature(list(f.shape), tf.dtypes.as_dtype(f.dtype)) for f in features}
    records = list(tf.data.TFRecordDataset(str(path)))
    return len(records), tf.io.parse_example(tf.stack(records), spec)


def test_every_record_parses_to_exactly_the_input_values(tmp_path):
    rng = np.random.default_rng(7)
    n = 600
    f32 = np.finfo(np.float32)
    floats = rng.standard_normal(n).astype(np.float32)
    floats[:8] = [f32.max, -f32.max, f32.tiny, np.float32(1e-45), -0.0, np.float32(1 / 3), 0.0, -1.5]
    ints = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    ints[:7] = [-(2**63), 2**63 - 1, -1, 0, 127, 128, -128]
    small_ints = rng.integers(0, 100, (n, 3))  # every varint one byte: the fixed-width path
    vectors = rng.standard_normal((n, 2, 3)).astype(np.float32)
    words = ["", "ü", "日本語", "emoji 🙂", "tab\tand\nnewline", "x" * 2000]
    text = np.array([words[i % len(words)] + str(i) * (i % 5) for i in range(n)], dtype=object)
    pairs = np.array([[words[i % 6], words[(i + 1) % 6]] for i in range(n)], dtype=object)
    features = [
        FeatureSpec("float", "float32"), FeatureSpec("int", "int64"), FeatureSpec("small", "int64", (3,)),
        FeatureSpec("vector", "float32", (2, 3)), FeatureSpec("名前", "string"), FeatureSpec("pair", "string", (2,)),
    ]
    columns = [floats, ints, small_ints, vectors, text, pairs]
    count, parsed = _parse_all(_write(tmp_path, features, columns), features)
    assert count == n
    # Compare bit patterns, so that -0.0 and denormals must survive exactly.
    assert (parsed["float"].numpy().view(np.uint32) == floats.view(np.uint32)).all()
    assert (parsed["vector"].numpy().view(np.uint32) == vectors.view(np.uint32)).all()
    np.testing.assert_array_equal(parsed["int"].numpy(), ints)
    np.testing.assert_array_equal(parsed["small"].numpy(), small_ints)
    assert [v.decode("utf-8") for v in parsed["名前"].numpy()] == list(text)
    assert [[v.decode() for v in row] for row in parsed["pair"].numpy()] == pairs.tolist()


def test_nan_and_infinity_round_trip_when_stored(tmp_path):
    values = np.array([np.nan, np.inf, -np.inf, 1.0], dtype=np.float32)
    features = [FeatureSpec("x", "float32", allow_nan=True)]
    _, parsed = _parse_all(_write(tmp_path, features, [values]), features)
    got = parsed["x"].numpy()
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == -np.inf and got[3] == 1.0


@pytest.mark.parametrize("position", ["length", "data"])
def test_tensorflow_rejects_a_corrupted_record_so_our_checksums_are_checked(tmp_path, position):
    features = [FeatureSpec("x", "float32"), FeatureSpec("s", "string")]
    path = _write(tmp_path, features, [np.arange(3, dtype=np.float32), np.array(["a", "bb", "ccc"], dtype=object)])
    assert len(list(tf.data.TFRecordDataset(str(path)))) == 3
    data = bytearray(path.read_bytes())
    data[2 if position == "length" else 20] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(path)))


@pytest.mark.parametrize("keep_order", [True, False])
def test_rows_of_different_byte_layouts_keep_their_values(tmp_path, keep_order):
    # An int64 id takes 1 to 10 bytes: rows fall into a few layouts that are encoded apart.
    rng = np.random.default_rng(3)
    n = 3000
    ids = rng.permutation(n).astype(np.int64) * 7919 - 5
    ids[:3] = [2**63 - 1, -1, 0]
    values = rng.standard_normal((n, 4)).astype(np.float32)
    features = [FeatureSpec("id", "int64"), FeatureSpec("v", "float32", (4,))]
    path = tmp_path / "mixed.tfrecord"
    path.write_bytes(encode_examples(features, [ids, values], keep_order=keep_order))
    count, parsed = _parse_all(path, features)
    got_ids, got_values = parsed["id"].numpy(), parsed["v"].numpy()
    assert count == n
    if keep_order:
        np.testing.assert_array_equal(got_ids, ids)
    else:
        assert sorted(got_ids.tolist()) == sorted(ids.tolist())
    position = {value: i for i, value in enumerate(ids.tolist())}
    np.testing.assert_array_equal(got_values, values[[position[i] for i in got_ids.tolist()]])
