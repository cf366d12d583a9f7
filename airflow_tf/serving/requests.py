"""Evaluate and export as requests (plain dicts): the one place that turns the operators' and
the command line's options into calls of :mod:`airflow_tf.serving`. The EvaluateModelOperator
and ExportSavedModelOperator (here or as a Job on the cluster, ``python -m airflow_tf.serving``)
and ``airflow-tf evaluate`` / ``export`` all come through here.

A request holds ``run_dir``, ``dataset`` and ``training`` (the TrainingConfig dict: what a
launch returns, or what ``airflow-tf run`` records in ``<run_dir>/launch.json``), and:

- evaluate: optionally ``thresholds``, ``compare_to_served`` with ``serving_base`` and
  ``model_name``, ``comparison_metric``;
- export: ``serving_base``, ``model_name``, optionally ``metrics`` (the evaluation result),
  ``force`` and ``warmup_requests`` (default true).
"""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

from airflow_tf.cluster.training import parse_bool

REQUIRED = ("run_dir", "dataset", "training")


def check_request(data: Any) -> dict[str, Any]:
    """The request as a dict; a missing field is a ValueError naming it."""
    missing = [key for key in REQUIRED if not isinstance(data, Mapping) or key not in data]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (a JSON object with run_dir, dataset, training)")
    return dict(data)


def _serving():
    """``airflow_tf.serving``, with TensorFlow loaded lean first (the start of an evaluation is
    often its process's first use of TensorFlow; an export loads it once it knows it exports)."""
    from airflow_tf import serving
    from airflow_tf.runtime.startup import import_tensorflow

    import_tensorflow()
    return serving


def evaluate(request: Mapping[str, Any]) -> dict[str, Any]:
    """Evaluates the run's final checkpoint (and the served model, with ``compare_to_served``);
    returns the EvaluationResult dict (its ``baseline`` says what the served model scored)."""
    request = check_request(request)
    serving = _serving()
    baseline = None
    if request.get("compare_to_served"):
        if not request.get("model_name") or not request.get("serving_base"):
            raise ValueError("compare_to_served needs model_name and serving_base (the served model to compare with)")
        baseline = serving.served_baseline(request["serving_base"], request["model_name"], request["dataset"],
                                           request["training"], metric=request.get("comparison_metric"))
    return serving.evaluate_checkpoint(request["run_dir"], request["dataset"], request["training"],
                                       thresholds=request.get("thresholds"), baseline=baseline)


def export(request: Mapping[str, Any]) -> dict[str, Any]:
    """Exports the run's checkpoint as the next version of ``model_name``; returns the
    ExportResult dict. An unblessed model (by ``metrics``) raises NotBlessedError unless ``force``."""
    from airflow_tf import serving  # which loads TensorFlow once the model is known to be exported

    request = check_request(request)
    if not request.get("model_name") or not request.get("serving_base"):
        raise ValueError("export needs model_name and serving_base")
    return serving.export_saved_model(request["run_dir"], request["dataset"], request["training"],
                                      request["serving_base"], request["model_name"],
                                      metrics=request.get("metrics"), force=bool(request.get("force")),
                                      warmup_requests=request.get("warmup_requests") is None
                                      or parse_bool(request["warmup_requests"], "warmup_requests"))



COMMANDS = {"evaluate": evaluate, "export": export}
