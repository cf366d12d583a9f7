"""Airflow operators: thin adapters over cluster/, backends/, data/ and serving/."""

from typing import Any

from .common import dataset_asset, model_asset
from .evaluate import EvaluateModelOperator, ExportSavedModelOperator
from .launch import LaunchTFClusterOperator
from .prepare import DatasetWindowOperator, PrepareTFRecordsOperator
from .teardown import TeardownTFClusterOperator

__all__ = [
    "ApproveExportOperator",
    "DatasetWindowOperator",
    "EvaluateModelOperator",
    "ExportSavedModelOperator",
    "LaunchTFClusterOperator",
    "PrepareTFRecordsOperator",
    "TeardownTFClusterOperator",
    "dataset_asset",
    "model_asset",
]


def __getattr__(name: str) -> Any:
    # Needs Airflow 3.1's human-in-the-loop operators: imported only when asked for, so that
    # the other operators work on any supported Airflow.
    if name == "ApproveExportOperator":
        from .approval import ApproveExportOperator

        return ApproveExportOperator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
