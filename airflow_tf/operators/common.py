"""What the operators share: the assets they emit, the backend settings they resolve when a
task runs, and which errors are worth a retry."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from airflow.sdk import Asset
from airflow.providers.common.compat.sdk import AirflowFailException

from airflow_tf.storage import state_dir


def dataset_asset(name: str) -> Asset:
    """The asset a prepare task updates with each dataset version it commits (extra: version,
    path, rows, counts). Schedule a DAG on it to train whenever new data is prepared."""
    return Asset(name=f"airflow_tf.dataset.{name}", group="tensorflow")


def model_asset(model_name: str) -> Asset:
    """The asset an export task updates with each model version it publishes (extra: version,
    path, metrics). Schedule a deployment DAG on it."""
    return Asset(name=f"airflow_tf.model.{model_name}", group="tensorflow")


def is_template(value: Any) -> bool:
    """A value only known when the task runs (Jinja text, an XComArg, a mapped argument)."""
    return not isinstance(value, str) or "{{" in value or "{%" in value


def resolved_backend_options(backend: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """The backend's options with the provider's defaults, read when the task runs: the local
    backend's state directory from ``[airflow_tf] state_dir`` / ``$AIRFLOW_TF_STATE_DIR``."""
    resolved = dict(options or {})
    if backend == "local" and not resolved.get("state_dir"):
        configured = state_dir()
        if configured:
            resolved["state_dir"] = configured
    return resolved


@contextmanager
def no_retry_for(*errors: type[BaseException], what: str) -> Iterator[None]:
    """Errors a retry cannot fix (a bad option, a refused model) fail the task at once,
    whatever its ``retries``: :class:`AirflowFailException`, with the original message."""
    try:
        yield
    except errors as exc:
        raise AirflowFailException(f"{what}: {exc}") from exc
