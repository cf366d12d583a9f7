"""What the operators share: the assets they emit, the backend settings they resolve when a
task runs, and which errors are worth a retry."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any
from collections.abc import Iterator

from airflow.sdk import Asset
from airflow.providers.common.compat.sdk import AirflowFailException

from airflow_tf.cluster.names import is_name
from airflow_tf.cluster.training import parse_bool
# The warning's documented home is here (CHANGELOG.md); it lives in a leaf every room may import.
from airflow_tf.deprecation import AirflowTFDeprecationWarning, deprecated  # noqa: F401
from airflow_tf.storage import configured_backend, configured_backend_options, state_dir


def dataset_asset(name: str) -> Asset:
    """The asset a prepare task updates with each dataset version it commits (extra: version,
    path, rows, counts). Schedule a DAG on it to train whenever new data is prepared."""
    return Asset(name=f"airflow_tf.dataset.{name}", group="tensorflow")


def model_asset(model_name: str) -> Asset:
    """The asset an export task updates with each model version it publishes (extra: version,
    path, metrics). Schedule a deployment DAG on it."""
    return Asset(name=f"airflow_tf.model.{model_name}", group="tensorflow")


def launch_labels(dag_id: str, task_id: str, run_id: str, map_index: int) -> dict[str, str]:
    """The labels a launch stamps on its group, naming the task instance that launched it."""
    from airflow_tf.cluster import label_value

    return {"airflow.dag_id": label_value(dag_id), "airflow.task_id": label_value(task_id),
            "airflow.run_id": label_value(run_id), "airflow.map_index": str(map_index)}


def check_name(value: Any, argument: str) -> Any:
    """``value`` when it is a name (a non-empty string) or known only when the task runs
    (:func:`is_template`); else a ValueError naming ``argument``. A dataset's or model's name
    becomes an asset and a directory: None would make both quietly wrong."""
    if is_template(value) or is_name(value):
        return value
    raise ValueError(f"{argument}: expected a name (a non-empty string or a template), got {value!r}")


def is_template(value: Any) -> bool:
    """A value only known when the task runs: Jinja text, or anything Airflow resolves then (an
    XComArg, a mapped argument)."""
    return hasattr(value, "resolve") or (isinstance(value, str) and ("{{" in value or "{%" in value))


def flag(value: Any, name: str) -> Any:
    """A true/false argument of an operator, through the one strict parser (``parse_bool``):
    parsed now when it is plain, so ``overwrite="ture"`` fails the DAG's import naming it; a
    template or XComArg is kept as given and parsed when the task runs, and None too (prepare's
    options take it for their default)."""
    return value if value is None or is_template(value) else parse_bool(value, name)


def resolved_backend(backend: str | None, options: dict[str, Any] | None,
                     team: str | None = None) -> tuple[str, dict[str, Any]]:
    """The backend a task uses and its options, read when the task runs.

    ``backend=None`` means the deployment's: ``[airflow_tf] backend`` (``$AIRFLOW_TF_BACKEND``),
    else ``local``; options not given (None) for the deployment's backend are
    ``[airflow_tf] backend_options`` (``$AIRFLOW_TF_BACKEND_OPTIONS``, a JSON object). The local
    backend's state directory defaults to ``[airflow_tf] state_dir`` / ``$AIRFLOW_TF_STATE_DIR``.
    Every option is checked (key, type, range) before any backend is made: a wrong one raises a
    ValueError naming the setting or the argument, the key and what it expects. A Kubernetes
    ``namespace`` holding ``{team}`` gets ``team`` (:func:`airflow_tf.storage.team_of`) there: a namespace per team."""
    from airflow_tf.backends import BACKENDS, check_backend_options

    configured = configured_backend()
    if configured not in BACKENDS:
        raise ValueError(f"[airflow_tf] backend / $AIRFLOW_TF_BACKEND: {configured!r} is not one of "
                         f"{', '.join(BACKENDS)}")
    name = backend or configured
    if options is None and name == configured:
        where = "[airflow_tf] backend_options / $AIRFLOW_TF_BACKEND_OPTIONS"
        resolved = check_backend_options(configured, configured_backend_options(), where)
    else:
        where = "backend_options (the task's argument)"
        resolved = check_backend_options(name, dict(options or {}), where)
    if name == "kubernetes" and "{team}" in (resolved.get("namespace") or ""):
        resolved["namespace"] = _team_namespace(resolved["namespace"], team, where)
    if name == "local" and not resolved.get("state_dir"):
        directory = state_dir()
        if directory:
            resolved["state_dir"] = directory
    return name, resolved


def _team_namespace(namespace: str, team: str | None, where: str) -> str:
    from airflow_tf.backends.kubernetes.pod_options import check_namespace
    from airflow_tf.cluster import SpecError

    if not team:
        raise ValueError(f"{where}: namespace: {namespace!r} holds {{team}}, but this task's DAG belongs to no team "
                         "(Airflow's multi-team mode); give a namespace without {team} to DAGs of no team")
    filled = namespace.replace("{team}", team)
    try:
        return check_namespace(filled)
    except SpecError:
        raise ValueError(f"{where}: namespace: {namespace!r} with the task's team {team!r} is {filled!r}, not a "
                         "Kubernetes namespace name (a DNS-1123 label); map this team's namespace another way, e.g. "
                         "its workers' own [airflow_tf] backend_options") from None


@contextmanager
def no_retry_for(*errors: type[BaseException], what: str) -> Iterator[None]:
    """Errors a retry cannot fix (a bad option, a refused model) fail the task at once,
    whatever its ``retries``: :class:`AirflowFailException`, with the original message."""
    try:
        yield
    except errors as exc:
        raise AirflowFailException(f"{what}: {exc}") from exc
