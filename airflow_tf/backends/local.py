"""The embedded default backend: every task of a group is a process on 127.0.0.1.

A group must outlive the process that launched it (an Airflow task launches it; a sensor, a
trigger and a teardown task in other processes watch and stop it). So each group gets a small
detached supervisor (:mod:`.local_supervisor`) that starts the tasks, restarts them, and writes
the group's state to a file. This module launches that supervisor, reads its state file and
the tasks' logs, and hands it teardown requests. Everything about a group lives in one
directory, ``<state_dir>/<group name>/``::

    spec.json         the GroupSpec and launch options (written before anything starts)
    state.json        written atomically by the supervisor: GroupStatus, pids, ports
    logs/<role>-<index>.log
    supervisor.log
    requests/<id>.json, requests/<id>.done   teardown requests and their answers
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Iterable

from airflow_tf.cluster import GroupSpec, GroupStatus, Phase, TaskStatus

from .base import BackendError, GroupRef, poll_watch

STATE_DIR_ENV = "AIRFLOW_TF_STATE_DIR"
SUPERVISOR_MODULE = "airflow_tf.backends.local_supervisor"
LAUNCH_TIMEOUT = 30.0
"""Seconds to wait for a new supervisor to write its first state."""
TEARDOWN_TIMEOUT = 15.0
STOP_GRACE = 1.0
"""Seconds between SIGTERM and SIGKILL when stopping a task."""
NEVER_STARTED_AFTER = 60.0


def default_state_dir() -> Path:
    """``$AIRFLOW_TF_STATE_DIR``, else ``$XDG_CACHE_HOME/airflow-tf/groups`` (``~/.cache``)."""
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "airflow-tf" / "groups"


# -- files and processes shared with the supervisor ----------------------------------------
def write_json_atomic(path: Path, data: Any) -> None:
    """Readers see the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True, default=str)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_json(path: Path) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None when it is gone
    or a zombie. With the pid it identifies a process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def is_running(pid: int | None, start_time: int | None) -> bool:
    if not pid:
        return False
    current = process_start_time(pid)
    return current is not None and (start_time is None or current == start_time)


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


class GroupDir:
    """Paths of one group's directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.spec = self.path / "spec.json"
        self.state = self.path / "state.json"
        self.logs = self.path / "logs"
        self.requests = self.path / "requests"
        self.supervisor_log = self.path / "supervisor.log"

    def log(self, role: str, index: int) -> Path:
        return self.logs / f"{role}-{int(index)}.log"

    def exists(self) -> bool:
        return self.spec.exists()


def _signal_process(pid: int, start_time: int | None, signum: int, group: bool = False) -> None:
    if not is_running(pid, start_time):
        return
    try:
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        pass


def stop_processes(procs: Iterable[tuple[int, int | None]], grace: float = STOP_GRACE) -> None:
    """SIGTERM each (pid, start time) and its process group, SIGKILL what is left after ``grace``."""
    procs = [p for p in procs if is_running(*p)]
    for pid, start in procs:
        _signal_process(pid, start, signal.SIGTERM, group=True)
    deadline = time.monotonic() + grace
    while any(is_running(*p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid, start in procs:
        _signal_process(pid, start, signal.SIGKILL, group=True)


# -- the backend ----------------------------------------------------------------------------
class LocalBackend:
    """Runs a group as local processes under a detached per-group supervisor.

    :param state_dir: where groups keep their state and logs; default ``$AIRFLOW_TF_STATE_DIR``
        or ``~/.cache/airflow-tf/groups``. It travels in the GroupRef, so any process reconnects.
    """

    name = "local"

    def __init__(self, state_dir: str | os.PathLike | None = None) -> None:
        self.state_dir = Path(state_dir).expanduser().resolve() if state_dir else default_state_dir().resolve()

    # -- references -------------------------------------------------------------------------
    def _dir(self, name: str) -> GroupDir:
        if not name or "/" in name or name.startswith("."):
            raise BackendError(f"{name!r} is not a training group name")
        return GroupDir(self.state_dir / name)

    def _ref(self, name: str, success_policy: str) -> GroupRef:
        return GroupRef(backend=self.name, name=name, options={"state_dir": str(self.state_dir)},
                        success_policy=success_policy)

    def find(self, name: str) -> GroupRef | None:
        group = self._dir(name)
        saved = read_json(group.spec)
        if saved is None:
            return None
        return self._ref(name, saved["spec"].get("success_policy", "AllWorkers"))

    # -- launch -----------------------------------------------------------------------------
    def launch(self, spec: GroupSpec, owner_pid: int | None = None) -> GroupRef:
        """Start the group's supervisor, which starts every task.

        Idempotent: an existing group of this name is returned as it is. ``owner_pid`` ties
        the group to a process: when it exits (even by SIGKILL) the group is torn down
        (``airflow-tf run`` passes its own pid; Airflow leaves it None, so the group outlives
        the launching task)."""
        spec.validate()
        existing = self.find(spec.name)
        if existing is not None:
            return existing
        _check_inputs(spec)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".launching-{spec.name}-", dir=self.state_dir))
        owner = None
        if owner_pid is not None:
            owner = {"pid": owner_pid, "start_time": process_start_time(owner_pid)}
            if owner["start_time"] is None:
                raise BackendError(f"owner process {owner_pid} is not running")
        try:
            for sub in ("logs", "requests"):
                (staging / sub).mkdir()
            write_json_atomic(staging / "spec.json", {"spec": spec.to_dict(), "owner": owner,
                                                       "launched_at": time.time()})
            try:
                os.rename(staging, self.state_dir / spec.name)
            except OSError as err:
                if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    # Another launcher won the race: attach to its group.
                    return self._ref(spec.name, spec.success_policy)
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        group = self._dir(spec.name)
        self._start_supervisor(group)
        return self._ref(spec.name, spec.success_policy)

    def _start_supervisor(self, group: GroupDir) -> None:
        env = dict(os.environ, **{STATE_DIR_ENV: str(self.state_dir), "PYTHONUNBUFFERED": "1"})
        with open(group.supervisor_log, "ab") as log:
            # The supervisor forks once more and its first process exits at once, so the
            # daemon is nobody's child here: no zombie in a long-lived launcher, and the
            # group survives the launcher.
            started = subprocess.run(
                [sys.executable, "-m", SUPERVISOR_MODULE, str(group.path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                start_new_session=True, timeout=LAUNCH_TIMEOUT, check=False,
            )
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        while started.returncode == 0 and not group.state.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not group.state.exists():
            raise BackendError(
                f"the supervisor of group {group.path.name!r} did not start; its log "
                f"{group.supervisor_log} ends with:\n{tail_text(group.supervisor_log, 20)}"
            )

    # -- status -----------------------------------------------------------------------------
    def status(self, ref: GroupRef) -> GroupStatus:
        group = self._dir(ref.name)
        saved = read_json(group.spec)
        if saved is None:
            return GroupStatus(name=ref.name, exists=False)
        state = read_json(group.state)
        if state is None:
            return self._not_started(ref.name, saved, group)
        if state["supervisor"]["state"] == "running" and not is_running(
            state["supervisor"]["pid"], state["supervisor"]["start_time"]
        ):
            # It may have written its final state and exited just now: read again.
            state = read_json(group.state)
            if state["supervisor"]["state"] == "running":
                status = GroupStatus.from_dict(state["status"])
                status.failure = status.failure or (
                    f"the supervisor of group {ref.name!r} (pid {state['supervisor']['pid']}) died and its "
                    f"tasks were stopped with it; see {group.supervisor_log}"
                )
                return status
        return GroupStatus.from_dict(state["status"])

    def _not_started(self, name: str, saved: dict[str, Any], group: GroupDir) -> GroupStatus:
        spec = GroupSpec.from_dict(saved["spec"])
        status = GroupStatus(name=name, tasks=[
            TaskStatus(role, index, f"{name}-{role}-{index}", Phase.PENDING) for role, index in spec.tasks()
        ])
        if time.time() - saved["launched_at"] > NEVER_STARTED_AFTER:
            status.failure = (f"the supervisor of group {name!r} never started; see {group.supervisor_log}, "
                              "then tear the group down and launch it again")
        return status

    def watch(self, ref: GroupRef, timeout: float | None = None) -> AsyncIterator[GroupStatus]:
        return poll_watch(self, ref, 0.5, timeout)

    def logs(self, ref: GroupRef, role: str, index: int, tail_lines: int | None = None) -> str:
        group = self._dir(ref.name)
        if "/" in role or role.startswith("."):
            raise BackendError(f"{role!r} is not a role")
        return tail_text(group.log(role, index), tail_lines)

    def log_path(self, ref: GroupRef, role: str, index: int) -> Path:
        return self._dir(ref.name).log(role, index)

    def processes(self, ref: GroupRef) -> dict[str, int]:
        """Pid of every running task by task name (``tf-x-worker-1``), e.g. to attach a profiler."""
        state = read_json(self._dir(ref.name).state) or {}
        return {name: p["pid"] for name, p in state.get("processes", {}).items() if is_running(p["pid"], p["start_time"])}

    def supervisor_pid(self, ref: GroupRef) -> int | None:
        """Pid of the group's supervisor while it runs."""
        state = read_json(self._dir(ref.name).state) or {}
        sup = state.get("supervisor")
        return sup["pid"] if sup and is_running(sup["pid"], sup["start_time"]) else None

    # -- teardown ---------------------------------------------------------------------------
    def teardown(self, ref: GroupRef, roles: Iterable[str] | None = None) -> list[str]:
        group = self._dir(ref.name)
        if not group.exists():
            return []
        roles = None if roles is None else sorted(set(roles))
        state = self._wait_for_state(group)
        deleted = self._ask_supervisor(group, state, roles) if state else None
        if deleted is None:
            deleted = self._stop_without_supervisor(group, roles)
        if roles is None:
            self._remove(group)
        return deleted

    def _wait_for_state(self, group: GroupDir) -> dict[str, Any] | None:
        """A launch in another process may not have its supervisor up yet: give it time."""
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        while (state := read_json(group.state)) is None and time.monotonic() < deadline:
            saved = read_json(group.spec)
            if saved is None or time.time() - saved["launched_at"] > NEVER_STARTED_AFTER:
                return None
            time.sleep(0.05)
        return state

    def _ask_supervisor(self, group: GroupDir, state: dict[str, Any], roles: list[str] | None) -> list[str] | None:
        """Hand the request to a live supervisor and wait for its answer (None if it is gone)."""
        sup = state["supervisor"]
        if sup["state"] != "running" or not is_running(sup["pid"], sup["start_time"]):
            return None
        request = uuid.uuid4().hex
        write_json_atomic(group.requests / f"{request}.json", {"roles": roles})
        _signal_process(sup["pid"], sup["start_time"], signal.SIGUSR1)
        answer_path = group.requests / f"{request}.done"
        deadline = time.monotonic() + TEARDOWN_TIMEOUT
        while time.monotonic() < deadline:
            answer = read_json(answer_path)
            if answer is not None:
                if roles is None:
                    self._wait_gone(sup["pid"], sup["start_time"])
                return answer["deleted"]
            if not is_running(sup["pid"], sup["start_time"]):
                return read_json(answer_path)["deleted"] if answer_path.exists() else None
            time.sleep(0.01)
        # A supervisor that does not answer is stuck: kill it (its tasks die with it).
        _signal_process(sup["pid"], sup["start_time"], signal.SIGKILL)
        self._wait_gone(sup["pid"], sup["start_time"])
        return None

    @staticmethod
    def _wait_gone(pid: int, start_time: int | None, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while is_running(pid, start_time) and time.monotonic() < deadline:
            time.sleep(0.01)
        _signal_process(pid, start_time, signal.SIGKILL)

    def _stop_without_supervisor(self, group: GroupDir, roles: list[str] | None) -> list[str]:
        """The supervisor is gone: stop any task it left (there should be none, its tasks
        die with it) and record the deletion ourselves; nobody else writes the state now."""
        state = read_json(group.state)
        if state is None:
            return []
        status = GroupStatus.from_dict(state["status"])
        chosen = [t for t in status.tasks if roles is None or t.role in roles]
        procs = state.get("processes", {})
        stop_processes((procs[t.name]["pid"], procs[t.name]["start_time"]) for t in chosen if t.name in procs)
        if roles is not None:
            status.tasks = [t for t in status.tasks if t not in chosen]
            state["status"] = status.to_dict()
            state["processes"] = {n: p for n, p in procs.items() if n not in {t.name for t in chosen}}
            write_json_atomic(group.state, state)
        return [t.name for t in chosen]

    def _remove(self, group: GroupDir) -> None:
        # Rename first so readers see the whole group or nothing.
        trash = self.state_dir / f".deleting-{group.path.name}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(group.path, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)


def _check_inputs(spec: GroupSpec) -> None:
    """Refuse, before anything starts, a dataset that is not committed and a run directory
    that cannot be created."""
    if spec.training is None:
        return
    from airflow_tf.data import load_schema

    load_schema(spec.training.dataset)
    run_dir = spec.training.run_dir
    if "://" not in run_dir:
        try:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise BackendError(
                f"run directory {run_dir!r} cannot be created ({err.strerror}); choose a writable --run-dir"
            ) from err
