"""Object storage: prepare from and into ``gs://`` and ``s3://`` through ``pyarrow.fs``,
credentials from Airflow connections, bounded failures, and what the training tasks accept.

The stores are stand-ins on loopback, in memory. For Cloud Storage, ``gcp-storage-emulator``
(from PyPI, in .venv) serves the JSON API; pyarrow's GCS client is pointed at it through a
connection's ``endpoint_url`` or ``CLOUD_STORAGE_EMULATOR_ENDPOINT``. TensorFlow's own GCS client
(what the training tasks read ``gs://`` with) has its endpoint compiled in and cannot be pointed
at an emulator, so the records are read back here through pyarrow and parsed with TensorFlow.
For Amazon S3, moto's ``moto_server`` (from PyPI) serves the S3 API; it runs from its own
environment, ``.venv-s3`` (``scripts/s3-server-env``, which ``scripts/test`` runs), because moto
needs botocore, which requires python-dateutil < 3 where this project's locks pin 4.0."""

from __future__ import annotations

import csv
import gzip
import importlib.util
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
from airflow_tf.data import object_store
from airflow_tf.data.object_store import gcs_options, s3_options
from airflow_tf.data.samples import write_linear_regression_csv

BUCKET = "training-data"
S3_VENV = Path(os.environ.get("AIRFLOW_TF_S3_VENV") or Path(__file__).resolve().parents[2] / ".venv-s3")


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
    """Every (x, y) of a split, its shards fetched through ``fs`` (a store's, or the local file
    system for a local dataset) and parsed by TensorFlow."""
    import tensorflow as tf

    def path(location: str) -> str:  # inside the file system
        return location.split("://", 1)[1] if "://" in location else location

    schema, rows = load_schema(uri), []
    spec = {f.name: tf.io.FixedLenFeature([], tf.float32) for f in schema.features}
    compression = "GZIP" if json.loads(fs.open_input_stream(path(f"{uri}/_SUCCESS")).read())["compression"] else ""
    for shard in split_files(uri, split):
        assert shard.startswith(uri + f"/{split}/")
        data = fs.open_input_stream(path(shard), compression=None).read()  # the bytes as stored
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
                             "scheme": "http", "endpoint_override": "127.0.0.1:9000", "conn_id": "training_s3"}
    source = _upload(fs, write_linear_regression_csv(tmp_path / "a.csv", rows=1000, seed=4), "op/a.csv")
    summary = prepare_dataset(source, f"gs://{BUCKET}/datasets", "from_connection", label="y",
                              storage_options={"gs": options["gs"]})
    assert summary["rows"] == 1000 and fs.get_file_info(f"{BUCKET}/datasets/from_connection/1/_SUCCESS").size


def test_versions_committed_by_rename_refuse_an_object_storage_output():
    from airflow_tf.data.parts import plan_parts
    from airflow_tf.data.window import make_window

    with pytest.raises(DataError, match=r"output 'gs://b/datasets': parallel parts write into a directory they share"):
        plan_parts("/nowhere/*.csv", "gs://b/datasets", "clicks", 2)
    with pytest.raises(DataError, match=r"output 's3://b/datasets': a window version is committed beside its partitions"):
        make_window("s3://b/datasets", "clicks", last=7)


def test_connection_fields_become_file_system_options_and_mistakes_are_named():
    assert s3_options(None, None, {}, "aws_default") == {"conn_id": "aws_default"}
    assert s3_options("id", "key", {"aws_session_token": "t", "service_config": {"s3": {
        "endpoint_url": "https://s3.example.com"}}}, "c") == {
        "access_key": "id", "secret_key": "key", "session_token": "t", "scheme": "https",
        "endpoint_override": "s3.example.com", "conn_id": "c"}
    with pytest.raises(DataError, match="connection 'c': give both the access key id"):
        s3_options("id", None, {}, "c")
    with pytest.raises(DataError, match=r"connection 'c': endpoint_url 'minio:9000' is not an endpoint URL"):
        s3_options(None, None, {"endpoint_url": "minio:9000"}, "c")
    assert gcs_options({"extra__google_cloud_platform__project": "p"}, "g") == {"project_id": "p", "conn_id": "g"}


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
    from airflow_tf.backends.local.backend import _check_inputs
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


# -- Amazon S3, against moto's server ---------------------------------------------------------
def _start(command: list[str], port: int, log: Path, what: str) -> subprocess.Popen:
    """Start a stand-in server and wait until its port accepts connections."""
    with open(log, "wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"{what} did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """An S3-compatible stand-in (moto's server) on loopback: (pyarrow file system, endpoint URL)."""
    command = S3_VENV / "bin" / "moto_server"
    if not command.exists():
        pytest.fail(f"the S3 stand-in {command} is missing: run ./scripts/s3-server-env (./scripts/test runs it), "
                    "or point AIRFLOW_TF_S3_VENV at an environment with moto[server] installed")
    port = _free_port()
    server = _start([str(command), "-H", "127.0.0.1", "-p", str(port)], port,
                    tmp_path_factory.mktemp("s3") / "moto.log", "the S3 stand-in (moto_server)")
    try:
        endpoint = f"http://127.0.0.1:{port}"
        fs = pafs.S3FileSystem(access_key="testing", secret_key="testing", region="us-east-1", scheme="http",
                               endpoint_override=f"127.0.0.1:{port}", allow_bucket_creation=True)
        fs.create_dir(BUCKET)
        yield fs, endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)


def _s3_connection(monkeypatch, name: str, endpoint: str) -> None:
    """An Airflow connection (the environment-variable secrets backend) to the stand-in."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{name.upper()}", json.dumps({
        "conn_type": "aws", "login": "testing", "password": "testing",
        "extra": {"region_name": "us-east-1", "endpoint_url": endpoint}}))


def _stand_in_options(endpoint: str) -> dict:
    """The stand-in's options given directly, not through an Airflow connection, for tests of
    prepare itself: they run where Airflow is not installed (a training image) too."""
    return {"s3": s3_options("testing", "testing", {"region_name": "us-east-1", "endpoint_url": endpoint}, "stand-in")}


def _put(fs, local: Path, key: str) -> str:
    pafs.copy_files(str(local), f"{BUCKET}/{key}", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    return f"s3://{BUCKET}/{key}"


def _objects(fs, prefix: str) -> list[str]:
    return sorted(i.path for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/{prefix}", allow_not_found=True,
                                                                     recursive=True)) if i.type == pafs.FileType.File)


@pytest.mark.slow
def test_prepare_from_s3_into_s3_through_an_airflow_connection_equals_a_local_prepare(s3, tmp_path, monkeypatch):
    from airflow_tf.operators.prepare import PrepareTFRecordsOperator

    fs, endpoint = s3
    _s3_connection(monkeypatch, "training_s3", endpoint)
    monkeypatch.setenv("STORAGE_TEST_TMP", str(tmp_path))
    # Readers without options (load_schema, split_files) use the environment's store, as in a pod.
    for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    local_inputs = tmp_path / "incoming"
    local_inputs.mkdir()
    plain = write_linear_regression_csv(local_inputs / "day-1.csv", rows=3000, seed=1)
    packed = local_inputs / "day-2.csv.gz"
    packed.write_bytes(gzip.compress(write_linear_regression_csv(tmp_path / "day-2.csv", rows=2000, seed=2).read_bytes()))
    _put(fs, plain, "incoming/day-1.csv")
    _put(fs, packed, "incoming/day-2.csv.gz")

    operator = PrepareTFRecordsOperator(task_id="prepare", input=f"s3://{BUCKET}/incoming/*.csv*",
                                        output=f"s3://{BUCKET}/datasets", name="clicks", label="y", shards=2,
                                        compression="gzip", aws_conn_id="training_s3", outlets=[])
    summary = operator.execute({})
    uri = summary["dataset_uri"]
    assert uri == f"s3://{BUCKET}/datasets/clicks/1" and summary["rows"] == 5000
    assert _objects(fs, "datasets") == [f"{BUCKET}/datasets/clicks/1/{n}" for n in (
        "_SUCCESS", "eval/part-00000-of-00001.tfrecord.gz", "schema.json",
        "train/part-00000-of-00002.tfrecord.gz", "train/part-00001-of-00002.tfrecord.gz")]
    manifest = json.loads(fs.open_input_stream(f"{BUCKET}/datasets/clicks/1/_SUCCESS").read())
    assert "testing" not in json.dumps(manifest) and "training_s3" not in json.dumps(manifest)

    # The same files prepared locally: the same records in each split.
    here = prepare_dataset(str(local_inputs / "*.csv*"), tmp_path / "datasets", "clicks", label="y", shards=2,
                           compression="gzip")
    assert here["counts"] == summary["counts"]
    local = pafs.LocalFileSystem()
    for split in ("train", "eval"):
        assert sorted(_records(fs, uri, split)) == sorted(_records(local, here["dataset_uri"], split)), split
    everything = _records(fs, uri, "train") + _records(fs, uri, "eval")
    assert sorted(everything) == sorted(_csv_rows(plain.read_text(), (tmp_path / "day-2.csv").read_text()))


@pytest.mark.slow
def test_a_failed_prepare_into_s3_leaves_no_version_and_names_what_failed(s3, tmp_path, monkeypatch):
    from airflow_tf.operators.prepare import storage_options

    fs, endpoint = s3
    _s3_connection(monkeypatch, "training_s3", endpoint)
    options = storage_options("training_s3", None)
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n" + "".join(f"{i},{i}\n" for i in range(500)) + "abc,1\n")
    source = _put(fs, bad, "bad/bad.csv")
    with pytest.raises(InputDataError, match=rf"{source} line 502, column 'x': value 'abc' is not a number"):
        prepare_dataset(source, f"s3://{BUCKET}/datasets", "bad", label="y", storage_options=options)
    with pytest.raises(InputDataError, match=rf"input s3://{BUCKET}/nothing/here.csv does not exist"):
        prepare_dataset(f"s3://{BUCKET}/nothing/here.csv", f"s3://{BUCKET}/datasets", "bad", storage_options=options)
    assert _objects(fs, "datasets/bad") == []  # no _SUCCESS, no version, no shard

    # A bucket that does not exist: named, with the connection used; nothing is left anywhere.
    good = _put(fs, write_linear_regression_csv(tmp_path / "good.csv", rows=100, seed=3), "good/good.csv")
    with pytest.raises(DataError) as refused:
        prepare_dataset(good, "s3://no-such-bucket/datasets", "good", label="y", storage_options=options)
    assert "s3://no-such-bucket/datasets" in str(refused.value)
    assert "Airflow connection 'training_s3' (aws_conn_id)" in str(refused.value)
    assert "testing" not in str(refused.value)  # the keys are not in the message
    with pytest.raises(InputDataError, match=r"input s3://no-such-bucket/in\.csv does not exist; check the bucket"):
        prepare_dataset("s3://no-such-bucket/in.csv", tmp_path / "out", "good", label="y", storage_options=options)
    assert not (tmp_path / "out" / "good").exists() or not any((tmp_path / "out" / "good").iterdir())


def _losing_the_staged_files(upload):
    """``upload`` (the real upload to the real stand-in store), failing on the staging side:
    after the first object is written, the staged files not yet uploaded vanish (a full or
    lost local disk)."""
    def upload_tree(directory, uri, *args, **kwargs):
        uploads = upload(directory, uri, *args, **kwargs)
        yield next(uploads)
        for staged in directory.rglob("*.tfrecord"):
            staged.unlink()
        yield from uploads
    return upload_tree


@pytest.mark.slow
def test_an_upload_that_fails_midway_removes_what_it_wrote_and_the_next_prepare_takes_that_version(
        s3, tmp_path, monkeypatch):
    fs, endpoint = s3
    options = _stand_in_options(endpoint)
    source = write_linear_regression_csv(tmp_path / "in.csv", rows=2000, seed=4)
    real_upload = object_store.upload_tree
    monkeypatch.setattr(object_store, "upload_tree", _losing_the_staged_files(real_upload))
    with pytest.raises(DataError, match=rf"uploading .* to s3://{BUCKET}/datasets/halfway/1/.* failed.*"
                                        rf"nothing is left under s3://{BUCKET}/datasets/halfway/1; prepare again"):
        prepare_dataset(source, f"s3://{BUCKET}/datasets", "halfway", label="y", shards=3, storage_options=options)
    assert _objects(fs, "datasets/halfway") == [], "the first object written is removed again"

    monkeypatch.setattr(object_store, "upload_tree", real_upload)
    summary = prepare_dataset(source, f"s3://{BUCKET}/datasets", "halfway", label="y", shards=3,
                              storage_options=options)
    assert summary["dataset_uri"] == f"s3://{BUCKET}/datasets/halfway/1", "the failed attempt left no version behind"
    assert f"{BUCKET}/datasets/halfway/1/_SUCCESS" in _objects(fs, "datasets/halfway")


def _manifest_and_objects(fs, prefix: str) -> tuple[dict, list[str]]:
    """A version's ``_SUCCESS`` manifest and the objects under its prefix."""
    manifest = json.loads(fs.open_input_stream(f"{BUCKET}/{prefix}/_SUCCESS").read())
    return manifest, _objects(fs, prefix)


@pytest.mark.slow
def test_an_overwrite_that_fails_midway_keeps_the_old_version_whole_and_a_good_one_replaces_it(
        s3, tmp_path, monkeypatch):
    fs, endpoint = s3
    options = _stand_in_options(endpoint)
    output = f"s3://{BUCKET}/datasets"
    old = prepare_dataset(write_linear_regression_csv(tmp_path / "old.csv", rows=2000, seed=5), output, "replaced",
                          label="y", shards=2, storage_options=options)
    assert old["dataset_uri"] == f"{output}/replaced/1"
    before = _manifest_and_objects(fs, "datasets/replaced/1")
    new_input = write_linear_regression_csv(tmp_path / "new.csv", rows=3000, seed=6)
    real_upload = object_store.upload_tree
    monkeypatch.setattr(object_store, "upload_tree", _losing_the_staged_files(real_upload))
    with pytest.raises(DataError, match=rf"failed.*nothing is left under {output}/replaced/\.tmp-1-\w+; prepare "
                                        rf"again; {output}/replaced/1 is as it was"):
        prepare_dataset(new_input, output, "replaced", version=1, overwrite=True, label="y", shards=2,
                        storage_options=options)
    assert _manifest_and_objects(fs, "datasets/replaced/1") == before, "the old version is untouched"
    assert _objects(fs, "datasets/replaced") == before[1], "nothing else is left beside it"

    monkeypatch.setattr(object_store, "upload_tree", real_upload)
    new = prepare_dataset(new_input, output, "replaced", version=1, overwrite=True, label="y", shards=2,
                          storage_options=options)
    manifest, objects = _manifest_and_objects(fs, "datasets/replaced/1")
    assert new["dataset_uri"] == f"{output}/replaced/1" and manifest["source"]["rows"] == 3000
    listed = {f"{BUCKET}/datasets/replaced/1/{split}/{shard['file']}"
              for split, info in manifest["splits"].items() for shard in info["shards"]}
    assert set(objects) == listed | {f"{BUCKET}/datasets/replaced/1/{n}" for n in ("_SUCCESS", "schema.json")}
    assert _objects(fs, "datasets/replaced") == objects, "the staged upload is gone once copied in"


def test_a_staged_upload_left_by_a_killed_prepare_is_deleted_once_it_is_old(s3, tmp_path, monkeypatch):
    """An overwrite killed between its upload and the swap leaves ``<name>/.tmp-<version>-<id>/``:
    no version to readers, but it stays in the bucket. The next prepare of that dataset deletes
    it once it is older than a day (a younger one may be another prepare's, still uploading)."""
    fs, endpoint = s3
    from airflow_tf.data import versions as versions_module

    options = _stand_in_options(endpoint)
    output = f"s3://{BUCKET}/datasets"
    source = write_linear_regression_csv(tmp_path / "in.csv", rows=1000, seed=7)
    staged = "datasets/tidy/.tmp-1-0123456789ab"
    for name in ("train/part-00000-of-00001.tfrecord", "schema.json"):
        with fs.open_output_stream(f"{BUCKET}/{staged}/{name}") as out:
            out.write(b"left by a prepare killed mid-swap")
    first = prepare_dataset(source, output, "tidy", label="y", shards=1, storage_options=options)
    assert first["dataset_uri"] == f"{output}/tidy/1", "the staged prefix is not a version"
    assert len(_objects(fs, staged)) == 2, "a young staged upload may be in use: it is kept"

    monkeypatch.setattr(versions_module, "_STALE_AFTER", 0.0)
    second = prepare_dataset(source, output, "tidy", label="y", shards=1, storage_options=options)
    assert second["dataset_uri"] == f"{output}/tidy/2"
    assert _objects(fs, staged) == [], "the abandoned staged upload is deleted"
    assert {p.split("/")[3] for p in _objects(fs, "datasets/tidy")} == {"1", "2"}


# -- bounded failures, no server needed -------------------------------------------------------
def _closed_port() -> int:
    return _free_port()  # nothing listens there once the probe socket is closed


def _no_cloud_credentials(monkeypatch, tmp_path) -> None:
    """No credentials anywhere: the environment's, the files in HOME, the metadata servers (a closed port)."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "GOOGLE_", "CLOUD_STORAGE_", "GCE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    # File systems built from the environment earlier in this process (the emulator's) are not reused.
    monkeypatch.setattr(object_store, "_FILESYSTEMS", type(object_store._FILESYSTEMS)())
    monkeypatch.setenv("GCE_METADATA_ROOT", f"127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")


@pytest.mark.slow
def test_gs_without_credentials_fails_within_a_bound_and_says_what_to_set(tmp_path, monkeypatch):
    """pyarrow's own lookup retries the metadata server for minutes; the file system bounds it
    (here to 5 s instead of its 20: the bound is what is checked, not its value)."""
    _no_cloud_credentials(monkeypatch, tmp_path)
    monkeypatch.setattr(object_store, "GCS_RETRY_SECONDS", 5)
    started = time.monotonic()
    with pytest.raises(InputDataError) as failed:
        prepare_dataset(f"gs://{BUCKET}/incoming/day-1.csv", tmp_path / "datasets", "clicks", label="y")
    seconds = time.monotonic() - started
    message = str(failed.value)
    assert message.startswith(f"cannot read gs://{BUCKET}/incoming/day-1.csv: ")
    assert "no Airflow connection was given (gcp_conn_id)" in message and "set gcp_conn_id" in message
    assert "GOOGLE_APPLICATION_CREDENTIALS" in message
    # The bound plus room for a loaded machine; pyarrow's default retries for 15 minutes.
    assert seconds < object_store.GCS_RETRY_SECONDS + 60, seconds
    assert not (tmp_path / "datasets").exists()


def test_s3_without_a_reachable_store_or_connection_fails_quickly_naming_its_absence(tmp_path, monkeypatch):
    _no_cloud_credentials(monkeypatch, tmp_path)
    closed = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    started = time.monotonic()
    with pytest.raises(InputDataError) as failed:
        prepare_dataset(f"s3://{BUCKET}/day-1.csv", tmp_path / "datasets", "clicks", label="y")
    message = str(failed.value)
    assert message.startswith(f"cannot read s3://{BUCKET}/day-1.csv: ")
    assert "no Airflow connection was given (aws_conn_id)" in message and "set aws_conn_id" in message
    assert time.monotonic() - started < object_store.S3_CONNECT_SECONDS * object_store.S3_ATTEMPTS + 60
    assert not (tmp_path / "datasets").exists()


@pytest.mark.skipif(importlib.util.find_spec("airflow.sdk") is None,
                    reason="reads an Airflow connection: Airflow is not installed (a training image)")
def test_s3_through_an_unreachable_connection_fails_quickly_naming_it_and_not_its_secret(tmp_path, monkeypatch):
    from airflow_tf.operators.prepare import storage_options

    _no_cloud_credentials(monkeypatch, tmp_path)
    closed = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    monkeypatch.setenv("AIRFLOW_CONN_CLOSED_S3", json.dumps({
        "conn_type": "aws", "login": "AKIDEXAMPLE", "password": "not-a-real-secret", "extra": {"endpoint_url": closed}}))
    with pytest.raises(InputDataError) as failed:
        prepare_dataset(f"s3://{BUCKET}/day-1.csv", tmp_path / "datasets", "clicks", label="y",
                        storage_options=storage_options("closed_s3", None))
    message = str(failed.value)
    assert "from Airflow connection 'closed_s3' (aws_conn_id)" in message and "not-a-real-secret" not in message
    assert time.monotonic() - started < object_store.S3_CONNECT_SECONDS * object_store.S3_ATTEMPTS + 60
    assert not (tmp_path / "datasets").exists()


def test_file_systems_are_kept_for_the_most_recently_used_credentials_only(monkeypatch):
    """A long-lived worker whose key rotates keeps a bounded number of file systems."""
    monkeypatch.setattr(object_store, "_FILESYSTEMS", type(object_store._FILESYSTEMS)())
    kept = object_store.FILESYSTEMS_KEPT

    def options(key: int) -> dict:  # a rotated credential: other options, another file system
        return {"gs": {"anonymous": True, "project_id": f"project-{key}", "conn_id": "rotating"}}

    first, _ = object_store.filesystem(f"gs://{BUCKET}/a", options(0))
    assert object_store.filesystem(f"gs://{BUCKET}/b", options(0))[0] is first  # reused
    for key in range(1, 3 * kept):
        object_store.filesystem(f"gs://{BUCKET}/a", options(key))
        if key == kept // 2:
            recent, _ = object_store.filesystem(f"gs://{BUCKET}/a", options(0))
            assert recent is first  # still kept: it was used since
    assert len(object_store._FILESYSTEMS) == kept
    newest, _ = object_store.filesystem(f"gs://{BUCKET}/a", options(3 * kept - 1))
    assert newest is object_store.filesystem(f"gs://{BUCKET}/a", options(3 * kept - 1))[0]
    assert object_store.filesystem(f"gs://{BUCKET}/a", options(0))[0] is not first  # dropped, built anew
    assert len(object_store._FILESYSTEMS) == kept
