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
import stat
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from airflow_tf.files import (UnsafePathError, is_local, open_beneath, path_parts, plain_absolute_path,
                              read_json_beneath, write_json_at)

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


def run_launch(run_dir: Any) -> RunLaunch | None:
    """The launch recorded in ``run_dir`` (a local path or ``file://`` URI), or None when it has
    no record (launched before records existed, by ``airflow-tf run``, on object storage, or not
    a run). A record that cannot be trusted or read is a ValueError saying why: a run directory
    given with ``.``/``..``, relative or through a symbolic link (it would read as one directory
    and open as another), a record that is a link, hard-linked, unreadable, or not a launch."""
    if isinstance(run_dir, (str, os.PathLike)) and not is_local(run_dir):
        return None
    path = plain_absolute_path(run_dir)
    try:
        data = read_json_beneath("/", f"{path}/{RUN_RECORD}")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"{path}/{RUN_RECORD}: cannot be read ({exc})") from None
    return _record(data, f"{path}/{RUN_RECORD}")


def _record(data: Any, where: str) -> RunLaunch:
    """The launch a record's JSON names, checked field by field."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object naming the launch, got {type(data).__name__}")
    fields = {"dag_id": str, "run_id": str, "task_id": str, "map_index": int}
    for key, kind in fields.items():
        value = data.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or value == "":
            raise ValueError(f"{where}: {key} must be a{'n integer' if kind is int else ' non-empty string'}, "
                             f"got {value!r}")
    return RunLaunch(data["dag_id"], data["run_id"], data["task_id"], data["map_index"])


def claim_run_dir(run_dir: str | os.PathLike[str], launch: RunLaunch) -> None:
    """Record ``launch`` as the creator of ``run_dir`` before anything is written there.

    A run directory is one DAG's: a new run creates it (exclusively: a directory or link someone
    put under the name first is not used), a later run or a retry of the same DAG takes it over
    (a run resumed in place) when it is a real directory of this process's user; another DAG's
    launch is refused, and so is a directory inside another run's directory (its curves would
    count as that run's). The path is walked from ``/`` without following a symbolic link, and a
    path with ``.``, ``..`` or a link in it is refused: the views resolve it as it reads.
    Object-storage run directories carry no record."""
    if not is_local(run_dir):
        return
    try:
        path = plain_absolute_path(run_dir)
    except UnsafePathError as exc:
        raise UnsafePathError(f"run_dir: {exc}") from None
    parts = path_parts(path)
    if not parts:
        raise UnsafePathError("run_dir '/': give a directory of its own")
    try:
        parent_fd = _open_parent(parts[:-1], path)
    except UnsafePathError as exc:
        raise UnsafePathError(
            f"run_dir {path}: {exc}. The training tasks and the views would find another directory than the one "
            f"it names ({os.path.realpath(path)}); give run_dir (or the storage root) as that resolved path") from None
    try:
        # Exclusively: an existing one (a retry's, a later run's, or someone else's) is checked
        # on the directory opened below before anything is written there.
        with suppress(FileExistsError):
            os.mkdir(parts[-1], 0o777, dir_fd=parent_fd)
        run_fd = _open_run_dir(parent_fd, parts[-1], path)
        try:
            _check_takeover(run_fd, path, launch)
            write_json_at(run_fd, RUN_RECORD, dataclasses.asdict(launch))
        finally:
            os.close(run_fd)
    finally:
        os.close(parent_fd)


_WHAT_TO_DO = "Remove it if it is stale, or give this launch a run_dir of its own (or leave run_dir unset)"


def _open_parent(names: list[str], path: str) -> int:
    """The run directory's parent, made where missing and opened from ``/`` following no link;
    refused when one of the directories on the way is another run's directory."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, name in enumerate(names):
            where = "/" + "/".join(names[:index + 1])
            try:
                child = open_beneath(fd, name, directory=True, create_directories=True)
            except UnsafePathError:
                raise UnsafePathError(f"{where} is a symbolic link or not a directory") from None
            os.close(fd)
            fd = child
            holder = _holder_at(fd, where)
            if holder is not None:
                raise RunDirTakenError(
                    f"run_dir {path} is inside the run directory {where} ({_held(holder)}): a run's directory "
                    "holds one run; give this launch a run_dir of its own (or leave run_dir unset)")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _holder_at(dir_fd: int, where: str) -> RunLaunch | str | None:
    """The launch recorded in the open directory ``dir_fd`` (``where``), a description of a
    record that cannot be read, or None without one."""
    try:
        return _record(read_json_beneath(dir_fd, RUN_RECORD), f"{where}/{RUN_RECORD}")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return f"an unreadable launch record ({exc})"


def _open_run_dir(parent_fd: int, name: str, path: str) -> int:
    """The run directory ``name`` in its open parent, opened without following a link."""
    try:
        return open_beneath(parent_fd, name, directory=True)
    except UnsafePathError:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            raise RunDirTakenError(f"run_dir {path} is a symbolic link (to {os.readlink(name, dir_fd=parent_fd)}), "
                                   f"not a directory a launch made: not written through. {_WHAT_TO_DO}") from None
        raise RunDirTakenError(f"run_dir {path} exists and is not a directory. {_WHAT_TO_DO}") from None


def _check_takeover(run_fd: int, path: str, launch: RunLaunch) -> None:
    """Refuses to record ``launch`` in the open run directory ``run_fd`` unless it belongs to
    this process's user and is new (empty, no record: made by this call, or by a try of this
    launch stopped before recording itself) or records a launch of the same DAG."""
    info = os.fstat(run_fd)
    holder = _holder_at(run_fd, path)
    if info.st_uid != os.geteuid():
        raise RunDirTakenError(
            f"run_dir {path} exists and belongs to uid {info.st_uid} ({_held(holder)}), not to uid {os.geteuid()} "
            f"that runs this launch: a launch takes over only a directory its own user made. {_WHAT_TO_DO}")
    if holder is None and not os.listdir(run_fd):
        return
    if not isinstance(holder, RunLaunch):
        raise RunDirTakenError(f"run_dir {path} exists with {_held(holder)} and files in it: no launch of "
                               f"{launch.dag_id} made it. {_WHAT_TO_DO}")
    if holder.dag_id != launch.dag_id:
        raise RunDirTakenError(
            f"run_dir {path} belongs to a run of DAG {holder.dag_id} (launched by {holder}), not of {launch.dag_id}: "
            "a DAG never trains into another DAG's run directory; give this launch a run_dir of its own "
            "(or leave run_dir unset)"
        )


def _held(holder: RunLaunch | str | None) -> str:
    if holder is None:
        return "no launch record"
    return f"launched by {holder}" if isinstance(holder, RunLaunch) else holder
