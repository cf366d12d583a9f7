"""EvaluateModelOperator and ExportSavedModelOperator: thin adapters over ``airflow_tf.serving``
(imported inside ``execute``: importing these operators imports no TensorFlow)."""

from __future__ import annotations

import json
from typing import Any
from collections.abc import Sequence

from airflow.sdk import BaseOperator
from airflow.providers.common.compat.sdk import AirflowFailException, AirflowSkipException

from airflow_tf.backends.base import ComponentRefusedError
from airflow_tf.cluster.results import EvaluationResult, ExportResult, LaunchResult
from airflow_tf.cluster.training import parse_bool
from airflow_tf.metrics import send_evaluation, send_export_version, task_tags
from airflow_tf.storage import models_dir

from .common import check_name, is_template, model_asset, no_retry_for
from .lineage import LineageMethods, evaluation_lineage, export_lineage


def _launch_result(value: Any) -> LaunchResult:
    """The launch task's XCom (``launch.output``) as a LaunchResult; a wrong value fails at once."""
    with no_retry_for(ValueError, what="launch"):
        return LaunchResult.from_dict(value)


def _serving_base(value: str | None) -> str:
    return value or models_dir()


def _run_component(launch: LaunchResult, component: str, options: dict[str, Any]) -> dict[str, Any]:
    """Runs ``component`` (evaluate or export) of the launch's group through its backend and
    returns its result: a local group's here, a Kubernetes group's as a Job on the group's
    training image and volumes (so this Airflow needs no TensorFlow)."""
    from airflow_tf.backends import GroupRef, backend_for

    ref = GroupRef.coerce(launch.group)
    request = {"run_dir": launch.run_dir, "dataset": launch.dataset, "training": launch.training, **options}
    return backend_for(ref).run_component(ref, component, request)


class EvaluateModelOperator(LineageMethods, BaseOperator):
    """Evaluates the final checkpoint on the eval split; writes ``metrics.json`` and a
    training-curve PNG in the run directory; returns (XCom) an
    :class:`~airflow_tf.cluster.results.EvaluationResult` as a dict: the metrics and ``blessed``.

    Options that cannot work (bad thresholds, a model that cannot be rebuilt) fail the task
    without retries.

    :param launch: the launch task's XCom (``launch.output``).
    :param thresholds: e.g. ``{"accuracy": {"min": 0.9}}`` or ``{"mse": {"max": 1.0}}``.
    :param compare_to_served: also require the new model to be at least as good as the latest
        version exported under ``serving_base/model_name`` (continuous retraining).
    :param serving_base: where exported models live; default ``<storage>/models``.
    :param model_name: the served model to compare with (``compare_to_served``).
    :param comparison_metric: the metric compared with the served model; default ``mse`` for
        regression, ``accuracy`` for classification.
    """

    template_fields: Sequence[str] = ("launch", "thresholds", "serving_base", "model_name")
    ui_color = "#a5d6a7"
    _lineage = evaluation_lineage

    def __init__(self, *, launch: Any, thresholds: dict[str, Any] | None = None, compare_to_served: bool = False,
                 serving_base: str | None = None, model_name: str | None = None,
                 comparison_metric: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.launch = launch
        self.thresholds = thresholds
        self.compare_to_served = parse_bool(compare_to_served, "compare_to_served")
        self.serving_base = serving_base
        self.model_name = model_name if model_name is None else check_name(model_name, "model_name")
        self.comparison_metric = comparison_metric

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_tf import serving

        launch = _launch_result(self.launch)
        options = {
            "thresholds": self.thresholds, "compare_to_served": self.compare_to_served,
            "serving_base": _serving_base(self.serving_base) if self.compare_to_served else None,
            "model_name": self.model_name, "comparison_metric": self.comparison_metric}
        with no_retry_for(ValueError, ComponentRefusedError, serving.EvaluationError, serving.BlessingConfigError,
                          what="evaluation refused"):
            if self.compare_to_served and not self.model_name:
                raise ValueError("compare_to_served=True needs model_name= (the served model to compare with)")
            result = EvaluationResult.from_dict(_run_component(launch, "evaluate", options))
        if self.compare_to_served:
            self.log.info("served model: %s", result.baseline or
                          "none yet (the first export is compared with thresholds only)")
        self.log.info("evaluation of %s: %s", launch.run_dir, result.metrics)
        self.log.info("model %s", "BLESSED" if result.blessed else f"NOT blessed: {result.reasons}")
        send_evaluation(result.metrics, task_tags(context, model=self.model_name), blessed=result.blessed)
        self._lineage_result = result.to_dict()
        return self._lineage_result


class ExportSavedModelOperator(LineageMethods, BaseOperator):
    """Exports the evaluated checkpoint as ``<serving_base>/<model_name>/<version>/`` (a
    SavedModel with a ``serving_default`` signature on the raw features), atomically, after
    loading it back and checking its predictions. Only a blessed model is exported: an
    unblessed one skips this task (``on_unblessed="skip"``) or fails it without retries
    (``"fail"``), unless ``force=True``. Returns (XCom) an
    :class:`~airflow_tf.cluster.results.ExportResult` as a dict.

    Each published version updates the asset ``airflow_tf.model.<model_name>`` (extra:
    ``version``, ``path``, ``metrics``), so a deployment DAG can be scheduled on new models
    (``schedule=[model_asset("...")]``, from ``airflow_tf.operators``).

    :param launch: the launch task's XCom (``launch.output``).
    :param model_name: the served model's name, the directory under ``serving_base``.
    :param metrics: the evaluate task's XCom (``evaluate.output``); default the run's
        ``metrics.json``.
    :param serving_base: TensorFlow Serving's model base path; default ``<storage>/models``.
    :param force: export even an unblessed model.
    :param on_unblessed: ``skip`` (default) or ``fail``.
    :param warmup_requests: write ``assets.extra/tf_serving_warmup_requests`` (eval rows that
        TensorFlow Serving replays before it serves the version, so its first requests are not slow).
    """

    template_fields: Sequence[str] = ("launch", "metrics", "serving_base", "model_name")
    ui_color = "#90caf9"
    _lineage = export_lineage

    def __init__(self, *, launch: Any, model_name: str, metrics: Any = None, serving_base: str | None = None,
                 force: bool = False, on_unblessed: str = "skip", warmup_requests: bool = True,
                 **kwargs: Any) -> None:
        if not is_template(check_name(model_name, "model_name")) and "outlets" not in kwargs:
            kwargs["outlets"] = [model_asset(model_name)]
        super().__init__(**kwargs)
        if on_unblessed not in ("skip", "fail"):
            raise ValueError(f"on_unblessed: {on_unblessed!r} is not 'skip' or 'fail'")
        self.launch = launch
        self.model_name = model_name
        self.metrics = metrics
        self.serving_base = serving_base
        self.force = parse_bool(force, "force")
        self.on_unblessed = on_unblessed
        self.warmup_requests = parse_bool(warmup_requests, "warmup_requests")

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_tf import serving

        launch = _launch_result(self.launch)
        with no_retry_for(ValueError, what="metrics"):
            given = json.loads(self.metrics) if isinstance(self.metrics, str) else self.metrics  # rendered as text
            metrics = None if given is None else EvaluationResult.from_dict(given)
        if metrics is not None and not metrics.blessed and not self.force:
            message = (f"model not blessed ({metrics.reasons}); not exported. "
                       "Pass force=True to export it anyway.")
            if self.on_unblessed == "skip":
                raise AirflowSkipException(message)
            raise AirflowFailException(message)
        options = {"serving_base": _serving_base(self.serving_base), "model_name": self.model_name,
                   "metrics": None if metrics is None else metrics.to_dict(), "force": self.force,
                   "warmup_requests": self.warmup_requests}
        with no_retry_for(ValueError, ComponentRefusedError, serving.NotBlessedError, what="export refused"):
            result = ExportResult.from_dict(_run_component(launch, "export", options))
        self.log.info("exported %s version %s to %s", self.model_name, result.version, result.path)
        send_export_version(result.version, task_tags(context, model=self.model_name))
        asset = model_asset(self.model_name)
        if any(getattr(outlet, "name", None) == asset.name for outlet in self.outlets):
            context["outlet_events"][asset].extra = {
                "version": result.version, "path": result.path, "metrics": result.metrics,
            }
        self._lineage_result = result.to_dict()
        return self._lineage_result
