"""Airflow operators: thin adapters over cluster/, backends/, data/ and serving/."""

from .common import dataset_asset, model_asset
from .evaluate import EvaluateModelOperator, ExportSavedModelOperator
from .launch import LaunchTFClusterOperator
from .prepare import DatasetWindowOperator, PrepareTFRecordsOperator
from .teardown import TeardownTFClusterOperator

__all__ = [
    "DatasetWindowOperator",
    "EvaluateModelOperator",
    "ExportSavedModelOperator",
    "LaunchTFClusterOperator",
    "PrepareTFRecordsOperator",
    "TeardownTFClusterOperator",
    "dataset_asset",
    "model_asset",
]
