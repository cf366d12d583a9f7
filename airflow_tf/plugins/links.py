"""Where a run's curves are in the TensorBoard the plugin mounts, and the launch task's link to them.

Light on purpose: the launch operator imports this module, so nothing here imports TensorFlow,
TensorBoard or the API server."""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

from airflow_tf.cluster.results import LaunchResult
from airflow_tf.files import UnsafePathError, plain_absolute_path
from airflow_tf.storage import runs_dir, teams

URL_PREFIX = "/tensorboard"
"""Where the plugin mounts TensorBoard in the API server (below ``[api] base_url``'s path)."""


def run_roots() -> dict[str, str]:
    """The directories TensorBoard serves, by the prefix of their runs' names: ``{"": <storage>/runs}``,
    or with ``[airflow_tf] teams`` each team's ``<root>/runs`` under the team's name (a run of
    team_a is ``team_a/<group>``)."""
    roots = teams()
    if not roots:
        return {"": os.path.normpath(runs_dir())}
    return {team: os.path.join(root, "runs") for team, root in roots.items()}


def run_name(run_dir: str, roots: dict[str, str] | str | None = None) -> str | None:
    """TensorBoard's name of the run in ``run_dir`` (its path below a root of :func:`run_roots`,
    or of ``roots``: those, or one runs directory, after that root's prefix), or None when it lies
    outside them (TensorBoard does not see it). A ``run_dir`` that is not a plain absolute path
    (not a string, relative, or with ``.``/``..``, which the kernel would resolve after a link
    and not as it reads) has no name either."""
    try:
        path = plain_absolute_path(run_dir)
    except UnsafePathError:
        return None
    if roots is None:
        roots = run_roots()
    for prefix, root in ({"": roots} if isinstance(roots, str) else roots).items():
        runs = os.path.normpath(root)
        if os.path.isabs(runs) and os.path.commonpath([runs, path]) == runs and path != runs:
            relative = os.path.relpath(path, runs).replace(os.sep, "/")
            return f"{prefix}/{relative}" if prefix else relative
    return None


def split_run_name(name: str, roots: dict[str, str]) -> tuple[str, str] | None:
    """The prefix of ``roots`` a TensorBoard run name lies under, and its name below that root;
    None for a name no root serves."""
    prefix, _, rest = ("", "", name) if "" in roots else name.partition("/")
    if prefix not in roots or not rest.strip("/"):
        return None
    return prefix, rest


def scalars_url(names: list[str], base: str = URL_PREFIX) -> str:
    """TensorBoard's time-series (scalars) page filtered to the given runs (and what is below them)."""
    if not names:
        return f"{base}/#timeseries"
    pattern = "^(" + "|".join(re.escape(name) for name in names) + ")(/|$)"
    return f"{base}/?runFilter={quote(pattern, safe='')}#timeseries"


def airflow_url() -> str:
    """``[api] base_url`` without its trailing slash ('' when unset: links then start with ``/``)."""
    from airflow.configuration import conf

    return conf.get("api", "base_url", fallback="").rstrip("/")


def _base_url() -> str:
    """The mount's URL: ``[api] base_url`` + the prefix (absolute when base_url is set)."""
    return airflow_url() + URL_PREFIX


def task_url(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """The task instance's page (its log) in the Airflow UI."""
    path = "/".join(quote(part, safe="") for part in ("dags", dag_id, "runs", run_id, "tasks", task_id))
    return f"{airflow_url()}/{path}" + (f"/mapped/{map_index}" if map_index >= 0 else "")


class TensorBoardLink(BaseOperatorLink):
    """``TensorBoard`` on a launch task: its group's curves (from the launch's XCom)."""

    name = "TensorBoard"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        value = XCom.get_value(ti_key=ti_key, key="return_value")
        if not value:  # the launch did not get as far as a group
            return ""
        try:
            name = run_name(LaunchResult.from_dict(value).run_dir)
        except ValueError:  # not a launch's result: the link shows every run the user may read
            name = None
        return scalars_url([name] if name else [], _base_url())
