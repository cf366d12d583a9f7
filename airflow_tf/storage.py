"""The shared-storage layout every task agrees on (datasets, runs, exported models).

The root comes from the provider's configuration, read when a task runs (never when a DAG
file is parsed): ``[airflow_tf] storage`` (``AIRFLOW__AIRFLOW_TF__STORAGE``), else
``$AIRFLOW_TF_STORAGE``, else ``~/airflow-tf`` (one machine). It must be the same path on
every Airflow worker and training task (a shared volume or PVC). The local backend's state
directory comes from ``[airflow_tf] state_dir``, else ``$AIRFLOW_TF_STATE_DIR``."""

from __future__ import annotations

import json
import os

SECTION = "airflow_tf"


def _setting(option: str, env: str) -> str | None:
    """``[airflow_tf] <option>`` when Airflow is installed and it is set, else ``$<env>``."""
    try:
        from airflow.configuration import conf
    except ImportError:  # outside Airflow (the airflow-tf CLI in a training image)
        value = None
    else:
        value = conf.get(SECTION, option, fallback=None)
    return value or os.environ.get(env) or None


def storage_root() -> str:
    return _setting("storage", "AIRFLOW_TF_STORAGE") or os.path.join(os.path.expanduser("~"), "airflow-tf")


def state_dir() -> str | None:
    """Where the local backend keeps its groups' state; None: the backend's own default."""
    return _setting("state_dir", "AIRFLOW_TF_STATE_DIR")


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


def configured_backend() -> str:
    """The deployment's backend for tasks that name none: ``[airflow_tf] backend``
    (``$AIRFLOW_TF_BACKEND``), else ``local``."""
    return _setting("backend", "AIRFLOW_TF_BACKEND") or "local"


def configured_backend_options() -> dict:
    """The deployment backend's options: ``[airflow_tf] backend_options``
    (``$AIRFLOW_TF_BACKEND_OPTIONS``), a JSON object such as ``{"namespace": "ml"}``."""
    text = _setting("backend_options", "AIRFLOW_TF_BACKEND_OPTIONS")
    if not text:
        return {}
    try:
        options = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"[airflow_tf] backend_options / $AIRFLOW_TF_BACKEND_OPTIONS is not JSON ({exc}): "
                         f"give a JSON object, e.g. '{{\"namespace\": \"ml\"}}'") from None
    if not isinstance(options, dict):
        raise ValueError(f"[airflow_tf] backend_options / $AIRFLOW_TF_BACKEND_OPTIONS: expected a JSON object, "
                         f"got {type(options).__name__} {text!r}")
    return options
