"""A local group's directory under the state directory: its files (spec, owner, state, logs,
requests), written whole, the tail of a log, and the copy of its logs kept with the run."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from airflow_tf.files import atomic_open, read_json, write_json

from ..wait import kept_log

STATE_DIR_ENV = "AIRFLOW_TF_STATE_DIR"

log = logging.getLogger(__name__)


def default_state_dir() -> Path:
    """``$AIRFLOW_TF_STATE_DIR``, else ``$XDG_CACHE_HOME/airflow-tf/groups`` (``~/.cache``)."""
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "airflow-tf" / "groups"


def write_group_file(path: Path, data: Any) -> None:
    """A group file (spec, owner, state, answers), replaced whole so readers never see half of
    one; not fsynced: it describes live processes and means nothing after a reboot."""
    write_json(path, data, fsync=False, default=str)


def tail_text(path: Path, lines: int | None) -> str:
    """The last ``lines`` lines of a text file (all of it for None), '' when missing."""
    try:
        with open(path, "rb") as f:
            if lines is None:
                return f.read().decode("utf-8", "replace")
            f.seek(0, os.SEEK_END)
            end = f.tell()
            block, data = 8192, b""
            while end > 0 and data.count(b"\n") <= lines:
                start = max(0, end - block)
                f.seek(start)
                data = f.read(end - start) + data
                end, block = start, block * 2
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", "replace")
    kept = text.splitlines(keepends=True)[-lines:] if lines > 0 else []
    return "".join(kept)


def read_since(path: Path, cursor: dict[str, Any] | None, limit: int) -> tuple[str, dict[str, Any]]:
    """The whole lines of a log file written since ``cursor`` (at most ``limit`` bytes; a line
    longer than that comes in pieces), and the cursor after them. A file replaced by another (a
    new attempt's) is read from its start."""
    cursor = dict(cursor or {})
    try:
        with open(path, "rb") as log_file:
            info = os.fstat(log_file.fileno())
            offset = int(cursor.get("offset", 0))
            if cursor.get("inode") != info.st_ino or info.st_size < offset:
                offset = 0
            log_file.seek(offset)
            data = log_file.read(limit)
    except FileNotFoundError:
        return "", cursor
    end = data.rfind(b"\n") + 1 or (len(data) if len(data) >= limit else 0)
    return data[:end].decode("utf-8", "replace"), {"inode": info.st_ino, "offset": offset + end}


class GroupDir:
    """Paths of one group's directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.spec = self.path / "spec.json"
        self.owner = self.path / "owner.json"
        self.state = self.path / "state.json"
        self.logs = self.path / "logs"
        self.requests = self.path / "requests"
        self.supervisor_log = self.path / "supervisor.log"

    def log(self, role: str, index: int) -> Path:
        return self.logs / f"{role}-{int(index)}.log"

    def exists(self) -> bool:
        return self.spec.exists()


def archive_logs(path: Path) -> Path | None:
    """Copy the group's task and supervisor logs into its attempt's logs directory
    (``<run_dir>/logs/attempt-<N>/<group>-<role>-<index>.log``); each file is replaced whole."""
    group = GroupDir(path)
    saved = read_json(group.spec, missing_ok=True) or {}
    target = saved.get("logs_dir")
    if not target:
        return None
    target = Path(target)
    name = saved["spec"]["name"]
    try:
        target.mkdir(parents=True, exist_ok=True)
        limit = saved.get("kept_log_bytes")  # read at the launch, where a bad setting is reported
        for source in [*sorted(group.logs.glob("*.log")), group.supervisor_log]:
            copy = target / f"{name}-{source.name}"
            try:
                with open(source, "rb") as log_file, atomic_open(copy, "wb", fsync=False) as kept:
                    start = max(0, os.fstat(log_file.fileno()).st_size - limit) if limit else 0
                    log_file.seek(start)
                    kept.write(kept_log(log_file.read(), limit, start))
            except FileNotFoundError:  # no such log, or the group was deleted meanwhile (and archived)
                continue
    except OSError as err:
        log.warning("could not copy the logs of group %r to %s: %s", name, target, err)
    return target
