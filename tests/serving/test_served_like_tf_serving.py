"""Exports answer through TensorFlow Serving's loading path, for each kind of model.

Each model kind (regression, classification, string and integer vocabularies, a vocabulary
file, hashed ids with embeddings) gets a checkpoint written here in the layout training writes
(one tensor per Keras weight, ``model/NNN_name``), so these tests are quick and run in the
training image too; real training runs of the other kinds (tables sharded on the ps,
coordinator mode, towers, warm start) check their exports the same way in their own tests.
Each export is moved away, its run directory and dataset deleted, and then loaded in a fresh
process as the model server loads it and through ``tf.saved_model.load``."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from serving_check import WARMUP, export_and_serve_elsewhere, request_rows, serve_both_ways

from airflow_tf.cluster import TrainingConfig
from airflow_tf.data import load_schema, prepare_dataset
from airflow_tf.runtime import models
from airflow_tf.serving import ExportError, export_saved_model, list_versions, model_dir

MODELS = '''
import keras


def classifier(schema):
    price = keras.Input((), name="price")
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Reshape((1,))(price))
    return keras.Model({"price": price}, keras.layers.Dense(2, activation="softmax")(hidden))


def lookups(schema):
    """A click model: a counted vocabulary, a hashed id, a known-values integer id, a price."""
    user = keras.Input((), dtype="string", name="user")
    item = keras.Input((), dtype="string", name="item")
    shop = keras.Input((), dtype="int64", name="shop")
    price = keras.Input((), name="price")
    users = keras.layers.StringLookup(vocabulary=schema.vocabulary("user"))(user)
    shops = keras.layers.IntegerLookup(vocabulary=[1, 2, 3])(shop)
    parts = [keras.layers.Embedding(schema_size, 4)(ids) for schema_size, ids in
             ((len(schema.vocabulary("user")) + 1, users), (64, keras.layers.Hashing(64)(item)), (5, shops))]
    parts.append(keras.layers.Reshape((1,))(price))
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()(parts))
    return keras.Model({"user": user, "item": item, "shop": shop, "price": price},
                       keras.layers.Dense(1, activation="sigmoid")(hidden))


def vocabulary_file(schema):
    """StringLookup given the dataset's vocabulary file: the export must carry it as an asset."""
    user = keras.Input((), dtype="string", name="user")
    ids = keras.layers.StringLookup(vocabulary=schema.vocabulary_file("user"))(user)
    embedded = keras.layers.Embedding(len(schema.vocabulary("user")) + 1, 4)(ids)
    return keras.Model({"user": user}, keras.layers.Dense(1, activation="sigmoid")(embedded))
'''


# Raw ids as a client sends them, unknown ones included (the lookups' out-of-vocabulary slot).
RAW_ROWS = {"user": np.array([b"u1", b"never-seen"]), "item": np.array([b"i3", b"i-new"]),
            "shop": np.array([2, 99]), "price": np.array([1.5, 3.0], np.float32)}


@pytest.fixture(scope="module")
def clicks_csv(tmp_path_factory):
    rng = np.random.default_rng(5)
    root = tmp_path_factory.mktemp("served-clicks")
    rows = [f"u{rng.integers(20)},i{rng.integers(500)},{rng.integers(1, 5)},{rng.random() * 10:.3f},{rng.integers(2)}"
            for _ in range(400)]
    csv = root / "clicks.csv"
    csv.write_text("user,item,shop,price,clicked\n" + "\n".join(rows) + "\n")
    (root / "code").mkdir()
    (root / "code" / "served_models.py").write_text(textwrap.dedent(MODELS))
    return csv, root / "code"


@pytest.fixture
def model_code(clicks_csv, monkeypatch):
    _, code = clicks_csv
    monkeypatch.syspath_prepend(str(code))
    yield
    sys.modules.pop("served_models", None)


@pytest.fixture
def clicks(clicks_csv, tmp_path, model_code):
    """A dataset of this test's own (deleted by the test), with a vocabulary of ``user``."""
    csv, _ = clicks_csv
    return prepare_dataset(csv, tmp_path / "datasets", name="clicks", label="clicked", shards=2,
                           string_columns=["user", "item"], vocabularies={"user": 15})["dataset_uri"]


def write_checkpoint(config: TrainingConfig, dataset: str, step: int = 7) -> str:
    """A checkpoint of the model's initial weights, in the layout training writes."""
    model = models.build_model(config, load_schema(dataset))
    prefix = f"{config.run_dir}/model.ckpt-{step}"
    names = [models.weight_key(index, weight) for index, weight in enumerate(model.weights)] + ["global_step"]
    tensors = [tf.convert_to_tensor(weight.numpy()) for weight in model.weights] + [tf.constant(step, tf.int64)]
    tf.io.gfile.makedirs(config.run_dir)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)
    tf.compat.v1.train.update_checkpoint_state(config.run_dir, f"model.ckpt-{step}")
    return prefix


def served(config: TrainingConfig, tmp_path, probe=None):
    """The export of a checkpoint written here, served elsewhere (serving_check)."""
    write_checkpoint(config, config.dataset)
    return export_and_serve_elsewhere(config.run_dir, config.dataset, config, tmp_path, probe=probe)


def test_a_regression_export_serves_through_the_session_loader(linear_dataset, tmp_path):
    config = TrainingConfig(dataset=linear_dataset, run_dir=str(tmp_path / "run"), steps=7)
    exported, _, _ = served(config, tmp_path)
    assert exported["task"] == "regression"


def test_a_classifier_export_serves_predictions_probabilities_and_classes(clicks, tmp_path):
    config = TrainingConfig(dataset=clicks, run_dir=str(tmp_path / "run"), steps=7, model="served_models:classifier")
    exported, moved, expected = served(config, tmp_path, probe=RAW_ROWS)
    assert exported["task"] == "classification"
    assert exported["signature"]["outputs"] == ["predictions", "classes", "probabilities"]
    outputs = tf.saved_model.load(str(moved)).signatures["serving_default"](
        **{name: tf.constant(value) for name, value in RAW_ROWS.items()})
    np.testing.assert_array_equal(outputs["classes"].numpy(), np.argmax(expected, axis=-1))
    np.testing.assert_allclose(outputs["probabilities"].numpy().sum(axis=-1), 1.0, rtol=1e-5)


def test_vocabularies_hashing_and_embeddings_serve_raw_string_ids(clicks, tmp_path):
    from airflow_tf.serving.warmup import predict_requests, write_requests

    config = TrainingConfig(dataset=clicks, run_dir=str(tmp_path / "run"), steps=7, model="served_models:lookups",
                            loss="binary_crossentropy")
    exported, moved, on_raw = served(config, tmp_path, probe=RAW_ROWS)
    assert exported["task"] == "binary_classification"
    write_requests(tmp_path / "raw", predict_requests(RAW_ROWS, "model", "serving_default"))
    np.testing.assert_allclose(serve_both_ways(moved, tmp_path / "raw", tmp_path), on_raw, rtol=1e-5, atol=1e-6)


def test_a_vocabulary_file_is_carried_in_the_export_as_an_asset(clicks, tmp_path):
    config = TrainingConfig(dataset=clicks, run_dir=str(tmp_path / "run"), steps=7, model="served_models:vocabulary_file",
                            loss="binary_crossentropy")
    vocabulary = load_schema(clicks).vocabulary("user")
    _, moved, _ = served(config, tmp_path)
    (asset,) = (moved / "assets").iterdir()
    assert asset.read_text().splitlines() == vocabulary, "the vocabulary travels with the export"


def test_warmup_requests_are_prediction_logs_of_eval_rows(clicks, tmp_path):
    from tensorflow_serving.apis import prediction_log_pb2

    config = TrainingConfig(dataset=clicks, run_dir=str(tmp_path / "run"), steps=7, model="served_models:lookups",
                            loss="binary_crossentropy")
    exported = export_saved_model(config.run_dir, clicks, config, tmp_path / "models", "clicks", force=True,
                                  checkpoint=write_checkpoint(config, clicks))
    records = list(tf.data.TFRecordDataset(f"{exported['path']}/{WARMUP}").as_numpy_iterator())
    logs = [prediction_log_pb2.PredictionLog.FromString(record) for record in records]
    assert 1 < len(logs) <= 1000, "TensorFlow Serving replays at most 1000 warm-up records"
    for log in logs:
        request = log.predict_log.request
        assert (request.model_spec.name, request.model_spec.signature_name) == ("clicks", "serving_default")
        assert set(request.inputs) == {"user", "item", "shop", "price"}
    (first_eval_rows, _), = _eval_split(clicks).take(1)
    sent = request_rows(f"{exported['path']}/{WARMUP}")
    for name in ("user", "item", "shop", "price"):
        np.testing.assert_array_equal(sent[name], first_eval_rows[name].numpy(), err_msg=f"{name}: not the eval rows")
    assert serve_both_ways(Path(exported["path"]), Path(exported["path"]) / WARMUP, tmp_path).shape == (64, 1)


def _eval_split(dataset: str):
    from airflow_tf.data import make_dataset

    return make_dataset(dataset, split="eval", batch_size=64, shuffle=False, epochs=1)


def test_warmup_requests_can_be_turned_off_and_the_export_is_still_checked(clicks, tmp_path):
    config = TrainingConfig(dataset=clicks, run_dir=str(tmp_path / "run"), steps=7, model="served_models:classifier")
    exported = export_saved_model(config.run_dir, clicks, config, tmp_path / "models", "m", force=True,
                                  checkpoint=write_checkpoint(config, clicks), warmup_requests=False)
    assert (tmp_path / "models" / "m" / "1" / "saved_model.pb").exists()
    assert not (tmp_path / "models" / "m" / "1" / WARMUP).exists()
    assert exported["version"] == 1


def test_an_export_the_session_loader_cannot_restore_is_not_published(clicks, tmp_path, monkeypatch):
    """The way exports used to be written (the Keras model an attribute of a ``tf.Module``) loads
    through tf.saved_model.load but not in TensorFlow Serving: the check catches it."""
    from airflow_tf.serving import export

    def module_export(path, model, schema, task, logits):
        specs = {name: tf.TensorSpec([None, *schema[name].shape], tf.as_dtype(schema[name].dtype), name=name)
                 for name in schema.feature_names}
        root = tf.Module()
        root.model = model
        serve = tf.function(lambda features: {"predictions": root.model(features, training=False)},
                            input_signature=[specs])
        tf.saved_model.save(root, str(path), signatures={"serving_default": serve})

    monkeypatch.setattr(export, "_write_saved_model", module_export)
    config = TrainingConfig(dataset=clicks, run_dir=str(tmp_path / "run"), steps=7, model="served_models:classifier")
    with pytest.raises(ExportError, match=r"does not serve: .*Could not find variable dense.*nothing was published"):
        export_saved_model(config.run_dir, clicks, config, tmp_path / "models", "m", force=True,
                           checkpoint=write_checkpoint(config, clicks))
    assert list_versions(model_dir(tmp_path / "models", "m")) == []
    assert list((tmp_path / "models" / "m").iterdir()) == [], "no staged version is left behind"
