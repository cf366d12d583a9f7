"""Whose group is it, and whose run directory?

A launch that remembers what it created (its record: the group's name
and uid, kept where a retry of the same task finds it, e.g. Airflow 3.3's task state store)
re-attaches only to that group, and refuses a same-named group it did not create.

The record is written in two steps: ``{"name", "uid": None}`` before creating (the intent),
then with the uid once created. A retry that finds the intent without a uid and a group of
that name re-attaches: the first try checked that no group of that name existed before
recording its intent, so the group is the one it created before it was lost."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_tf.files import is_local, read_json, strip_file_scheme, write_json

from .base import BackendError, GroupRef


class NotOurGroupError(BackendError):
    """A group of the launch's name exists that this launch did not create."""


def intent(name: str) -> dict[str, Any]:
    return {"name": name, "uid": None}


def record_of(ref: GroupRef) -> dict[str, Any]:
    return {"name": ref.name, "uid": ref.uid, "backend": ref.backend, "namespace": ref.namespace}


def check_ours(name: str, record: Any, found: GroupRef | None, who: str) -> bool:
    """Whether to re-attach (True) or create (False) the group ``name`` given this launch's
    ``record`` (None: it created nothing yet) and the group ``found`` under that name. Raises
    :class:`NotOurGroupError` for a group it did not create; ``who`` names the launch."""
    if found is None:
        return False  # nothing there (a group it created and that is gone is created again)
    mine = record if isinstance(record, dict) and record.get("name") == name else None
    if mine is None:
        raise NotOurGroupError(
            f"training group {name} ({_where(found)}, uid {found.uid or 'unknown'}) already exists, but {who} did "
            "not create it: it belongs to another DAG run, deployment or Airflow using the same group name, or was "
            "left by one. Not re-attaching to it. Delete it if it is stale, or give this launch another group_name."
        )
    if mine.get("uid") is None or mine["uid"] == found.uid:
        return True
    raise NotOurGroupError(
        f"training group {name} ({_where(found)}) is not the one {who} created: it has uid {found.uid or 'unknown'}, "
        f"{who} created uid {mine['uid']}. Someone else replaced it under the same name; not re-attaching. "
        "Delete it if it is stale, or give this launch another group_name."
    )


def _where(ref: GroupRef) -> str:
    return f"{ref.backend} backend" + (f", namespace {ref.namespace}" if ref.namespace else "")


# -- run directories ------------------------------------------------------------------------
# Whose run is it? The launch that created a run directory writes, inside it, which DAG run,
# task and map index it is. Views that decide who may read a run (TensorBoard, the Training
# view) trust a launch result only when that record names the same launch: a launch result is
# an XCom, which any task of any DAG can return, while the record is written by the launch alone.

RUN_RECORD = "launched_by.json"
"""The launch record inside a run directory."""


@dataclass(frozen=True)
class RunLaunch:
    """The launch task instance that created a run directory."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int

    def __str__(self) -> str:
        mapped = f"[{self.map_index}]" if self.map_index >= 0 else ""
        return f"{self.dag_id}/{self.run_id}/{self.task_id}{mapped}"


class RunDirTakenError(BackendError):
    """The run directory belongs to another DAG's run, or lies inside another run's directory."""


def run_launch(run_dir: str | os.PathLike[str]) -> RunLaunch | None:
    """The launch recorded in ``run_dir`` (a local path or ``file://`` URI), or None when it has
    no readable record (launched before records existed, by ``airflow-tf run``, or not a run)."""
    if not is_local(run_dir):
        return None
    try:
        data = read_json(os.path.join(strip_file_scheme(run_dir), RUN_RECORD))
        return RunLaunch(str(data["dag_id"]), str(data["run_id"]), str(data["task_id"]), int(data["map_index"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def claim_run_dir(run_dir: str | os.PathLike[str], launch: RunLaunch) -> None:
    """Record ``launch`` as the creator of ``run_dir`` before anything is written there.

    A run directory is one DAG's: a later run or a retry of the same DAG takes it over (a run
    resumed in place), another DAG's launch is refused, and so is a directory inside another
    run's directory (its curves would count as that run's). Object-storage run directories carry
    no record."""
    if not is_local(run_dir):
        return
    path = Path(strip_file_scheme(run_dir)).absolute()
    for parent in path.parents:
        if (parent / RUN_RECORD).exists():
            holder = run_launch(parent)
            raise RunDirTakenError(
                f"run_dir {path} is inside the run directory {parent} (launched by {holder or 'an unknown launch'}): "
                "a run's directory holds one run; give this launch a run_dir of its own (or leave run_dir unset)"
            )
    holder = run_launch(path)
    if holder is not None and holder.dag_id != launch.dag_id:
        raise RunDirTakenError(
            f"run_dir {path} belongs to a run of DAG {holder.dag_id} (launched by {holder}), not of {launch.dag_id}: "
            "a DAG never trains into another DAG's run directory; give this launch a run_dir of its own "
            "(or leave run_dir unset)"
        )
    path.mkdir(parents=True, exist_ok=True)
    write_json(path / RUN_RECORD, dataclasses.asdict(launch))
