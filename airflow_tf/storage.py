"""The shared-storage layout every task agrees on (datasets, runs, exported models).

The root comes from the provider's configuration, read when a task runs (never when a DAG
file is parsed): ``[airflow_tf] storage`` (``AIRFLOW__AIRFLOW_TF__STORAGE``), else
``$AIRFLOW_TF_STORAGE``, else ``~/airflow-tf`` (one machine). It must be the same path on
every Airflow worker and training task (a shared volume or PVC). The local backend's state
directory comes from ``[airflow_tf] state_dir``, else ``$AIRFLOW_TF_STATE_DIR``.

In Airflow's multi-team mode, ``[airflow_tf] teams`` (``$AIRFLOW_TF_TEAMS``) gives each team a
storage root of its own: a task of a DAG run of that team uses its team's root (and keeps its local
groups' state in ``<root>/groups``), and the views map a run to its team by the root it lives in.
The boundary holds where each team's tasks run as an OS user (or in pods) that can write only
its own root: docs/explanation/security.md."""

from __future__ import annotations

import json
import os
import re
from typing import Any

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


TEAMS_SETTING = "[airflow_tf] teams / $AIRFLOW_TF_TEAMS"
TEAM_NAME = re.compile(r"^[a-zA-Z0-9_-]{3,50}$")
"""Airflow's rule for a team's name."""
GROUPS = "groups"
"""A team root's directory of the local backend's group state."""


def teams() -> dict[str, str]:
    """Each team's storage root (absolute, normalised) from ``[airflow_tf] teams``, a JSON object
    such as ``{"team_a": {"storage": "/shared/team_a"}}``; empty when unset. Roots may not nest:
    a team whose root lies inside another's could reach that team's runs."""
    text = _setting("teams", "AIRFLOW_TF_TEAMS")
    if not text:
        return {}
    try:
        value: Any = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{TEAMS_SETTING} is not JSON ({exc}): give an object such as "
                         '\'{"team_a": {"storage": "/shared/team_a"}}\'') from None
    if not isinstance(value, dict):
        raise ValueError(f"{TEAMS_SETTING}: expected a JSON object of teams, got {type(value).__name__}")
    roots: dict[str, str] = {}
    for team, settings in value.items():
        where = f"{TEAMS_SETTING}: team {team!r}"
        if not TEAM_NAME.match(team):
            raise ValueError(f"{where}: not a team name (3 to 50 letters, digits, '_' or '-', as Airflow's teams)")
        if not isinstance(settings, dict) or set(settings) - {"storage"}:
            raise ValueError(f'{where}: expected {{"storage": "/absolute/root"}}, got {settings!r}')
        root = settings.get("storage")
        if not isinstance(root, str) or not os.path.isabs(root) or {",", ":"} & set(root):
            raise ValueError(f"{where}: storage must be an absolute path without ',' or ':' (TensorBoard lists "
                             f"the teams' roots with them), got {root!r}")
        roots[team] = os.path.normpath(root)
    for team, root in roots.items():
        for other, other_root in roots.items():
            if team != other and os.path.commonpath([root, other_root]) == other_root:
                raise ValueError(f"{TEAMS_SETTING}: team {team!r}'s storage {root} lies inside team {other!r}'s "
                                 f"{other_root}: give each team a root of its own, side by side")
    return roots


def _task_team() -> tuple[bool, str | None]:
    """Whether a task runs here, and the team of its DAG run (Airflow's multi-team mode; None
    for a DAG of no team and on Airflow releases without teams)."""
    try:
        from airflow.sdk import get_current_context

        context = get_current_context()
    except (ImportError, RuntimeError):  # no Airflow (a training image) or not inside a task
        return False, None
    return True, team_of(context)


def team_of(context: Any) -> str | None:
    """The team of a task's DAG run in Airflow's multi-team mode (Airflow 3.3: the DAG run's
    ``team_name``, from the API server), else None."""
    team = getattr(context.get("dag_run"), "team_name", None)
    return team if isinstance(team, str) and team else None


def team_root() -> str | None:
    """The current task's team's storage root when ``[airflow_tf] teams`` is set; None when it is
    not, or outside a task (the views read every team's root through :func:`teams`). A task of no
    team, or of a team the setting leaves out, is refused: its runs would land where no team's
    boundary holds."""
    roots = teams()
    if not roots:
        return None
    in_task, team = _task_team()
    if not in_task:
        return None
    if team is None or team not in roots:
        whose = f"team {team!r}" if team else "no team (its DAG bundle has none)"
        raise ValueError(f"{TEAMS_SETTING} gives no storage to {whose}, whose DAG run this task is: every "
                         f"training DAG must belong to one of the teams there ({', '.join(sorted(roots))}), "
                         f"and each team needs its own root")
    return roots[team]


def check_in_team_root(path: str, what: str) -> None:
    """Refuses ``path`` (``what`` names the argument) outside the current task's team root: the
    views would not count a run there as the team's, and the team's OS user should not be able
    to write there. Nothing to check without a team root, or for an object-storage URI."""
    from airflow_tf.files import UnsafePathError, is_local, plain_absolute_path

    root = team_root()
    if root is None or not is_local(path):
        return
    try:
        # Not normalized by hand: ``mine/../x`` crossing a link named ``mine`` ends elsewhere.
        local = plain_absolute_path(path)
    except UnsafePathError as e:
        raise ValueError(f"{what} {path}: {e}; give a plain absolute path under this team's storage root "
                         f"{root}") from None
    if os.path.commonpath([local, root]) != root:
        raise ValueError(f"{what} {path} lies outside this team's storage root {root} ({TEAMS_SETTING}): "
                         f"leave {what} unset, or give a path under {root}")


def storage_root() -> str:
    return team_root() or _setting("storage", "AIRFLOW_TF_STORAGE") or os.path.join(os.path.expanduser("~"),
                                                                                     "airflow-tf")


def state_dir() -> str | None:
    """Where the local backend keeps its groups' state; None: the backend's own default. A team's
    task keeps it in its team's root: another team's tasks may not see or signal its groups."""
    root = team_root()
    return os.path.join(root, GROUPS) if root else _setting("state_dir", "AIRFLOW_TF_STATE_DIR")


KEPT_LOG_BYTES_SETTING = "[airflow_tf] kept_log_bytes / $AIRFLOW_TF_KEPT_LOG_BYTES"
DEFAULT_KEPT_LOG_BYTES = 10 * 1024 * 1024
"""As the kubelet's default containerLogMaxSize: a pod's log holds no more than this either."""


def kept_log_bytes() -> int:
    """How much of each task's log is kept in its run directory when its group is deleted (the
    end of it, whole lines): ``[airflow_tf] kept_log_bytes`` (``$AIRFLOW_TF_KEPT_LOG_BYTES``),
    else 10 MiB. A ValueError names the setting when it is not a positive whole number."""
    text = _setting("kept_log_bytes", "AIRFLOW_TF_KEPT_LOG_BYTES")
    if not text:
        return DEFAULT_KEPT_LOG_BYTES
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{KEPT_LOG_BYTES_SETTING}: expected a positive whole number of bytes (e.g. 10485760 for "
                         f"10 MiB), got {text!r:.100}")
    return value


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
    (``$AIRFLOW_TF_BACKEND_OPTIONS``), a JSON object such as ``{"namespace": "ml"}``, each key
    checked against the options of ``[airflow_tf] backend`` (a ValueError names the setting, the key
    and what it expects)."""
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
    return options  # each key checked by its user against the backend's options (operators.common)
