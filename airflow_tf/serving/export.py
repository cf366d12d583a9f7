"""SavedModel export in the TensorFlow Serving layout, only for a blessed model, atomically.

The export is built in a hidden staging directory beside the versions, verified (loaded in a
fresh process as TensorFlow Serving loads it and through ``tf.saved_model.load``, its
``serving_default`` signature run on eval examples and compared with the checkpoint's model),
and only then renamed to the next integer version."""

from __future__ import annotations

import json
import keyword
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from airflow_tf.cluster import TrainingConfig
from airflow_tf.cluster.model_code import model_code_record
from airflow_tf.files import local_path, write_json

from .evaluate import (EvaluationError, checkpoint_step, from_logits, read_metrics, refuse_non_finite, task_of,
                       training_config)
from .versions import METADATA_FILE, WARM_START_DIR, model_dir, publish, staging_dir
from .warmup import WARMUP_FILE, predict_requests, write_requests

SIGNATURE = "serving_default"
VERIFY_EXAMPLES = 64
VERIFY_TIMEOUT = 600
"""Seconds the fresh process that loads the staged export both ways may take."""
METADATA_FORMAT = 1
_INPUT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


class NotBlessedError(RuntimeError):
    """The model was not blessed (or not evaluated); nothing was exported."""


class ExportError(RuntimeError):
    """The export could not be written or did not verify; no version was published."""


def export_saved_model(  # noqa: PLR0917  public signature: callers pass these positionally
        run_dir: str | os.PathLike[str], dataset_uri: str, config: TrainingConfig | Mapping[str, Any],
        serving_base: str | os.PathLike[str], model_name: str,
        metrics: Mapping[str, Any] | str | None = None, force: bool = False,
        checkpoint: str | None = None, *, verify_examples: int = VERIFY_EXAMPLES,
        warmup_requests: bool = True) -> dict[str, Any]:
    """Export the evaluated checkpoint to ``<serving_base>/<model_name>/<version>/``.

    ``metrics``: the evaluation result (default: the run's ``metrics.json``). An unblessed or
    unevaluated model raises :class:`NotBlessedError` before anything is written, unless
    ``force``. A model with a non-finite metric, weight or prediction raises :class:`ExportError`,
    ``force`` or not. The version is 1 + the highest existing one; an existing version is never
    replaced. Before the version is published, a fresh process loads it as TensorFlow Serving
    does and through ``tf.saved_model.load``, and both must answer as the checkpoint's model.
    ``warmup_requests``: write ``assets.extra/tf_serving_warmup_requests`` (eval rows the model
    server replays before serving). Returns ``{"path", "version", "model_name", ...}``."""
    run_path = local_path(run_dir, "run_dir")
    config = training_config(config)
    given: Mapping[str, Any] | None
    if isinstance(metrics, str):  # a templated operator argument arrives as text
        try:
            given = json.loads(metrics)
        except json.JSONDecodeError as exc:
            raise ValueError(f"metrics: not valid JSON ({exc}); pass the evaluation result (a dict)") from exc
    else:
        given = metrics
    if given is None:
        given = read_metrics(run_path)
    _check_blessed(given, run_path, checkpoint, force)
    evaluation = dict(given or {})
    try:
        refuse_non_finite(evaluation.get("metrics") or {}, f"run {run_path}")
    except EvaluationError as exc:
        raise ExportError(f"{exc}; nothing was exported (force does not override this)") from None

    # TensorFlow loads (lean) only now: a refusal above takes a fraction of a second, not seconds.
    from airflow_tf.runtime.startup import import_tensorflow

    import_tensorflow()
    from airflow_tf.data import load_schema
    from airflow_tf.runtime import models

    checkpoint = models.resolve_checkpoint(checkpoint or evaluation.get("checkpoint") or run_path)
    schema = load_schema(dataset_uri)
    _check_input_names(schema)
    model = models.restore_model(checkpoint, config, schema)
    logits = from_logits(models.resolve_loss(config, schema))
    features = _eval_batch(dataset_uri, verify_examples)
    expected = model(features, training=False)
    _check_finite(model, checkpoint, expected)
    task = task_of(schema, expected, models.resolve_loss(config, schema))

    directory = model_dir(serving_base, model_name)
    metadata = {
        "format_version": METADATA_FORMAT,
        "model_name": model_name,
        "run_dir": str(run_path),
        "checkpoint": checkpoint,
        "global_step": checkpoint_step(checkpoint),
        "dataset": str(dataset_uri),
        "schema": schema.to_dict(),
        "task": task,
        "signature": {"name": SIGNATURE, "inputs": schema.feature_names, "outputs": _output_names(task)},
        "metrics": evaluation,  # metric values, blessed and why
        "blessed": bool(evaluation.get("blessed", False)),
        "forced": bool(force and not evaluation.get("blessed", False)),
        "training_config": config.to_dict(),
        "model_code": model_code_record(config.code_dir),
        "warm_start_checkpoint": str(WARM_START_DIR),
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with staging_dir(directory) as staged:
        _write_saved_model(staged, model, schema, task, logits)
        _copy_checkpoint(checkpoint, staged / WARM_START_DIR)
        _write_metadata(staged, metadata)
        with tempfile.TemporaryDirectory(prefix="airflow-tf-requests-") as scratch:
            # The verification's requests are the warm-up records; kept out of the export when turned off.
            requests_file = staged / WARMUP_FILE if warmup_requests else Path(scratch) / "requests"
            write_requests(requests_file, predict_requests(features, model_name, SIGNATURE))
            _verify(staged, requests_file, expected)
        version, path = publish(staged, directory)
    return {
        "path": str(path),
        "version": version,
        "model_name": model_name,
        "model_dir": str(directory),
        "serving_base": str(local_path(serving_base, "serving_base")),
        "checkpoint": checkpoint,
        "global_step": metadata["global_step"],
        "task": task,
        "signature": metadata["signature"],
        "metrics": metadata["metrics"],
        "blessed": metadata["blessed"],
        "forced": metadata["forced"],
        "warm_start_from": str(path / WARM_START_DIR),
    }


def _check_blessed(metrics: Mapping[str, Any] | None, run_dir: Path, checkpoint: str | None, force: bool) -> None:
    if force:
        return
    how = "pass force=True (ExportSavedModelOperator(force=True)) to export it anyway"
    if not metrics:
        raise NotBlessedError(
            f"run {run_dir} was not evaluated (no metrics given and no {run_dir}/metrics.json): evaluate it "
            f"first (evaluate_checkpoint / EvaluateModelOperator), or {how}; nothing was exported"
        )
    if not metrics.get("blessed"):
        failed = [c["reason"] for c in metrics.get("checks", []) if not c.get("passed")]
        reasons = "; ".join(failed or metrics.get("reasons") or ["no reason recorded"])
        raise NotBlessedError(
            f"the model of run {run_dir} (checkpoint {metrics.get('checkpoint')}) is not blessed: {reasons}. "
            f"Nothing was exported; {how}"
        )
    evaluated = metrics.get("checkpoint")
    if checkpoint and evaluated and checkpoint != evaluated:
        raise NotBlessedError(
            f"checkpoint {checkpoint} is not the one that was evaluated and blessed ({evaluated}); evaluate it "
            f"first, export the blessed one (checkpoint=None), or {how}"
        )


def _check_finite(model: Any, checkpoint: str, predictions: Any) -> None:
    """Never export NaN/inf weights or a model that predicts NaN/inf, whatever the metrics said."""
    import numpy as np

    from airflow_tf.runtime import models

    for index, weight in enumerate(model.weights):
        if not np.isfinite(np.asarray(weight.numpy())).all():
            raise ExportError(f"weight {models.weight_key(index, weight)!r} of checkpoint {checkpoint} holds NaN/inf: "
                              "the model diverged; nothing was exported (force does not override this)")
    if not np.isfinite(np.asarray(predictions)).all():
        raise ExportError(f"the model of checkpoint {checkpoint} predicts NaN/inf on eval examples; nothing was "
                          "exported (force does not override this)")


def _check_input_names(schema: Any) -> None:
    """Every feature must be usable as a signature input name (and stay distinct)."""
    seen: dict[str, str] = {}
    for name in schema.feature_names:
        if not _INPUT_NAME.match(name) or keyword.iskeyword(name):
            raise ExportError(
                f"feature {name!r} cannot be a serving signature input: names must start with a letter or '_' "
                "and hold only letters, digits, '_', '.', '-', and not be a Python keyword; rename the column "
                "(or declare a schema) in the prepare step"
            )
        key = re.sub(r"[^A-Za-z0-9_]", "_", name)
        if key in seen:
            raise ExportError(f"features {seen[key]!r} and {name!r} collide as signature inputs; rename one")
        seen[key] = name


def _output_names(task: str) -> list[str]:
    return ["predictions", "classes", "probabilities"] if task == "classification" else ["predictions"]


def _eval_batch(dataset_uri: str, size: int) -> dict[str, Any]:
    from airflow_tf.data import make_dataset

    dataset = make_dataset(dataset_uri, split="eval", batch_size=size, shuffle=False, epochs=1)
    for features, _ in dataset.take(1):
        return features
    raise ExportError(f"the eval split of {dataset_uri} is empty: there is nothing to verify the export with")


def _write_saved_model(path: Path, model: Any, schema: Any, task: str, logits: bool) -> None:
    """A SavedModel with a ``serving_default`` signature on the raw features.

    Its root holds the TensorFlow variables the signature reads and the lookup tables of the
    model's layers, each once, so the MetaGraph's restore op restores every variable and its
    init op fills every table: what TensorFlow Serving runs. (With the Keras model itself as the
    root's attribute, its variables load through ``tf.saved_model.load`` only.)"""
    import tensorflow as tf
    from tensorflow.saved_model.experimental import TrackableResource

    specs = {
        name: tf.TensorSpec([None, *schema[name].shape], tf.as_dtype(schema[name].dtype), name=name)
        for name in schema.feature_names
    }

    @tf.function(input_signature=[specs], autograph=False)
    def serve(features: Mapping[str, Any]) -> dict[str, Any]:
        predictions = model(features, training=False)
        outputs = {"predictions": predictions}
        if task == "classification":
            outputs["probabilities"] = tf.nn.softmax(predictions) if logits else predictions
            outputs["classes"] = tf.argmax(predictions, axis=-1, output_type=tf.int64)
        return outputs

    try:
        signature = serve.get_concrete_function()
        root = tf.Module()
        root.served_variables = list(signature.variables)
        root.lookup_tables = [trackable for trackable in tf.train.TrackableView(model).descendants()
                              if isinstance(trackable, TrackableResource)]
        tf.saved_model.save(root, str(path), signatures={SIGNATURE: signature})
    except (ValueError, TypeError) as exc:
        raise ExportError(f"cannot write the SavedModel for inputs {', '.join(specs)}: {exc}") from exc


def _copy_checkpoint(checkpoint: str, target: Path) -> None:
    """The checkpoint's variables, with a ``checkpoint`` state file, so the export alone is
    enough to warm-start a new run (the original run directory may be gone by then)."""
    target.mkdir(parents=True)
    prefix = Path(checkpoint)
    files = [prefix.with_name(prefix.name + ".index"), *prefix.parent.glob(prefix.name + ".data-*")]
    for file in files:
        shutil.copy2(file, target / file.name)
    (target / "checkpoint").write_text(
        f'model_checkpoint_path: "{prefix.name}"\nall_model_checkpoint_paths: "{prefix.name}"\n', encoding="utf-8"
    )


def _write_metadata(path: Path, metadata: Mapping[str, Any]) -> None:
    write_json(path / METADATA_FILE, metadata)


def _verify(path: Path, requests_file: Path, expected: Any) -> None:
    """Answer the requests through the staged export, in a fresh process, both as TensorFlow
    Serving loads it and through ``tf.saved_model.load``; the answers must agree with each
    other and with the checkpoint's model (``expected``, the same rows)."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="airflow-tf-verify-") as scratch:
        outputs = Path(scratch) / "predictions.npy"
        command = [sys.executable, "-m", "airflow_tf.serving.loading", str(path), str(requests_file), str(outputs)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=VERIFY_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise ExportError(f"verification failed: loading the export took over {VERIFY_TIMEOUT} s; "
                              "nothing was published") from None
        if done.returncode != 0:
            reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
            raise ExportError(f"verification failed: the export does not serve: {reason}; nothing was published")
        predictions = np.load(outputs, allow_pickle=False)
    verify_outputs({"predictions": predictions}, expected)


def verify_outputs(outputs: Mapping[str, Any], expected: Any, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Raise :class:`ExportError` unless ``outputs["predictions"]`` matches ``expected``."""
    import numpy as np

    if "predictions" not in outputs:
        raise ExportError(f"verification failed: the {SIGNATURE} signature has no 'predictions' output "
                          f"(it has {', '.join(outputs)}); nothing was published")
    got, want = np.asarray(outputs["predictions"]), np.asarray(expected)
    if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
        worst = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("nan")
        raise ExportError(
            f"verification failed: the exported model's predictions differ from the checkpoint's model on "
            f"{want.shape[0]} eval examples (shapes {got.shape} vs {want.shape}, largest difference {worst:.3g}); "
            "nothing was published"
        )
