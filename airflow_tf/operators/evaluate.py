"""EvaluateModelOperator and ExportSavedModelOperator: thin adapters over ``airflow_tf.serving``."""

from __future__ import annotations

from typing import Any, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException

from airflow_tf.cluster import TrainingConfig
from airflow_tf.storage import models_dir


def _launch_result(value: Any) -> tuple[str, str, TrainingConfig]:
    """(run_dir, dataset, training config) from the launch task's XCom."""
    if not isinstance(value, dict) or not {"run_dir", "dataset", "training"} <= set(value):
        raise ValueError(f"launch: expected the launch task's XCom (launch.output), got {value!r}")
    return value["run_dir"], value["dataset"], TrainingConfig.from_dict(value["training"])


def _serving_base(value: str | None) -> str:
    return value or models_dir()


class EvaluateModelOperator(BaseOperator):
    """Evaluates the final checkpoint on the eval split; writes ``metrics.json`` and a
    training-curve PNG in the run directory; returns the metrics with ``blessed``.

    :param launch: the launch task's XCom (``launch.output``).
    :param thresholds: e.g. ``{"accuracy": {"min": 0.9}}`` or ``{"mse": {"max": 1.0}}``.
    :param compare_to_served: also require the new model to be at least as good as the latest
        version exported under ``serving_base/model_name`` (continuous retraining).
    """

    template_fields: Sequence[str] = ("launch", "thresholds", "serving_base", "model_name")
    ui_color = "#a5d6a7"

    def __init__(self, *, launch: Any, thresholds: dict[str, Any] | None = None, compare_to_served: bool = False,
                 serving_base: str | None = None, model_name: str | None = None,
                 comparison_metric: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.launch = launch
        self.thresholds = thresholds
        self.compare_to_served = compare_to_served
        self.serving_base = serving_base
        self.model_name = model_name
        self.comparison_metric = comparison_metric

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_tf import serving

        run_dir, dataset, config = _launch_result(self.launch)
        baseline = None
        if self.compare_to_served:
            if not self.model_name:
                raise ValueError("compare_to_served=True needs model_name= (the served model to compare with)")
            baseline = serving.served_baseline(_serving_base(self.serving_base), self.model_name, dataset, config,
                                               metric=self.comparison_metric)
            self.log.info("served model: %s", baseline or "none yet (the first export is compared with thresholds only)")
        metrics = serving.evaluate_checkpoint(run_dir, dataset, config, thresholds=self.thresholds, baseline=baseline)
        self.log.info("evaluation of %s: %s", run_dir, metrics)
        self.log.info("model %s", "BLESSED" if metrics["blessed"] else f"NOT blessed: {metrics.get('reasons')}")
        return metrics


class ExportSavedModelOperator(BaseOperator):
    """Exports the evaluated checkpoint as ``<serving_base>/<model_name>/<version>/`` (a
    SavedModel with a ``serving_default`` signature on the raw features), atomically, after
    loading it back and checking its predictions. Only a blessed model is exported: an
    unblessed one skips this task (``on_unblessed="skip"``) or fails it (``"fail"``), unless
    ``force=True``.
    """

    template_fields: Sequence[str] = ("launch", "metrics", "serving_base", "model_name")
    ui_color = "#90caf9"

    def __init__(self, *, launch: Any, model_name: str, metrics: Any = None, serving_base: str | None = None,
                 force: bool = False, on_unblessed: str = "skip", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if on_unblessed not in ("skip", "fail"):
            raise ValueError(f"on_unblessed: {on_unblessed!r} is not 'skip' or 'fail'")
        self.launch = launch
        self.model_name = model_name
        self.metrics = metrics
        self.serving_base = serving_base
        self.force = force
        self.on_unblessed = on_unblessed

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_tf import serving

        run_dir, dataset, config = _launch_result(self.launch)
        if self.metrics is not None and not self.metrics.get("blessed") and not self.force:
            message = (f"model not blessed ({self.metrics.get('reasons')}); not exported. "
                       "Pass force=True to export it anyway.")
            if self.on_unblessed == "skip":
                raise AirflowSkipException(message)
        result = serving.export_saved_model(run_dir, dataset, config, _serving_base(self.serving_base),
                                            self.model_name, metrics=self.metrics, force=self.force)
        self.log.info("exported %s version %s to %s", self.model_name, result["version"], result["path"])
        return result
