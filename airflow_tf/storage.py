"""The shared-storage layout every task agrees on (datasets, runs, exported models).

``$AIRFLOW_TF_STORAGE`` is the root; it must be the same path on every Airflow worker and
training task (a shared volume or PVC). Without it, ``~/airflow-tf`` serves one machine."""

from __future__ import annotations

import os


def storage_root() -> str:
    return os.environ.get("AIRFLOW_TF_STORAGE") or os.path.join(os.path.expanduser("~"), "airflow-tf")


def datasets_dir() -> str:
    return os.path.join(storage_root(), "datasets")


def runs_dir() -> str:
    return os.path.join(storage_root(), "runs")


def models_dir() -> str:
    """``serving_base``: TensorFlow Serving's model base path, ``<models>/<name>/<version>/``."""
    return os.path.join(storage_root(), "models")


def incoming_dir() -> str:
    """Where new raw data lands for the continuous-retraining example."""
    return os.path.join(storage_root(), "incoming")
