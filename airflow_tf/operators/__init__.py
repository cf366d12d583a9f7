"""Airflow operators: thin adapters over cluster/, backends/, data/ and serving/."""

from .evaluate import EvaluateModelOperator, ExportSavedModelOperator
from .launch import LaunchTFClusterOperator
from .teardown import TeardownTFClusterOperator

__all__ = [
    "EvaluateModelOperator",
    "ExportSavedModelOperator",
    "LaunchTFClusterOperator",
    "TeardownTFClusterOperator",
]
