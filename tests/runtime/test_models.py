"""The model API shared by training, evaluation and export, and the training targets, in-process."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from airflow_tf.cluster import TrainingConfig
from airflow_tf.data import count_examples
from airflow_tf.data.schema import FeatureSpec, Schema
from airflow_tf.runtime import loop, models, training
from airflow_tf.runtime.errors import TaskConfigError

MIXED = Schema((FeatureSpec("x", "float32"), FeatureSpec("v", "float32", (3,)), FeatureSpec("k", "int64"),
                FeatureSpec("y", "float32")), label_name="y")
CLASSES = Schema((FeatureSpec("a", "float32", (2,)), FeatureSpec("label", "int64")), label_name="label")


def config(**options) -> TrainingConfig:
    return TrainingConfig(dataset="/data/ds/1", run_dir="/runs/r", steps=10, **options)


def test_linear_regression_takes_every_numeric_feature_by_name():
    model = models.build_model(config(), MIXED)
    kernel, bias = model.weights
    assert tuple(kernel.shape) == (5, 1) and tuple(bias.shape) == (1,)
    model.set_weights([np.arange(1, 6, dtype=np.float32).reshape(5, 1), np.array([10.0], np.float32)])
    features = {"x": np.array([1.0, 0.0], np.float32), "v": np.ones((2, 3), np.float32), "k": np.array([2, 0])}
    # 1*x + (2+3+4)*1 + 5*k + 10
    np.testing.assert_allclose(model(features).numpy()[:, 0], [1 + 9 + 10 + 10, 9 + 10])
    assert models.resolve_loss(config(), MIXED) is keras.losses.get("mean_squared_error")


def test_mlp_classifier_gives_class_probabilities_and_a_class_loss():
    model = models.build_model(config(model="mlp_classifier", model_kwargs={"num_classes": 3, "hidden_units": [8]}),
                               CLASSES)
    probabilities = model({"a": np.random.default_rng(0).normal(size=(4, 2)).astype(np.float32)}).numpy()
    assert probabilities.shape == (4, 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    loss = models.resolve_loss(config(model="mlp_classifier"), CLASSES)
    assert loss is keras.losses.get("sparse_categorical_crossentropy")
    assert float(models.compute_loss(loss, np.array([0, 1, 2, 0]), probabilities)) > 0


def test_a_built_in_model_on_whole_rows_predicts_as_it_does_on_the_features_by_name():
    """What the training feeds a built-in model when every feature is a float32 scalar and the
    share is in memory: the batch's rows as one matrix, into the layers after the join."""
    schema = Schema((*(FeatureSpec(f"f{i}", "float32") for i in range(6)), FeatureSpec("label", "int64")),
                    label_name="label")
    options = config(model="mlp_classifier", model_kwargs={"num_classes": 3, "hidden_units": [8, 4]})
    model = models.build_model(options, schema)
    on_rows = models.matrix_model(model, schema, options.model)
    rows = np.random.default_rng(1).normal(size=(5, 6)).astype(np.float32)
    by_name = model({f"f{i}": rows[:, i] for i in range(6)}).numpy()
    np.testing.assert_allclose(on_rows(rows).numpy(), by_name, rtol=1e-6)
    assert [id(w) for w in on_rows.weights] == [id(w) for w in model.weights], "the same weights, not copies"
    # Any other feature joins the dict as before: a vector (CLASSES), an int64 or a vector (MIXED).
    assert models.matrix_model(models.build_model(config(), MIXED), MIXED, "linear_regression") is None
    assert models.matrix_model(model, CLASSES, options.model) is None


@pytest.mark.parametrize("options, schema, message", [
    ({"model": "mlp_classifier"}, CLASSES, r"needs num_classes: pass model_kwargs=\{'num_classes': N\}"),
    ({"model": "mlp_classifier", "model_kwargs": {"num_classes": 2}}, MIXED, "label 'y' is float32"),
    ({"model_kwargs": {"units": 3}}, MIXED, r"model 'linear_regression': model_kwargs \{'units': 3\} do not fit"),
    ({"model": "no_such_module_here:build"}, MIXED, "cannot import module 'no_such_module_here'.*PYTHONPATH"),
    ({"model": "math:no_such_function"}, MIXED, "module 'math' has no function 'no_such_function'"),
    ({"model": "math:sqrt"}, MIXED, "do not fit its arguments"),
])
def test_a_model_that_cannot_be_built_is_refused_naming_the_option(options, schema, message):
    with pytest.raises(models.ModelError, match=message):
        models.build_model(config(**options), schema)


def test_built_in_models_refuse_string_features():
    schema = Schema((FeatureSpec("city", "string"), FeatureSpec("y", "float32")), label_name="y")
    with pytest.raises(models.ModelError, match="feature 'city' is a string.*package.module:function"):
        models.build_model(config(), schema)


def test_a_user_model_gets_the_schema_and_its_keyword_arguments(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(
        "import keras\n"
        "def scaled(schema, factor):\n"
        "    inputs = {name: keras.Input(shape=schema[name].shape, name=name) for name in schema.feature_names}\n"
        "    return keras.Model(inputs, keras.layers.Rescaling(factor)(inputs['x']))\n"
        "def not_a_model(schema):\n"
        "    return 'model'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    schema = Schema((FeatureSpec("x", "float32", (1,)), FeatureSpec("y", "float32")), label_name="y")
    model = models.build_model(config(model="my_models:scaled", model_kwargs={"factor": 3.0}), schema)
    np.testing.assert_allclose(model({"x": np.array([[2.0]], np.float32)}).numpy(), [[6.0]])
    with pytest.raises(models.ModelError, match="returned str, not a keras.Model"):
        models.build_model(config(model="my_models:not_a_model"), schema)


def test_a_scalar_label_is_compared_per_example_not_broadcast():
    loss = keras.losses.get("mean_squared_error")
    predictions = tf.constant([[1.0], [2.0], [4.0]])
    assert float(models.compute_loss(loss, tf.constant([1.0, 2.0, 3.0]), predictions)) == pytest.approx(1 / 3)


def test_unknown_loss_and_missing_checkpoints_are_clear_errors(tmp_path):
    with pytest.raises(models.ModelError, match="loss 'mean_cubed_error' is not a Keras loss"):
        models.resolve_loss(config(loss="mean_cubed_error"), MIXED)
    with pytest.raises(models.ModelError, match="holds no checkpoint"):
        models.resolve_checkpoint(tmp_path)
    with pytest.raises(models.ModelError, match="does not exist: pass a run directory or a checkpoint prefix"):
        models.resolve_checkpoint(tmp_path / "model.ckpt-7")
    assert models.latest_checkpoint(tmp_path) is None


def test_epochs_become_a_target_step_over_the_training_split(linear_dataset):
    examples = count_examples(linear_dataset, "train")
    asynchronous = TrainingConfig(dataset=linear_dataset, run_dir="/r", epochs=2.5, batch_size=32)
    assert loop.target_step(asynchronous, 32) == math.ceil(2.5 * examples / 32)
    # A sync step aggregates one batch from each of two workers.
    synchronous = TrainingConfig(dataset=linear_dataset, run_dir="/r", epochs=2.5, batch_size=32, sync=True)
    per_step = 32 * training.replicas_to_aggregate(synchronous, trainers=2)
    assert loop.target_step(synchronous, per_step) == math.ceil(2.5 * examples / 64)
    assert loop.target_step(TrainingConfig(dataset=linear_dataset, run_dir="/r", steps=7), 64) == 7


def test_sync_cannot_aggregate_more_gradients_than_there_are_trainers():
    assert training.replicas_to_aggregate(config(sync=True, replicas_to_aggregate=1), trainers=3) == 1
    assert training.replicas_to_aggregate(config(replicas_to_aggregate=2), trainers=3) == 1, "async: one per step"
    with pytest.raises(TaskConfigError, match="replicas_to_aggregate=4 is more than the 3 training task"):
        training.replicas_to_aggregate(config(sync=True, replicas_to_aggregate=4), trainers=3)


def test_batch_normalization_statistics_are_updated_by_graph_training():
    # Keras updates moving statistics on the side; in graph mode they must ride with the train op.
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        inputs = keras.Input(shape=(2,), name="x")
        model = keras.Model({"x": inputs}, keras.layers.Dense(1)(keras.layers.BatchNormalization()(inputs)))
        predictions, updates = training.training_forward(model, {"x": tf.random.normal([64, 2], mean=5.0)})
        step = tf.group(predictions, *updates)
        session.run(tf.compat.v1.global_variables_initializer())
        for _ in range(20):
            session.run(step)
        moving_mean = next(w for w in model.weights if "moving_mean" in w.path)
        assert session.run(moving_mean.value) == pytest.approx([5.0 * (1 - 0.99 ** 20)] * 2, rel=0.1)
