"""Evaluation of a checkpoint, blessing, and SavedModel export in the TF Serving layout.

Plain functions behind EvaluateModelOperator and ExportSavedModelOperator; no Airflow here,
and TensorFlow is imported only when a function needs it."""

from .blessing import BlessingConfigError, decide, validate_thresholds
from .evaluate import (
    EvaluationError,
    evaluate_checkpoint,
    evaluate_saved_model,
    read_metrics,
    served_baseline,
)
from .export import ExportError, NotBlessedError, export_saved_model
from .versions import latest_export, list_versions, model_dir

__all__ = [
    "BlessingConfigError", "EvaluationError", "ExportError", "NotBlessedError", "decide", "evaluate_checkpoint",
    "evaluate_saved_model", "export_saved_model", "latest_export", "list_versions", "model_dir", "read_metrics",
    "served_baseline", "validate_thresholds",
]
