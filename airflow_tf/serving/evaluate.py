"""Evaluation of a training run's checkpoint (and of an exported SavedModel, the served
baseline) on the dataset's eval split, blessing, and ``metrics.json`` + the training-curve PNG.

TensorFlow is imported inside the functions: Airflow-side code imports this module cheaply."""

from __future__ import annotations

import math
import os
import re
import time
from typing import Any
from collections.abc import Callable, Mapping

from airflow_tf.cluster import TrainingConfig
from airflow_tf.cluster.model_code import model_code_record
from airflow_tf.files import local_path, read_json, write_json

from .blessing import TASK_METRICS, baseline_metric_for, decide, training_context, validate_thresholds
from .curves import plot_training_curve
from .versions import latest_export

METRICS_FILE = "metrics.json"
PLOT_FILE = "training_curve.png"
EVAL_SPLIT = "eval"
EVAL_BATCH_SIZE = 512
DEFAULT_LOSS = {"regression": "mean_squared_error", "classification": "sparse_categorical_crossentropy",
                "binary_classification": "binary_crossentropy"}
"""The loss of an export that does not record how it was trained."""


class EvaluationError(RuntimeError):
    """The run or model cannot be evaluated; the message names the run, checkpoint or export."""


def training_config(config: TrainingConfig | Mapping[str, Any]) -> TrainingConfig:
    """A TrainingConfig from itself or its dict (as it travels through XCom)."""
    return config if isinstance(config, TrainingConfig) else TrainingConfig.from_dict(dict(config))


def evaluate_checkpoint(  # noqa: PLR0917  public signature: callers pass these positionally
        run_dir: str | os.PathLike[str], dataset_uri: str, config: TrainingConfig | Mapping[str, Any],
        thresholds: Mapping[str, Any] | str | None = None, baseline: Mapping[str, Any] | None = None,
        checkpoint: str | None = None, *, baseline_metric: str | None = None,
        batch_size: int = EVAL_BATCH_SIZE, plot: bool = True) -> dict[str, Any]:
    """Evaluate the run's final (or the given) checkpoint on the eval split and bless it or not.

    ``thresholds``: ``{"mse": {"max": 1.0}, "accuracy": {"min": 0.9}}``. ``baseline``: the
    served model's metrics (from :func:`served_baseline`, or any ``{"metrics": {...}}``); the
    candidate must be at least as good on ``baseline_metric`` (or the baseline's ``"metric"``;
    default ``mse`` / ``accuracy``). Writes ``<run_dir>/metrics.json`` (atomically) and
    ``<run_dir>/training_curve.png``, and returns what metrics.json holds."""
    from airflow_tf.data import load_schema
    from airflow_tf.runtime import models

    validate_thresholds(thresholds)  # fail on a typo before minutes of evaluation
    run_path = local_path(run_dir, "run_dir")
    config = training_config(config)
    schema = load_schema(dataset_uri)
    checkpoint = models.resolve_checkpoint(checkpoint or run_path)
    model = models.restore_model(checkpoint, config, schema)
    loss = models.resolve_loss(config, schema)

    task, metrics, examples = _evaluate(_keras_predict(model), dataset_uri, schema, loss, batch_size,
                                        what=f"checkpoint {checkpoint}")
    if baseline is not None and baseline_metric is None:
        baseline_metric = baseline.get("metric")
    blessed, checks = decide(metrics, task, thresholds, baseline, baseline_metric)
    reasons = [c["reason"] for c in checks]
    if not blessed:  # what the run itself shows, since runs of one DAG can differ
        reasons += training_context(read_json(run_path / "progress.json", missing_ok=True),
                                    checkpoint_step(checkpoint), config.sync, config.replicas_to_aggregate)

    result: dict[str, Any] = {
        "run_dir": str(run_path),
        "checkpoint": checkpoint,
        "global_step": checkpoint_step(checkpoint),
        "dataset": str(dataset_uri),
        "model_code": model_code_record(config.code_dir),  # the code's sha256 makes the run reproducible
        "split": EVAL_SPLIT,
        "examples": examples,
        "task": task,
        "metrics": metrics,
        "thresholds": validate_thresholds(thresholds, task),
        "baseline": _baseline_summary(baseline, task, baseline_metric),
        "blessed": blessed,
        "reasons": reasons,
        "checks": checks,
        "metrics_file": str(run_path / METRICS_FILE),
        "plot": None,
        "evaluated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if plot:
        verdict = "blessed" if blessed else "NOT blessed"
        title = f"{run_path.name} at step {result['global_step']}: {verdict}"
        png = plot_training_curve(run_path, run_path / PLOT_FILE, metrics, title=title)
        result["plot"] = str(png) if png else None
    write_json(run_path / METRICS_FILE, result)  # last: its presence means the evaluation is complete
    refuse_non_finite(metrics, f"checkpoint {checkpoint}")
    return result


def refuse_non_finite(metrics: Mapping[str, Any], what: str) -> None:
    """Raise :class:`EvaluationError` naming every metric that is NaN or infinite."""
    bad = {name: value for name, value in metrics.items()
           if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value)}
    if bad:
        raise EvaluationError(
            f"{what}: eval metric(s) {', '.join(f'{name}={value}' for name, value in bad.items())} are not finite: "
            "the model diverged (NaN/inf weights or predictions). It is not blessed and cannot be exported; "
            "train again with a lower learning_rate, or with on_nan='stop' to keep the last finite checkpoint"
        )


def evaluate_saved_model(export_path: str | os.PathLike[str], dataset_uri: str,
                         config: TrainingConfig | Mapping[str, Any] | None = None,
                         batch_size: int = EVAL_BATCH_SIZE) -> dict[str, Any]:
    """Metrics of an exported SavedModel on the dataset's eval split, through its
    ``serving_default`` signature (what TF Serving would answer). The loss is the one the
    export was trained with (from its metadata), else ``config``'s, else the task's default."""
    import tensorflow as tf

    from airflow_tf.data import load_schema
    from airflow_tf.runtime import models

    from .versions import read_metadata

    path = local_path(export_path, "export_path")
    schema = load_schema(dataset_uri)
    try:
        signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    except (OSError, KeyError, ValueError) as exc:
        raise EvaluationError(f"{path}: cannot load a SavedModel with a serving_default signature ({exc})") from exc
    inputs = {spec.name: spec for spec in signature.structured_input_signature[1].values()}
    missing = sorted(set(inputs) - set(schema.feature_names))
    if missing:
        raise EvaluationError(
            f"{path}: the exported model takes input(s) {', '.join(missing)} that dataset {dataset_uri} does not "
            f"have (it has {', '.join(schema.feature_names)}); the schema changed, so the served model cannot "
            "be evaluated on this data: export without comparing (compare_to_served=False)"
        )
    metadata = read_metadata(path)
    if metadata.get("training_config"):
        config = metadata["training_config"]
    loss = models.resolve_loss(training_config(config), schema) if config is not None else None

    def predict(features: Mapping[str, Any]) -> Any:
        return signature(**{name: features[name] for name in inputs})["predictions"]

    task, metrics, examples = _evaluate(predict, dataset_uri, schema, loss, batch_size, what=f"SavedModel {path}")
    return {"path": str(path), "dataset": str(dataset_uri), "split": EVAL_SPLIT, "examples": examples,
            "task": task, "metrics": metrics}


def served_baseline(serving_base: str | os.PathLike[str], model_name: str, dataset_uri: str,
                    config: TrainingConfig | Mapping[str, Any] | None = None,
                    metric: str | None = None) -> dict[str, Any] | None:
    """The currently served (latest exported) version's metrics on this dataset's eval split,
    as a ``baseline`` for :func:`evaluate_checkpoint`; None when nothing is exported yet."""
    served = latest_export(serving_base, model_name)
    if served is None:
        return None
    result = evaluate_saved_model(served["path"], dataset_uri, config)
    name, direction = baseline_metric_for(result["task"], metric)
    return {**result, "model_name": model_name, "version": served["version"], "metric": name, "direction": direction}


def checkpoint_step(checkpoint: str) -> int | None:
    """The global step a checkpoint was saved at (its ``global_step`` variable, else its name)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(checkpoint)
    for name in ("global_step", "step"):
        if reader.has_tensor(name):
            return int(reader.get_tensor(name))
    match = re.search(r"-(\d+)$", checkpoint)
    return int(match.group(1)) if match else None


def task_of(schema: Any, predictions: Any, loss: Any = None) -> str:
    """``classification`` when an integer label meets a prediction per class;
    ``binary_classification`` when an integer (0/1) label meets one probability or logit and
    the loss is a binary cross-entropy (click models); else ``regression``."""
    label = schema.label
    if label is None:
        raise EvaluationError("the dataset has no label column, so there is nothing to evaluate against; "
                              "prepare it with a label")
    width = predictions.shape[-1] if len(predictions.shape) > 1 else 1
    if label.dtype == "int64" and width > 1:
        return "classification"
    if label.dtype == "int64" and _is_binary_crossentropy(loss):
        return "binary_classification"
    return "regression"


def _is_binary_crossentropy(loss: Any) -> bool:
    name = getattr(loss, "name", None) or getattr(loss, "__name__", None) or (loss if isinstance(loss, str) else "")
    return "binary_crossentropy" in str(name).lower() or "binary_focal" in str(name).lower()


def _keras_predict(model: Any) -> Callable[[Mapping[str, Any]], Any]:
    import tensorflow as tf

    @tf.function(reduce_retracing=True)
    def predict(features: Mapping[str, Any]) -> Any:
        return model(features, training=False)

    return predict


def _evaluate(predict: Callable[[Mapping[str, Any]], Any], dataset_uri: str, schema: Any, loss: Any,
              batch_size: int, *, what: str) -> tuple[str, dict[str, float], int]:
    """Stream the eval split through ``predict``; the one place metrics are computed, for
    checkpoints and SavedModels alike. Returns (task, metrics, examples)."""
    import keras
    import tensorflow as tf

    from airflow_tf.data import make_dataset
    from airflow_tf.runtime import models

    dataset = make_dataset(dataset_uri, split=EVAL_SPLIT, batch_size=batch_size, shuffle=False, epochs=1)
    task = None
    mean_loss = keras.metrics.Mean()
    trackers: dict[str, Any] = {}
    examples = 0
    for features, batch_label in dataset:
        predictions = predict(features)
        if not tf.is_tensor(predictions):
            raise EvaluationError(f"{what}: the model returned {type(predictions).__name__}; "
                                  "evaluation expects one tensor of predictions")
        if task is None:
            task = task_of(schema, predictions, loss)
            loss = loss or keras.losses.get(DEFAULT_LOSS[task])
            trackers = _metric_trackers(task, from_logits(loss))
        label = batch_label
        if task != "classification":
            label = tf.reshape(tf.cast(label, predictions.dtype), tf.shape(predictions))
        batch = int(tf.shape(label)[0])
        mean_loss.update_state(models.compute_loss(loss, label, predictions), sample_weight=batch)
        for tracker in trackers.values():
            tracker.update_state(label, predictions)
        examples += batch
    if task is None:
        raise EvaluationError(f"{what}: the eval split of {dataset_uri} is empty; prepare the dataset with "
                              "an eval_fraction above 0")
    metrics = {"loss": float(mean_loss.result())}
    metrics.update({name: float(t.result()) for name, t in trackers.items()})
    return task, {name: metrics[name] for name in TASK_METRICS[task]}, examples


def from_logits(loss: Any) -> bool:
    """Whether a Keras loss expects logits (the model's outputs are not probabilities)."""
    get_config = getattr(loss, "get_config", None)
    return bool(get_config().get("from_logits", False)) if callable(get_config) else False


def _metric_trackers(task: str, logits: bool) -> dict[str, Any]:
    import keras

    if task == "classification":
        return {"accuracy": keras.metrics.SparseCategoricalAccuracy(),
                "cross_entropy": keras.metrics.SparseCategoricalCrossentropy(from_logits=logits)}
    if task == "binary_classification":
        return {"auc": keras.metrics.AUC(from_logits=logits),
                "accuracy": keras.metrics.BinaryAccuracy(threshold=0.0 if logits else 0.5),
                "cross_entropy": keras.metrics.BinaryCrossentropy(from_logits=logits)}
    return {"mse": keras.metrics.MeanSquaredError(), "mae": keras.metrics.MeanAbsoluteError()}


def _baseline_summary(baseline: Mapping[str, Any] | None, task: str, metric: str | None) -> dict[str, Any] | None:
    if baseline is None:
        return None
    name, direction = baseline_metric_for(task, metric)
    values = baseline.get("metrics", baseline)
    summary = {"metric": name, "direction": direction,
               "metrics": {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}}
    for key in ("model_name", "version", "path"):
        if key in baseline:
            summary[key] = baseline[key]
    return summary


def read_metrics(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's ``metrics.json`` (written by :func:`evaluate_checkpoint`), or None."""
    path = local_path(run_dir, "run_dir") / METRICS_FILE
    return read_json(path) if path.is_file() else None
