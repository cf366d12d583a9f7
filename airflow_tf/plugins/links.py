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
from airflow_tf.files import strip_file_scheme
from airflow_tf.storage import runs_dir

URL_PREFIX = "/tensorboard"
"""Where the plugin mounts TensorBoard in the API server (below ``[api] base_url``'s path)."""


def run_name(run_dir: str, runs: str | None = None) -> str | None:
    """TensorBoard's name of the run in ``run_dir`` (its path below ``runs/``), or None when the
    run directory lies outside the storage's ``runs/`` (TensorBoard does not see it)."""
    runs = os.path.normpath(runs or runs_dir())
    path = os.path.normpath(strip_file_scheme(run_dir))
    if os.path.commonpath([runs, path]) != runs or path == runs:
        return None
    return os.path.relpath(path, runs).replace(os.sep, "/")


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
        name = run_name(LaunchResult.from_dict(value).run_dir)
        return scalars_url([name] if name else [], _base_url())
