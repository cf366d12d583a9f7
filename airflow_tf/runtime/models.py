"""The model of a training run: built-in models, user models, loss, and reading trained
weights back from a checkpoint.

Training (graph mode, variables on the ps tasks), evaluation and export (eager) all build the
model through :func:`build_model`, so there is one definition of it. Checkpoints name the model's
weights by position (``model/000_kernel``, ``model/001_bias``, ...) rather than by Keras layer
name: Keras numbers unnamed layers per process (``dense``, ``dense_1``, ...), so a name-based
checkpoint would not match the same model built in another process."""

from __future__ import annotations

import importlib
import inspect
import os
from typing import Callable

import keras
import tensorflow as tf

from airflow_tf.cluster.training import BUILTIN_MODELS, TrainingConfig

from .errors import ModelError

REGRESSION_LOSS = "mean_squared_error"
CLASSIFICATION_LOSS = "sparse_categorical_crossentropy"


# -- built-in models ------------------------------------------------------------------------
def _numeric_inputs(schema) -> tuple[dict[str, keras.KerasTensor], keras.KerasTensor]:
    """One Keras input per feature of the schema, and all of them flattened into one float32
    matrix ``[batch, sum of feature sizes]``."""
    inputs: dict[str, keras.KerasTensor] = {}
    columns = []
    for name in schema.feature_names:
        spec = schema[name]
        if spec.dtype == "string":
            raise ModelError(
                f"feature {name!r} is a string: the built-in models take numeric features only; "
                "drop the column when preparing the dataset or use a model of your own (package.module:function)"
            )
        inputs[name] = keras.Input(shape=spec.shape, dtype=spec.dtype, name=name)
        columns.append(keras.ops.reshape(keras.ops.cast(inputs[name], "float32"), (-1, spec.size)))
    if not columns:
        raise ModelError("the dataset has no input features besides the label")
    features = columns[0] if len(columns) == 1 else keras.layers.Concatenate(name="features")(columns)
    return inputs, features


def linear_regression(schema) -> keras.Model:
    """``y = w . x + b``: one Dense unit over every feature (the seed's ``y = 2x + 10``)."""
    inputs, features = _numeric_inputs(schema)
    outputs = keras.layers.Dense(1, name="linear")(features)
    return keras.Model(inputs, outputs, name="linear_regression")


def mlp_classifier(schema, num_classes: int | None = None, hidden_units: list[int] | tuple[int, ...] = (64, 64),
                   activation: str = "relu", dropout: float = 0.0) -> keras.Model:
    """Dense hidden layers, then a softmax over ``num_classes`` (labels 0..num_classes-1)."""
    label = schema.label
    if num_classes is None:
        raise ModelError(
            "mlp_classifier needs num_classes: pass model_kwargs={'num_classes': N} "
            f"(the number of distinct values of the label {label.name if label else ''!r}, labelled 0..N-1)"
        )
    if int(num_classes) < 2:
        raise ModelError(f"mlp_classifier: num_classes must be at least 2, got {num_classes}")
    if label is not None and label.dtype != "int64":
        raise ModelError(
            f"mlp_classifier: the label {label.name!r} is {label.dtype}; class labels must be int64 "
            "(0..num_classes-1): declare it int64 when preparing the dataset"
        )
    inputs, x = _numeric_inputs(schema)
    for i, units in enumerate(hidden_units):
        x = keras.layers.Dense(int(units), activation=activation, name=f"hidden_{i}")(x)
        if dropout:
            x = keras.layers.Dropout(float(dropout), name=f"dropout_{i}")(x)
    outputs = keras.layers.Dense(int(num_classes), activation="softmax", name="classes")(x)
    return keras.Model(inputs, outputs, name="mlp_classifier")


_BUILTINS: dict[str, Callable[..., keras.Model]] = {
    "linear_regression": linear_regression,
    "mlp_classifier": mlp_classifier,
}
assert set(_BUILTINS) == set(BUILTIN_MODELS)


# -- the model of a run ---------------------------------------------------------------------
def model_function(reference: str) -> Callable[..., keras.Model]:
    """A built-in model by name, or the function an import path ``package.module:function`` names."""
    if reference in _BUILTINS:
        return _BUILTINS[reference]
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise ModelError(
            f"model {reference!r}: use a built-in model ({', '.join(_BUILTINS)}) or 'package.module:function'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(
            f"model {reference!r}: cannot import module {module_name!r} ({exc}); "
            "install it in the training image or put it on PYTHONPATH"
        ) from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise ModelError(f"model {reference!r}: module {module_name!r} has no function {attr!r}")
    return function


def build_model(config: TrainingConfig, schema) -> keras.Model:
    """The run's Keras model: inputs are the schema's features by name, the output the predictions.

    Called as ``function(schema=schema, **config.model_kwargs)``. In graph mode under a
    ``replica_device_setter`` its variables land on the ps tasks."""
    function = model_function(config.model)
    kwargs = dict(config.model_kwargs or {})
    try:
        inspect.signature(function).bind(schema=schema, **kwargs)
    except TypeError as exc:
        raise ModelError(f"model {config.model!r}: model_kwargs {kwargs} do not fit its arguments ({exc})") from None
    model = function(schema=schema, **kwargs)
    if not isinstance(model, keras.Model):
        raise ModelError(f"model {config.model!r} returned {type(model).__name__}, not a keras.Model")
    return model


def resolve_loss(config: TrainingConfig, schema):
    """The Keras loss of the run: ``config.loss`` if set, else mean squared error for a float
    label and sparse categorical cross-entropy for an integer (class) label."""
    name = config.loss
    if name is None:
        label = schema.label
        name = CLASSIFICATION_LOSS if label is not None and label.dtype == "int64" else REGRESSION_LOSS
    try:
        return keras.losses.get(name)
    except ValueError:
        raise ModelError(f"loss {name!r} is not a Keras loss (e.g. mean_squared_error, sparse_categorical_crossentropy)") from None


def compute_loss(loss, labels, predictions):
    """The mean loss of a batch, in graph or eager mode.

    A scalar label per example against a ``[batch, 1]`` prediction is compared element-wise
    (not broadcast to ``[batch, batch]``, which a plain loss function would do silently)."""
    labels, predictions = tf.convert_to_tensor(labels), tf.convert_to_tensor(predictions)
    if predictions.shape.rank == labels.shape.rank + 1 and predictions.shape[-1] == 1:
        labels = tf.cast(tf.expand_dims(labels, -1), predictions.dtype)
    return tf.reduce_mean(loss(labels, predictions))


# -- checkpoints ----------------------------------------------------------------------------
def weight_key(index: int, weight) -> str:
    """The checkpoint name of the model's ``index``-th weight."""
    return f"model/{index:03d}_{weight.name.replace('/', '_')}"


def latest_checkpoint(run_dir: str | os.PathLike) -> str | None:
    """The prefix of the newest checkpoint in ``run_dir`` (``.../model.ckpt-1200``), or None."""
    return tf.train.latest_checkpoint(os.fspath(run_dir))


def resolve_checkpoint(run_dir_or_checkpoint: str | os.PathLike) -> str:
    """A checkpoint prefix from a run directory (its newest checkpoint) or a prefix itself."""
    path = os.fspath(run_dir_or_checkpoint)
    if os.path.isdir(path):
        prefix = latest_checkpoint(path)
        if prefix is None:
            raise ModelError(f"{path} holds no checkpoint (no 'checkpoint' file): has training written one yet?")
        return prefix
    if os.path.exists(path + ".index"):
        return path
    raise ModelError(f"checkpoint {path!r} does not exist: pass a run directory or a checkpoint prefix (model.ckpt-N)")


def check_checkpoint(checkpoint: str, model: keras.Model):
    """Refuse a checkpoint that lacks one of ``model.weights`` or stores it in another shape
    (written for another model); returns the checkpoint's reader."""
    reader = tf.train.load_checkpoint(checkpoint)
    stored = reader.get_variable_to_shape_map()
    for index, weight in enumerate(model.weights):
        key = weight_key(index, weight)
        if key not in stored:
            raise ModelError(
                f"checkpoint {checkpoint} has no weight {key!r} ({weight.path}): it was written for "
                "another model; use the same model and model_kwargs as the run that wrote it"
            )
        if tuple(stored[key]) != tuple(weight.shape):
            raise ModelError(
                f"checkpoint {checkpoint}: weight {key!r} ({weight.path}) has shape {tuple(stored[key])}, "
                f"the model expects {tuple(weight.shape)}; use the model_kwargs of the run that wrote it"
            )
    return reader


def checkpoint_weights(checkpoint: str, model: keras.Model) -> list:
    """The values of ``model.weights`` stored in ``checkpoint`` (a prefix), in order."""
    reader = check_checkpoint(checkpoint, model)
    return [reader.get_tensor(weight_key(index, weight)) for index, weight in enumerate(model.weights)]


def restore_model(run_dir_or_checkpoint: str | os.PathLike, config: TrainingConfig, schema) -> keras.Model:
    """An eager Keras model (built by :func:`build_model`) holding the weights of the newest
    checkpoint of a run directory, or of the given checkpoint prefix."""
    checkpoint = resolve_checkpoint(run_dir_or_checkpoint)
    model = build_model(config, schema)
    model.set_weights(checkpoint_weights(checkpoint, model))
    return model


__all__ = [
    "ModelError", "build_model", "check_checkpoint", "checkpoint_weights", "compute_loss", "latest_checkpoint",
    "linear_regression", "mlp_classifier", "model_function", "resolve_checkpoint", "resolve_loss",
    "restore_model", "weight_key",
]
