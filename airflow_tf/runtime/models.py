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
import math
import os
import sys
from collections.abc import Callable

import keras
import tensorflow as tf

from airflow_tf.cluster.model_code import ModelCodeError, read_model_code
from airflow_tf.cluster.training import BUILTIN_MODELS, TrainingConfig
from airflow_tf.files import strip_file_scheme

from .errors import ModelError
from .logs import log

REGRESSION_LOSS = "mean_squared_error"
CLASSIFICATION_LOSS = "sparse_categorical_crossentropy"


# -- built-in models ------------------------------------------------------------------------
JOINED_FEATURES = "features"
"""The built-in models' layer that joins every feature into one float32 matrix."""


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
    features = columns[0] if len(columns) == 1 else keras.layers.Concatenate(name=JOINED_FEATURES)(columns)
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
def model_function(reference: str, code_dir: str | None = None) -> Callable[..., keras.Model]:
    """A built-in model by name, or the function an import path ``package.module:function`` names,
    imported from the run's snapshot of the model's code (``code_dir``) first."""
    if reference in _BUILTINS:
        return _BUILTINS[reference]
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise ModelError(
            f"model {reference!r}: use a built-in model ({', '.join(_BUILTINS)}) or 'package.module:function'"
        )
    if code_dir:
        _import_from_first(code_dir, module_name)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        where = f"the run's code snapshot {code_dir} or " if code_dir else ""
        raise ModelError(
            f"model {reference!r}: cannot import module {module_name!r} ({exc}); it must be in {where}the "
            "training image: keep it next to the DAG file (the launch copies it into the run directory) or "
            "install it, or put it on PYTHONPATH"
        ) from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise ModelError(f"model {reference!r}: module {module_name!r} has no function {attr!r}")
    return function


def _import_from_first(code_dir: str, module_name: str) -> None:
    """Put the run's code directory first on ``sys.path``; a copy of the model's top-level
    module imported from elsewhere before (the DAGs folder in an Airflow worker, another run's
    snapshot) is forgotten, so this run's code is what gets imported."""
    directory = os.path.abspath(strip_file_scheme(code_dir))
    if not os.path.isdir(directory):
        raise ModelError(
            f"model code directory {directory} does not exist: the launch copies the model's code into the run "
            "directory, so every task must see the run directory on the same shared storage"
        )
    try:
        snapshot = read_model_code(directory)
    except ModelCodeError as exc:
        raise ModelError(str(exc)) from None
    if directory in sys.path:
        sys.path.remove(directory)
    sys.path.insert(0, directory)
    importlib.invalidate_caches()
    top = module_name.split(".", maxsplit=1)[0]
    loaded = sys.modules.get(top)
    origin = getattr(loaded, "__file__", None) or ""
    in_snapshot = os.path.exists(os.path.join(directory, top + ".py")) or os.path.isdir(os.path.join(directory, top))
    if loaded is not None and in_snapshot and not os.path.abspath(origin).startswith(directory + os.sep):
        for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
            del sys.modules[name]
    if snapshot is not None:
        log(f"airflow-tf model code {module_name} from {directory} sha256={snapshot.sha256}")


def _call_model_function(function: Callable[..., keras.Model], config: TrainingConfig, schema) -> keras.Model:
    """``function(**model_kwargs)``, with ``schema=`` too when the function declares it (or ``**kwargs``)."""
    kwargs = dict(config.model_kwargs or {})
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # no signature to read (some C functions): call it as documented
        signature = None
    if signature is None or any(p.name == "schema" or p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        kwargs["schema"] = schema
    try:
        if signature is not None:
            signature.bind(**kwargs)
    except TypeError as exc:
        given = {k: v for k, v in kwargs.items() if k != "schema"}
        raise ModelError(
            f"model {config.model!r}: model_kwargs {given} do not fit its arguments {signature} ({exc}); a model "
            "function takes no arguments, schema, and/or the keyword arguments you pass as model_kwargs"
        ) from None
    model = function(**kwargs)
    if not isinstance(model, keras.Model):
        raise ModelError(f"model {config.model!r} returned {type(model).__name__}, not a keras.Model")
    return model


def build_model(config: TrainingConfig, schema) -> keras.Model:
    """The run's Keras model, called with the dataset's features (a dict by name), returning
    the predictions.

    The model function is called with its ``model_kwargs``, and ``schema=`` when it declares it.
    How the features reach the model (:func:`feed_features`) and whether its output fits the label
    (:func:`check_output`) are checked here, before any training. In graph mode under a
    ``replica_device_setter`` its variables land on the ps tasks."""
    model = _call_model_function(model_function(config.model, config.code_dir), config, schema)
    model = feed_features(model, schema, config.model)
    output = _output_spec(model, schema, config.model)
    check_output(output.shape, schema, loss_name(config, schema), config.model)
    return model


# -- features to inputs ---------------------------------------------------------------------
class FeatureAdapter(keras.Model):
    """Feeds the dataset's features (a dict by name) to a model that takes them otherwise: one
    input, a list of inputs, another shape or dtype. It adds no weights of its own, so its
    weights (and checkpoints) are the wrapped model's."""

    def __init__(self, model: keras.Model, adapt: Callable[[dict], object], *, takes_matrix: bool = False):
        super().__init__(name=f"{model.name}_fed")
        self.wrapped = model
        self._adapt = adapt
        self.takes_matrix = takes_matrix
        """Whether ``adapt`` only joins the features into one float32 matrix (:func:`matrix_model`)."""

    def call(self, features, training=None):
        return self.wrapped(self._adapt(features), training=training)


def _declared_inputs(model: keras.Model) -> list[tuple[str, keras.KerasTensor]] | None:
    """(name, tensor) of each input a model declares (functional, Sequential with an Input),
    by dict key when the model takes a dict; None for a model that declares none (subclassed)."""
    try:
        inputs = model.inputs
    except AttributeError:
        return None
    if not inputs:
        return None
    struct = getattr(model, "_inputs_struct", None)
    if isinstance(struct, dict) and len(struct) == len(inputs):
        return list(struct.items())
    return [(tensor.name, tensor) for tensor in inputs]


def _shape_text(shape) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _target_shape(shape: tuple, dtype: str, input_shape: tuple, input_dtype: str) -> tuple | None:
    """The per-example shape a feature of ``shape`` takes to fit an input declared
    ``(None, *input_shape)``: its own when they agree (unknown dimensions agree with any), a
    reshape when both hold the same number of values; None when they do not fit, or when one is
    text and the other numbers."""
    if (dtype == "string") != (input_dtype == "string"):
        return None
    if len(input_shape) == len(shape) and all(d is None or d == s for d, s in zip(input_shape, shape, strict=True)):
        return shape
    if None not in input_shape and math.prod(input_shape) == math.prod(shape):
        return tuple(input_shape)
    return None


def _convert(value, shape: tuple, target: tuple, dtype: str, input_dtype: str):
    if target != shape:
        value = keras.ops.reshape(value, (-1, *target))
    if dtype not in ("string", input_dtype):
        value = keras.ops.cast(value, input_dtype)
    return value


def _matrix(features: dict, schema, dtype: str = "float32"):
    """Every feature, in schema order, flattened into one ``(batch, n)`` matrix of ``dtype``."""
    columns = [keras.ops.reshape(keras.ops.cast(features[name], dtype), (-1, schema[name].size))
               for name in schema.feature_names]
    return columns[0] if len(columns) == 1 else keras.ops.concatenate(columns, axis=-1)


def feed_features(model: keras.Model, schema, reference: str = "model") -> keras.Model:
    """The model itself when it takes the features dict as it is, else a :class:`FeatureAdapter`.

    Rules, in order: inputs named after features get those features (reshaped to the declared
    input when it holds as many values, cast to its dtype); a model with one input gets the
    dataset's one feature, or, when the dataset has several numeric features, all of them as
    one float matrix ``(batch, n)`` in schema order (vector features flattened in place), or
    ``(batch,)`` / another shape of n values when the input declares it. A Sequential model
    without an ``Input`` gets the one feature or that matrix; any other model without declared
    inputs (subclassed) gets the features dict. When no rule fits, :class:`ModelError` lists the
    model's inputs and the dataset's features with their shapes."""
    names = schema.feature_names
    if not names:
        raise ModelError("the dataset has no input features besides the label")
    specs = {name: schema[name] for name in names}
    numeric = all(spec.dtype != "string" for spec in specs.values())
    inputs = _declared_inputs(model)
    if inputs is None:
        return _feed_undeclared(model, schema, reference, numeric=numeric)
    declared = {name: (tuple(t.shape[1:]), t.dtype) for name, t in inputs}
    if all(name in specs for name, _ in inputs):  # inputs named after features
        return _feed_by_name(model, schema, reference, declared)
    if len(inputs) == 1:
        adapter = _feed_one_input(model, schema, *next(iter(declared.values())), numeric=numeric)
        if adapter is not None:
            return adapter
    raise _unfed(model, schema, reference, None)


def _feed_by_name(model: keras.Model, schema, reference: str, declared: dict) -> keras.Model:
    """:func:`feed_features` for a model whose inputs are all named after features: each input
    gets its feature, reshaped and cast to what it declares (``declared``: name -> (shape, dtype))."""
    names = schema.feature_names
    specs = {name: schema[name] for name in names}
    dict_inputs = isinstance(getattr(model, "_inputs_struct", None), dict)
    targets = {name: _target_shape(specs[name].shape, specs[name].dtype, *declared[name]) for name in declared}
    misfits = [name for name, target in targets.items() if target is None]
    if misfits:
        raise _unfed(model, schema, reference, f"input(s) {', '.join(misfits)} named after features do not "
                     "take their shape or dtype")
    fitted = {name: target for name, target in targets.items() if target is not None}  # all, after misfits
    if dict_inputs and set(declared) == set(names) and all(
            declared[n] == (specs[n].shape, specs[n].dtype) for n in names):
        return model  # takes the features dict as it is (the built-in models do)

    def by_name(features):
        values = {n: _convert(features[n], specs[n].shape, fitted[n], specs[n].dtype, declared[n][1])
                  for n in declared}
        if dict_inputs:
            return values
        return next(iter(values.values())) if len(values) == 1 else list(values.values())

    return FeatureAdapter(model, by_name)


def _feed_one_input(model: keras.Model, schema, shape: tuple, dtype, *, numeric: bool) -> keras.Model | None:
    """:func:`feed_features` for a model with one input of ``shape`` and ``dtype`` not named
    after a feature: the dataset's one feature, or its numeric features as one matrix; None when
    neither fits."""
    names = schema.feature_names
    if len(names) == 1:
        spec = schema[names[0]]
        reshaped = _target_shape(spec.shape, spec.dtype, shape, dtype)
        if reshaped is None:
            return None
        return FeatureAdapter(model, lambda features: _convert(features[spec.name], spec.shape, reshaped,
                                                               spec.dtype, dtype))
    if not (numeric and keras.backend.is_float_dtype(dtype)):
        return None
    width = (sum(schema[name].size for name in names),)
    target = _target_shape(width, dtype, shape, dtype)
    if target is None:
        return None
    return FeatureAdapter(model, lambda features: _convert(_matrix(features, schema, dtype), width,
                                                           target, dtype, dtype),
                          takes_matrix=target == width and dtype == "float32")


def matrix_model(model: keras.Model, schema, reference: str) -> keras.Model | None:
    """``model`` fed its features already joined into one float32 matrix ``(batch, n)``, in
    schema order: its own layers and weights from where it joins them, without a reshape per
    feature and the concatenation (a ms of a 20 ms step on 64 features). The training feeds it
    whole rows gathered from the in-memory share (``make_dataset(..., features_as_matrix=True)``).
    None unless every feature is a float32 scalar and the model (``reference``: a built-in, or
    one input of ``n`` floats) starts by joining them so."""
    names = schema.feature_names
    if len(names) < 2 or any(schema[n].dtype != "float32" or schema[n].shape != () for n in names):
        return None
    if isinstance(model, FeatureAdapter):
        return model.wrapped if model.takes_matrix else None
    if reference not in _BUILTINS:
        return None
    # The built-ins take a dict by name, so the joined matrix is an inner tensor of their graph.
    return keras.Model(model.get_layer(JOINED_FEATURES).output, model.output, name=f"{model.name}_on_rows")


def _feed_undeclared(model: keras.Model, schema, reference: str, *, numeric: bool) -> keras.Model:
    """:func:`feed_features` for a model without declared inputs: a subclassed model gets the
    features dict; a Sequential one the one text feature, or the numeric features as one matrix."""
    names = schema.feature_names
    if not isinstance(model, keras.Sequential):
        return model
    if len(names) == 1 and not numeric:
        return FeatureAdapter(model, lambda features: features[names[0]])
    if numeric:
        return FeatureAdapter(model, lambda features: _matrix(features, schema))
    raise _unfed(model, schema, reference, "a Sequential model takes one input, and text features do not "
                 "make a float matrix")


def _unfed(model: keras.Model, schema, reference: str, why: str | None) -> ModelError:
    """The error for a model no feeding rule fits: its inputs and the dataset's features, with shapes."""
    inputs = _declared_inputs(model) or []
    described = ", ".join(f"{name} {_shape_text(tuple(t.shape))} {t.dtype}" for name, t in inputs) or "undeclared"
    total = sum(schema[name].size for name in schema.feature_names if schema[name].dtype != "string")
    label = f" (and the label {schema.label.name!r})" if schema.label else ""
    return ModelError(
        f"model {reference!r} cannot take this dataset's features{': ' + why if why else ''}. The model's inputs: "
        f"{described}. The dataset's features: {_features_text(schema)}{label}. A model gets the features whose "
        "names its inputs have (keras.Input(name=...)); a model with one input gets the one feature, or all "
        f"numeric features as one float matrix (None, {total}) in schema order. Name the inputs after the "
        "features, or give the model one input of that shape"
    )


def _features_text(schema) -> str:
    return ", ".join(f"{n} {_shape_text((None, *schema[n].shape))} {schema[n].dtype}" for n in schema.feature_names)


def _output_spec(model: keras.Model, schema, reference: str):
    """The model's output as a symbolic tensor, from symbolic features: builds the model (a
    subclassed one too) and finds a model that cannot take the features before training."""
    features = {name: keras.KerasTensor((None, *schema[name].shape), schema[name].dtype)
                for name in schema.feature_names}
    try:
        output = model.compute_output_spec(features)
    except Exception as exc:  # whatever the user's call raises, it is about feeding it the features
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        # Keras wraps the call's own error in advice about compute_output_spec: keep the cause.
        text = text.split("Error encountered:")[-1]
        raise ModelError(
            f"model {reference!r} fails on the dataset's features ({_features_text(schema)}): "
            f"{type(exc).__name__}: {' '.join(text.split())[:500]}"
        ) from None
    if not isinstance(output, keras.KerasTensor):
        raise ModelError(f"model {reference!r} returns {type(output).__name__}; training expects one tensor of "
                         "predictions (a model with several outputs needs a loss per output, which is not supported)")
    return output


def loss_name(config: TrainingConfig, schema) -> str:
    """``config.loss``, else mean squared error for a float label and sparse categorical
    cross-entropy for an integer (class) label."""
    if config.loss is not None:
        return config.loss
    label = schema.label
    return CLASSIFICATION_LOSS if label is not None and label.dtype == "int64" else REGRESSION_LOSS


def check_output(shape, schema, loss: str, reference: str = "model") -> None:
    """Refuse a model whose output ``shape`` (``(None, ...)``) does not fit the label and the
    loss, naming both shapes; TensorFlow would otherwise fail deep inside the first step
    ("Incompatible shapes: [64] vs. [64,5]") or, worse, broadcast silently."""
    label = schema.label
    if label is None:
        return
    shape = tuple(shape)
    per_example = shape[1:]
    scalar = label.shape in ((), (1,))
    what = (f"label {label.name!r} is a scalar {label.dtype}" if scalar
            else f"label {label.name!r} is {label.dtype} of shape {_shape_text(label.shape)} per example")
    if "sparse" in loss.lower():
        if scalar and len(per_example) == 1 and (per_example[0] is None or per_example[0] >= 2):
            return
        raise ModelError(
            f"model {reference!r} outputs {_shape_text(shape)} but {what}, a class index for the loss {loss}: "
            "the model must output (None, num_classes), one score per class, num_classes >= 2 (e.g. a last "
            "layer Dense(num_classes, activation='softmax')). For regression on this label pass "
            "loss='mean_squared_error'"
        )
    expected = [(), (1,)] if scalar else [label.shape]
    if any(len(per_example) == len(e) and all(d is None or d == w for d, w in zip(per_example, e, strict=True))
           for e in expected):
        return
    wanted = " or ".join(_shape_text((None, *e)) for e in expected)
    raise ModelError(
        f"model {reference!r} outputs {_shape_text(shape)} but {what}: with the loss {loss} the model must "
        f"output {wanted}, one prediction per example"
        + (" (e.g. a last layer Dense(1))" if scalar else "")
        + (". For classes, prepare the label as int64 class indices" if label.dtype != "int64" and scalar else "")
    )


def resolve_loss(config: TrainingConfig, schema):
    """The Keras loss of the run: ``config.loss`` if set, else mean squared error for a float
    label and sparse categorical cross-entropy for an integer (class) label."""
    name = loss_name(config, schema)
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
    "FeatureAdapter", "ModelError", "build_model", "check_checkpoint", "check_output", "checkpoint_weights",
    "compute_loss", "feed_features", "latest_checkpoint", "linear_regression", "loss_name", "matrix_model",
    "mlp_classifier", "model_function", "resolve_checkpoint", "resolve_loss", "restore_model", "weight_key",
]
