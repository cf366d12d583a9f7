"""Object storage: prepare from and into ``gs://`` through ``pyarrow.fs``, credentials from
Airflow connections, and what the training tasks accept.

The store is a stand-in: ``gcp-storage-emulator`` (from PyPI) serves the Cloud Storage JSON API
on loopback, in memory. pyarrow's GCS client is pointed at it through a connection's
``endpoint_url`` or ``CLOUD_STORAGE_EMULATOR_ENDPOINT``. TensorFlow's own GCS client (what the
training tasks read ``gs://`` with) has its endpoint compiled in and cannot be pointed at an
emulator, so the records are read back here through pyarrow and parsed with TensorFlow.
No S3 server is tested: moto, the S3 stand-in on PyPI, needs botocore, which requires
python-dateutil < 3 where this project's locks pin 4.0; the s3:// path differs from gs:// only
in the pyarrow file system it builds."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pytest

from airflow_tf.data import DataError, DatasetExistsError, InputDataError, load_schema, prepare_dataset, split_files
from airflow_tf.data.object_store import gcs_options, s3_options
from airflow_tf.data.samples import write_linear_regression_csv

BUCKET = "training-data"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """A GCS-compatible stand-in on loopback: (pyarrow file system, storage_options)."""
    port = _free_port()
    log = tmp_path_factory.mktemp("gcs") / "emulator.log"
    command = [str(Path(sys.executable).with_name("gcp-storage-emulator")), "start", "--host", "127.0.0.1",
               "--port", str(port), "--default-bucket", BUCKET, "--in-memory", "-q"]
    with open(log, "wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the GCS emulator did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        options = {"gs": {"anonymous": True, "scheme": "http", "endpoint_override": f"127.0.0.1:{port}"}}
        yield pafs.GcsFileSystem(**options["gs"]), options, f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def _upload(fs, local: Path, key: str) -> str:
    pafs.copy_files(str(local), f"{BUCKET}/{key}", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    return f"gs://{BUCKET}/{key}"


def _records(fs, uri: str, split: str) -> list[tuple[float, float]]:
    """Every (x, y) of a split in object storage: its shards fetched through pyarrow, parsed by TensorFlow."""
    import tensorflow as tf

    schema, rows = load_schema(uri), []
    spec = {f.name: tf.io.FixedLenFeature([], tf.float32) for f in schema.features}
    compression = "GZIP" if json.loads(fs.open_input_stream(f"{uri[5:]}/_SUCCESS").read())["compression"] else ""
    for shard in split_files(uri, split):
        assert shard.startswith(uri + f"/{split}/")
        data = fs.open_input_stream(shard[5:], compression=None).read()  # the bytes as stored
        local = Path(os.environ["STORAGE_TEST_TMP"]) / Path(shard).name
        local.write_bytes(data)
        for record in tf.data.TFRecordDataset(str(local), compression_type=compression):
            parsed = tf.io.parse_single_example(record, spec)
            rows.append((float(parsed["x"]), float(parsed["y"])))
    return rows


def _csv_rows(*texts: str) -> list[tuple[float, float]]:
    rows = []
    for text in texts:
        rows += [(float(np.float32(r["x"])), float(np.float32(r["y"]))) for r in csv.DictReader(io.StringIO(text))]
    return rows


@pytest.mark.slow
def test_prepare_from_object_storage_into_object_storage_round_trip(gcs, tmp_path, monkeypatch):
    fs, options, endpoint = gcs
    monkeypatch.setenv("STORAGE_TEST_TMP", str(tmp_path))
    # Readers without options (load_schema, split_files) use the environment's store, as in a pod.
    monkeypatch.setenv("CLOUD_STORAGE_EMULATOR_ENDPOINT", endpoint)
    plain = write_linear_regression_csv(tmp_path / "day-1.csv", rows=3000, seed=1)
    packed = tmp_path / "day-2.csv.gz"
    second = write_linear_regression_csv(tmp_path / "day-2.csv", rows=2000, seed=2).read_text()
    packed.write_bytes(gzip.compress(second.encode()))
    _upload(fs, plain, "incoming/day-1.csv")
    _upload(fs, packed, "incoming/day-2.csv.gz")
    _upload(fs, plain, "incoming/other/day-1.csv")  # one level down: a single * does not reach it

    summary = prepare_dataset(f"gs://{BUCKET}/incoming/*.csv*", f"gs://{BUCKET}/datasets", "clicks", label="y",
                              shards=2, compression="gzip", storage_options=options, cache=True)
    uri = summary["dataset_uri"]
    assert uri == f"gs://{BUCKET}/datasets/clicks/1" and summary["rows"] == 5000 and not summary["cached"]
    # Every input row is in exactly one split, with its values.
    train, evaluation = _records(fs, uri, "train"), _records(fs, uri, "eval")
    assert (len(train), len(evaluation)) == (summary["counts"]["train"], summary["counts"]["eval"])
    assert sorted(train + evaluation) == sorted(_csv_rows(plain.read_text(), second))
    # The store holds the version and nothing else (the staging directory stayed local).
    names = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/datasets", recursive=True)))
    assert names == [f"{BUCKET}/datasets/clicks/1/{n}" for n in (
        "_SUCCESS", "eval/part-00000-of-00001.tfrecord.gz", "schema.json",
        "train/part-00000-of-00002.tfrecord.gz", "train/part-00001-of-00002.tfrecord.gz")]
    manifest = json.loads(fs.open_input_stream(f"{BUCKET}/datasets/clicks/1/_SUCCESS").read())
    assert manifest["source"]["files"] == [f"gs://{BUCKET}/incoming/day-1.csv", f"gs://{BUCKET}/incoming/day-2.csv.gz"]
    assert "endpoint" not in json.dumps(manifest)  # the options (credentials) are not recorded

    # The same input again: the version in the store is reused, nothing is encoded or uploaded.
    again = prepare_dataset(f"gs://{BUCKET}/incoming/*.csv*", f"gs://{BUCKET}/datasets", "clicks", label="y",
                            shards=2, compression="gzip", storage_options=options, cache=True)
    assert again["cached"] and again["dataset_uri"] == uri
    assert load_schema(uri).label_name == "y"

    # An existing version is refused, and replaced only when asked.
    with pytest.raises(DatasetExistsError, match="clicks/1 already exists"):
        prepare_dataset(plain, f"gs://{BUCKET}/datasets", "clicks", version=1, label="y", storage_options=options)
    replaced = prepare_dataset(plain, f"gs://{BUCKET}/datasets", "clicks", version=1, label="y", overwrite=True,
                               storage_options=options)
    assert replaced["rows"] == 3000 and sum(len(_records(fs, uri, s)) for s in ("train", "eval")) == 3000


@pytest.mark.slow
def test_bad_input_in_object_storage_is_named_by_its_uri_line_and_column(gcs, tmp_path):
    fs, options, _ = gcs
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n" + "".join(f"{i},{i}\n" for i in range(500)) + "abc,1\n")
    source = _upload(fs, bad, "bad/bad.csv")
    with pytest.raises(InputDataError, match=rf"{source} line 502, column 'x': value 'abc' is not a number"):
        prepare_dataset(source, f"gs://{BUCKET}/datasets", "bad", label="y", storage_options=options)
    with pytest.raises(InputDataError, match=rf"input gs://{BUCKET}/nothing/here.csv does not exist"):
        prepare_dataset(f"gs://{BUCKET}/nothing/here.csv", f"gs://{BUCKET}/datasets", "bad", storage_options=options)
    assert not fs.get_file_info(pafs.FileSelector(f"{BUCKET}/datasets/bad", allow_not_found=True, recursive=True))
    local = tmp_path / "good.csv"
    local.write_text("x,y\n1,1\n")
    with pytest.raises(DataError, match=r"'s3://' names no bucket; use s3://<bucket>/<path>"):
        prepare_dataset(local, "s3://", "good", label="y")  # not taken for a local folder named 's3:'
    assert not (tmp_path / "s3:").exists() and not os.path.exists("s3:")


@pytest.mark.slow
def test_prepare_operator_takes_credentials_from_an_airflow_connection(gcs, tmp_path, monkeypatch):
    """The connection is read from Airflow (its environment-variable secrets backend here)."""
    from airflow_tf.operators.prepare import storage_options

    fs, _, endpoint = gcs
    monkeypatch.setenv("AIRFLOW_CONN_TRAINING_GCS",
                       json.dumps({"conn_type": "google_cloud_platform", "extra": {"endpoint_url": endpoint}}))
    monkeypatch.setenv("AIRFLOW_CONN_TRAINING_S3", json.dumps({
        "conn_type": "aws", "login": "AKIDEXAMPLE", "password": "not-a-real-secret",
        "extra": {"region_name": "eu-west-1", "endpoint_url": "http://127.0.0.1:9000"}}))
    options = storage_options("training_s3", "training_gcs")
    assert options["s3"] == {"access_key": "AKIDEXAMPLE", "secret_key": "not-a-real-secret", "region": "eu-west-1",
                             "scheme": "http", "endpoint_override": "127.0.0.1:9000"}
    source = _upload(fs, write_linear_regression_csv(tmp_path / "a.csv", rows=1000, seed=4), "op/a.csv")
    summary = prepare_dataset(source, f"gs://{BUCKET}/datasets", "from_connection", label="y",
                              storage_options={"gs": options["gs"]})
    assert summary["rows"] == 1000 and fs.get_file_info(f"{BUCKET}/datasets/from_connection/1/_SUCCESS").size


def test_versions_committed_by_rename_refuse_an_object_storage_output():
    from airflow_tf.data.partitioned import plan_parts
    from airflow_tf.data.window import make_window

    with pytest.raises(DataError, match=r"output 'gs://b/datasets': parallel parts write into a directory they share"):
        plan_parts("/nowhere/*.csv", "gs://b/datasets", "clicks", 2)
    with pytest.raises(DataError, match=r"output 's3://b/datasets': a window version is committed beside its partitions"):
        make_window("s3://b/datasets", "clicks", last=7)


def test_connection_fields_become_file_system_options_and_mistakes_are_named():
    assert s3_options(None, None, {}, "aws_default") == {}
    assert s3_options("id", "key", {"aws_session_token": "t", "service_config": {"s3": {
        "endpoint_url": "https://s3.example.com"}}}, "c") == {
        "access_key": "id", "secret_key": "key", "session_token": "t", "scheme": "https",
        "endpoint_override": "s3.example.com"}
    with pytest.raises(DataError, match="connection 'c': give both the access key id"):
        s3_options("id", None, {}, "c")
    with pytest.raises(DataError, match=r"connection 'c': endpoint_url 'minio:9000' is not an endpoint URL"):
        s3_options(None, None, {"endpoint_url": "minio:9000"}, "c")
    assert gcs_options({"extra__google_cloud_platform__project": "p"}, "g") == {"project_id": "p"}


def test_training_refuses_s3_datasets_and_object_storage_run_directories_by_name():
    from airflow_tf.cluster.training import TrainingConfig
    from airflow_tf.data import make_dataset

    with pytest.raises(ValueError) as refused:
        TrainingConfig(dataset="s3://bucket/datasets/clicks/3", run_dir="gs://bucket/runs/1", steps=10)
    message = str(refused.value)
    assert "dataset: dataset 's3://bucket/datasets/clicks/3': the training tasks read the dataset through " \
           "TensorFlow, which has no s3:// file system" in message and "prepare it into gs://" in message
    assert "run_dir: run_dir 'gs://bucket/runs/1': the tasks write progress, logs and the model's code" in message
    TrainingConfig(dataset="gs://bucket/datasets/clicks/3", run_dir="/shared/runs/1", steps=10)  # accepted
    with pytest.raises(DataError, match="which has no s3:// file system"):
        make_dataset("s3://bucket/datasets/clicks/3")


@pytest.mark.slow
def test_tensorflow_file_systems_are_what_the_training_side_assumes():
    """The refusal above holds only while TensorFlow has gs:// but no s3:// built in."""
    code = "import tensorflow as tf, json; print(json.dumps(tf.io.gfile.get_registered_schemes()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    schemes = json.loads(out.stdout.strip().splitlines()[-1])
    assert "gs" in schemes and "s3" not in schemes, schemes


@pytest.mark.slow
def test_a_local_group_reaches_object_storage_only_when_isolation_is_turned_off(gcs, tmp_path, monkeypatch):
    from airflow_tf.backends import BackendError
    from airflow_tf.backends.local import _check_inputs
    from airflow_tf.cluster import GroupSpec, TrainingConfig

    fs, options, endpoint = gcs
    monkeypatch.setenv("CLOUD_STORAGE_EMULATOR_ENDPOINT", endpoint)
    source = _upload(fs, write_linear_regression_csv(tmp_path / "a.csv", rows=1000, seed=6), "local/a.csv")
    uri = prepare_dataset(source, f"gs://{BUCKET}/datasets", "for_local", label="y",
                          storage_options=options)["dataset_uri"]
    config = TrainingConfig(dataset=uri, run_dir=str(tmp_path / "run"), steps=10)
    with pytest.raises(BackendError, match=r"dataset 'gs://.*' is on remote storage, .* set isolate_network=False"):
        _check_inputs(GroupSpec.for_training("isolated", config))
    _check_inputs(GroupSpec.for_training("open", config, isolate_network=False))  # reads its _SUCCESS and schema
