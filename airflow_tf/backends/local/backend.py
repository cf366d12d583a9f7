"""The embedded default backend: every task of a group is a process on 127.0.0.1.

A group must outlive the process that launched it (an Airflow task launches it; a sensor, a
trigger and a teardown task in other processes watch and stop it). So each group gets a small
detached supervisor (:mod:`.supervisor`) that starts the tasks, restarts them, and writes
the group's state to a file. This module launches that supervisor, reads its state file and
the tasks' logs, and hands it teardown requests. Everything about a group lives in one
directory, ``<state_dir>/<group name>/``::

    spec.json         the GroupSpec, its attempt number and logs directory (written before anything starts)
    owner.json        the process the group is tied to until it is handed over (null after)
    state.json        written atomically by the supervisor: GroupStatus, pids, ports, isolation
    logs/<role>-<index>.log
    supervisor.log
    requests/<id>.json, requests/<id>.done   teardown requests and their answers

The supervisor and its tasks run in a private network namespace with only loopback up, and
with a minimal environment (:func:`task_environment`). Each launch of a name is an attempt;
its logs are copied to ``<run_dir>/logs/attempt-<N>/`` when the group ends or is deleted.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow_tf.cluster import GroupSpec, GroupStatus, OutcomeCode, Phase, TaskStatus
from airflow_tf.cluster.names import GROUP_ENV, RUN_ENV, task_name
from airflow_tf.cluster.spec import DEFAULT_SUCCESS_POLICY
from airflow_tf.files import is_local, read_json, strip_file_scheme
from airflow_tf.storage import kept_log_bytes

from ..base import BackendError, GroupRef, poll_watch
from ..options import BackendOption, check_options, optional, path_option
from .files import (STATE_DIR_ENV, GroupDir, archive_logs, default_state_dir, read_since, tail_text,
                          write_group_file)
from .memory import check_capacity, expected_memory_mib, resident_mib
from .processes import (
    KILL_WAIT, STOP_GRACE, describe_process, is_running, marked_processes, process_start_time,
    remove_temporary_directory, signal_process, stop_processes, task_environment, wait_gone,
)

SUPERVISOR_MODULE = "airflow_tf.backends.local.supervisor"
LAUNCH_TIMEOUT = 30.0
"""Seconds to wait for a new supervisor to write its first state."""
TEARDOWN_TIMEOUT = 15.0
NEVER_STARTED_AFTER = 60.0

log = logging.getLogger(__name__)


def _local_path(uri: str) -> Path | None:
    """A local directory from a path or ``file://`` URI; None for remote storage."""
    return Path(strip_file_scheme(uri)) if is_local(uri) else None


OPTIONS = {"state_dir": BackendOption("where groups keep their state and logs", optional(path_option))}
"""Every option of the local backend (the parameters of :class:`LocalBackend`)."""


# -- the backend ----------------------------------------------------------------------------
class LocalBackend:
    """Runs a group as local processes under a detached per-group supervisor.

    :param state_dir: where groups keep their state and logs; default ``$AIRFLOW_TF_STATE_DIR``
        or ``~/.cache/airflow-tf/groups``. It travels in the GroupRef, so any process reconnects.
    """

    name = "local"
    keeps_logs = True
    """Its groups' logs are copied into their run directories (bounded: ``[airflow_tf] kept_log_bytes``)
    when they are deleted, by the backend itself."""

    OPTIONS = OPTIONS

    def __init__(self, state_dir: str | os.PathLike | None = None) -> None:
        state_dir = check_options(self.name, OPTIONS, {"state_dir": state_dir}, "LocalBackend")["state_dir"]
        self.state_dir = Path(state_dir).expanduser().resolve() if state_dir else default_state_dir().resolve()

    # -- references -------------------------------------------------------------------------
    def _dir(self, name: str) -> GroupDir:
        if not name or "/" in name or name.startswith("."):
            raise BackendError(f"{name!r} is not a training group name")
        return GroupDir(self.state_dir / name)

    def _ref(self, name: str, saved: dict[str, Any]) -> GroupRef:
        return GroupRef(backend=self.name, name=name, options={"state_dir": str(self.state_dir)},
                        success_policy=saved["spec"].get("success_policy", DEFAULT_SUCCESS_POLICY),
                        uid=saved.get("group_id"), labels=dict(saved["spec"].get("labels") or {}))

    def find(self, name: str) -> GroupRef | None:
        group = self._dir(name)
        saved = read_json(group.spec, missing_ok=True)
        if saved is None:
            return None
        return self._ref(name, saved)

    # -- launch -----------------------------------------------------------------------------
    def launch(self, spec: GroupSpec, owner_pid: int | None = None) -> GroupRef:
        """Start the group's supervisor, which starts every task.

        Idempotent: a live group of this name is returned as it is. A group whose supervisor
        has ended (its launcher was killed, it failed, it finished) is stale: its logs are
        kept and it is replaced by a fresh attempt at once.

        The group is tied to ``owner_pid`` (default: this process) until :meth:`hand_over`:
        when that process exits, even by SIGKILL, the group is torn down."""
        spec.validate()
        group = self._dir(spec.name)
        saved = read_json(group.spec, missing_ok=True)
        if saved is not None and self._is_live(group, saved):
            return self._ref(spec.name, saved)
        _check_inputs(spec)
        with self._admission():
            check_capacity(spec, self._promised_memory_mib())
            return self._create(spec, group, saved, owner_pid)

    def _create(self, spec: GroupSpec, group: GroupDir, saved: dict[str, Any] | None, owner_pid: int | None) -> GroupRef:
        owner_pid = os.getpid() if owner_pid is None else owner_pid
        owner = {"pid": owner_pid, "start_time": process_start_time(owner_pid)}
        if owner["start_time"] is None:
            raise BackendError(f"owner process {owner_pid} is not running")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".launching-{spec.name}-", dir=self.state_dir))
        try:
            for sub in ("logs", "requests"):
                (staging / sub).mkdir()
            previous = self._retire(group, staging) if saved is not None else 0
            attempt, logs_dir = _reserve_attempt(spec, previous + 1)
            write_group_file(staging / "owner.json", owner)
            # group_id: this attempt's identity, so a launcher can tell its own group from a
            # same-named one created by someone else (or by an earlier attempt).
            launched = {"spec": spec.to_dict(), "launched_at": time.time(), "attempt": attempt,
                        "logs_dir": logs_dir, "kept_log_bytes": kept_log_bytes(), "group_id": uuid.uuid4().hex}
            write_group_file(staging / "spec.json", launched)
            try:
                os.rename(staging, group.path)
            except OSError as err:
                if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    # Another launcher won the race: attach to its group.
                    if logs_dir:
                        os.rmdir(logs_dir)
                    winner = read_json(group.spec, missing_ok=True)
                    return self._ref(spec.name, winner or {"spec": spec.to_dict()})
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._start_supervisor(group, spec)
        return self._ref(spec.name, launched)

    @contextmanager
    def _admission(self) -> Iterator[None]:
        """One launch at a time is admitted per state directory (a lock on the directory
        itself): two launches at the same instant would both count the same free memory."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_dir, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _promised_memory_mib(self) -> float:
        """MiB the live groups of this state directory are expected to take but do not hold yet:
        tasks not started, or still importing TensorFlow (expected minus resident)."""
        total = 0.0
        for path in self.state_dir.iterdir() if self.state_dir.is_dir() else ():
            group = GroupDir(path)
            saved = None if path.name.startswith(".") else read_json(group.spec, missing_ok=True)
            if saved is None:
                continue
            state = read_json(group.state, missing_ok=True)
            if state is None:
                if time.time() - saved["launched_at"] > NEVER_STARTED_AFTER:
                    continue
                state = {}
            elif state["supervisor"]["state"] != "running" or not is_running(
                    state["supervisor"]["pid"], state["supervisor"]["start_time"]):
                continue
            spec = GroupSpec.from_dict(saved["spec"])
            per_role = expected_memory_mib(spec)
            processes = state.get("processes", {})
            phases = {t["name"]: t["phase"] for t in state.get("status", {}).get("tasks", [])}
            for role, index in spec.tasks():
                name, expected = task_name(spec.name, role, index), per_role.get(role, 0.0)
                process = processes.get(name)
                if process and is_running(process["pid"], process["start_time"]):
                    total += max(0.0, expected - resident_mib(process["pid"]))
                elif phases.get(name, Phase.PENDING.value) in (Phase.PENDING.value, Phase.RESTARTING.value):
                    total += expected
        return total

    def hand_over(self, ref: GroupRef) -> None:
        """Untie the group from the process that launched it: from now on it runs until it
        ends or is torn down, whatever happens to that process."""
        group = self._dir(ref.name)
        if group.exists():
            write_group_file(group.owner, None)

    def _is_live(self, group: GroupDir, saved: dict[str, Any]) -> bool:
        """Whether a group of this name is running (or still starting): re-attach to it."""
        state = read_json(group.state, missing_ok=True)
        if state is None:
            return time.time() - saved["launched_at"] <= NEVER_STARTED_AFTER
        sup = state["supervisor"]
        if sup["state"] != "running" or not is_running(sup["pid"], sup["start_time"]):
            return False
        owner = read_json(group.owner, missing_ok=True)
        if owner and not is_running(owner["pid"], owner["start_time"]):
            # Its launcher died before handing it over: the supervisor is stopping it now.
            self._wait_gone(sup["pid"], sup["start_time"], TEARDOWN_TIMEOUT)
            return False
        return True

    def _retire(self, group: GroupDir, staging: Path) -> int:
        """Remove a stale group, keeping its logs (in its run directory, else in the new
        attempt's ``attempts/<N>/``); returns its attempt number."""
        trash = self.state_dir / f".stale-{group.path.name}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(group.path, trash)
        except FileNotFoundError:
            return 0
        old = GroupDir(trash)
        saved = read_json(old.spec, missing_ok=True) or {}
        attempt = int(saved.get("attempt", 1))
        state = read_json(old.state, missing_ok=True) or {}
        stop_processes((p["pid"], p["start_time"]) for p in state.get("processes", {}).values())
        if archive_logs(trash) is None:
            kept = staging / "attempts" / str(attempt)
            kept.mkdir(parents=True)
            for source in [*old.logs.glob("*.log"), old.supervisor_log]:
                if source.exists():
                    os.rename(source, kept / source.name)
        shutil.rmtree(trash, ignore_errors=True)
        log.info("training group %r: attempt %d had ended (%s); starting attempt %d", group.path.name, attempt,
                 GroupStatus.from_dict(state["status"]).failure or "finished" if state else "never started",
                 attempt + 1)
        return attempt

    def _start_supervisor(self, group: GroupDir, spec: GroupSpec) -> None:
        # Every process of the group inherits its name and run: ps and cleanup scripts read them
        # in /proc/<pid>/environ, and a teardown finds the group's processes by them.
        env = dict(task_environment(spec.pass_env), **{STATE_DIR_ENV: str(self.state_dir), "PYTHONUNBUFFERED": "1",
                                                       GROUP_ENV: spec.name, RUN_ENV: spec.run_name()})
        with open(group.supervisor_log, "ab") as out:
            # The supervisor forks once more and its first process exits at once, so the
            # daemon is nobody's child here: no zombie in a long-lived launcher, and the
            # group survives the launcher.
            started = subprocess.run(
                [sys.executable, "-m", SUPERVISOR_MODULE, str(group.path)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                start_new_session=True, timeout=LAUNCH_TIMEOUT, check=False,
            )
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        while started.returncode == 0 and not group.state.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        state = read_json(group.state, missing_ok=True)
        if state is None:
            raise BackendError(
                f"the supervisor of group {group.path.name!r} did not start; its log "
                f"{group.supervisor_log} ends with:\n{tail_text(group.supervisor_log, 20)}"
            )
        isolation = state.get("isolation") or {}
        if isolation.get("warning"):
            log.warning("%s", isolation["warning"])

    def logs_dir(self, ref: GroupRef) -> Path | None:
        """Where this attempt's logs are copied: ``<run_dir>/logs/attempt-<N>/`` (None without a run directory)."""
        saved = read_json(self._dir(ref.name).spec, missing_ok=True) or {}
        return Path(saved["logs_dir"]) if saved.get("logs_dir") else None

    # -- status -----------------------------------------------------------------------------
    def status(self, ref: GroupRef) -> GroupStatus:
        group = self._dir(ref.name)
        saved = read_json(group.spec, missing_ok=True)
        if saved is None:
            return GroupStatus(name=ref.name, exists=False)
        state = read_json(group.state, missing_ok=True)
        if state is None:
            return self._not_started(ref.name, saved, group)
        if state["supervisor"]["state"] == "running" and not is_running(
            state["supervisor"]["pid"], state["supervisor"]["start_time"]
        ):
            # It may have written its final state and exited just now: read again.
            state = read_json(group.state, missing_ok=True)
            if state["supervisor"]["state"] == "running":
                status = GroupStatus.from_dict(state["status"])
                if not status.failure:
                    status.failure = (f"the supervisor of group {ref.name!r} (pid {state['supervisor']['pid']}) "
                                      f"died and its tasks were stopped with it; see {group.supervisor_log}")
                    status.failure_code = OutcomeCode.SUPERVISOR_LOST
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
            status.failure_code = OutcomeCode.SUPERVISOR_LOST
        return status

    def watch(self, ref: GroupRef, timeout: float | None = None) -> AsyncIterator[GroupStatus]:
        return poll_watch(self, ref, 0.5, timeout)

    def logs(self, ref: GroupRef, role: str, index: int, tail_lines: int | None = None) -> str:
        group = self._dir(ref.name)
        if "/" in role or role.startswith("."):
            raise BackendError(f"{role!r} is not a role")
        return tail_text(group.log(role, index), tail_lines)

    def log_since(self, ref: GroupRef, role: str, index: int, cursor: dict[str, Any] | None = None,
                  limit_bytes: int = 1 << 20) -> tuple[str, dict[str, Any]]:
        """The task's log lines written since ``cursor`` and the cursor after them (see
        :class:`airflow_tf.backends.follow.LogFollower`): its log file, from the byte where the
        last read stopped."""
        if "/" in role or role.startswith("."):
            raise BackendError(f"{role!r} is not a role")
        return read_since(self._dir(ref.name).log(role, index), cursor, limit_bytes)

    def log_path(self, ref: GroupRef, role: str, index: int) -> Path:
        return self._dir(ref.name).log(role, index)

    def processes(self, ref: GroupRef) -> dict[str, int]:
        """Pid of every running task by task name (``tf-x-worker-1``), e.g. to attach a profiler."""
        state = read_json(self._dir(ref.name).state, missing_ok=True) or {}
        return {name: p["pid"] for name, p in state.get("processes", {}).items() if is_running(p["pid"], p["start_time"])}

    def supervisor_pid(self, ref: GroupRef) -> int | None:
        """Pid of the group's supervisor while it runs."""
        state = read_json(self._dir(ref.name).state, missing_ok=True) or {}
        sup = state.get("supervisor")
        return sup["pid"] if sup and is_running(sup["pid"], sup["start_time"]) else None

    # -- one-off components: evaluation and export ------------------------------------------
    def run_component(self, ref: GroupRef, component: str, request: dict[str, Any]) -> dict[str, Any]:
        """Runs in this process: a local group's storage is this machine's. The component's own
        errors (a refused request: ValueError, ``airflow_tf.serving``'s) reach the caller as they are."""
        from airflow_tf.serving import requests  # loads TensorFlow only when the component needs it

        if component not in requests.COMMANDS:
            raise BackendError(f"group {ref.name}: component {component!r} is not one of "
                               f"{', '.join(requests.COMMANDS)}")
        log.info("running %s of group %s in this process", component, ref.name)
        return requests.COMMANDS[component](request)

    # -- teardown ---------------------------------------------------------------------------
    def teardown(self, ref: GroupRef, roles: Iterable[str] | None = None) -> list[str]:
        group = self._dir(ref.name)
        if not group.exists():
            return []
        roles = None if roles is None else sorted(set(roles))
        state = self._wait_for_state(group)
        processes = self._group_processes(group, roles)
        deleted = self._ask_supervisor(group, state, roles) if state else None
        if deleted is None:
            deleted = self._stop_without_supervisor(group, roles)
        # The supervisor reaps the tasks it stops; what they started, and the tasks of a
        # supervisor killed as stuck, end a moment later: the teardown returns once all are gone.
        self._wait_processes_gone(ref.name, processes + self._group_processes(group, roles))
        if roles is None:
            archive_logs(group.path)
            self._remove(group)
        return deleted

    def _wait_for_state(self, group: GroupDir) -> dict[str, Any] | None:
        """A launch in another process may not have its supervisor up yet: give it time."""
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        while (state := read_json(group.state, missing_ok=True)) is None and time.monotonic() < deadline:
            saved = read_json(group.spec, missing_ok=True)
            if saved is None or time.time() - saved["launched_at"] > NEVER_STARTED_AFTER:
                return None
            time.sleep(0.05)
        return state

    def _ask_supervisor(self, group: GroupDir, state: dict[str, Any], roles: list[str] | None) -> list[str] | None:
        """Hand the request to a live supervisor and wait for its answer (None if it is gone)."""
        sup = state["supervisor"]
        if not is_running(sup["pid"], sup["start_time"]):
            return None
        if sup["state"] != "running":
            # Its tasks are stopped and it is making its last writes: a teardown that returned
            # now would leave it running behind the caller, so wait for it to exit.
            self._wait_gone(sup["pid"], sup["start_time"])
            return None
        request = uuid.uuid4().hex
        write_group_file(group.requests / f"{request}.json", {"roles": roles})
        signal_process(sup["pid"], sup["start_time"], signal.SIGUSR1)
        answer_path = group.requests / f"{request}.done"
        deadline = time.monotonic() + TEARDOWN_TIMEOUT
        while time.monotonic() < deadline:
            answer = read_json(answer_path, missing_ok=True)
            if answer is not None:
                if roles is None:
                    self._wait_gone(sup["pid"], sup["start_time"])
                return answer["deleted"]
            if not is_running(sup["pid"], sup["start_time"]):
                return read_json(answer_path, missing_ok=True)["deleted"] if answer_path.exists() else None
            time.sleep(0.01)
        # A supervisor that does not answer is stuck: kill it (its tasks die with it).
        signal_process(sup["pid"], sup["start_time"], signal.SIGKILL)
        self._wait_gone(sup["pid"], sup["start_time"])
        return None

    def _group_processes(self, group: GroupDir, roles: list[str] | None) -> list[tuple[int, int | None]]:
        """(pid, start time) of the group's live processes, or of its tasks of ``roles``: those its
        state file names and, for the whole group, every process that carries its name and state
        directory in its environment (its supervisor, fork server, tasks and what they started)."""
        state = read_json(group.state, missing_ok=True) or {}
        chosen = {t.name for t in GroupStatus.from_dict(state["status"]).tasks
                  if roles is None or t.role in roles} if state else set()
        found = [(p["pid"], p["start_time"]) for name, p in state.get("processes", {}).items() if name in chosen]
        if roles is None:
            found += [(state["supervisor"]["pid"], state["supervisor"]["start_time"])] if state else []
            found += marked_processes({STATE_DIR_ENV: str(self.state_dir), GROUP_ENV: group.path.name})
        return [p for p in dict.fromkeys(found) if is_running(*p)]

    @staticmethod
    def _wait_processes_gone(name: str, processes: list[tuple[int, int | None]]) -> None:
        """Return once every one of ``processes`` is gone: those still running ``STOP_GRACE`` after
        their group's teardown are killed; BackendError if any outlives that by ``KILL_WAIT``."""
        if wait_gone(processes, STOP_GRACE):
            return
        left = [p for p in processes if is_running(*p)]
        for pid, start_time in left:
            signal_process(pid, start_time, signal.SIGKILL)
        if wait_gone(left, KILL_WAIT):
            return
        still = "; ".join(f"pid {pid} ({describe_process(pid)})" for pid, start in left if is_running(pid, start))
        raise BackendError(
            f"training group {name!r} was torn down, but these of its processes still run {KILL_WAIT:g} s after "
            f"SIGKILL: {still}. A process that does not die of SIGKILL is stuck in the kernel (state D: a hung "
            "disk or network mount); free what it waits for, or reboot, then tear the group down again"
        )

    @staticmethod
    def _wait_gone(pid: int, start_time: int | None, timeout: float = 5.0) -> None:
        if not wait_gone([(pid, start_time)], timeout):
            signal_process(pid, start_time, signal.SIGKILL)
            wait_gone([(pid, start_time)], KILL_WAIT)

    def _stop_without_supervisor(self, group: GroupDir, roles: list[str] | None) -> list[str]:
        """The supervisor is gone: stop any task it left (there should be none, its tasks
        die with it) and record the deletion ourselves; nobody else writes the state now."""
        state = read_json(group.state, missing_ok=True)
        if state is None:
            return []
        status = GroupStatus.from_dict(state["status"])
        chosen = [t for t in status.tasks if roles is None or t.role in roles]
        procs = state.get("processes", {})
        stop_processes((procs[t.name]["pid"], procs[t.name]["start_time"]) for t in chosen if t.name in procs)
        parents = _temporary_parents(read_json(group.spec, missing_ok=True))
        for t in chosen:  # the supervisor would have removed them when their processes ended
            remove_temporary_directory(procs.get(t.name, {}).get("temporary"), parents)
        if roles is not None:
            status.tasks = [t for t in status.tasks if t not in chosen]
            state["status"] = status.to_dict()
            state["processes"] = {n: p for n, p in procs.items() if n not in {t.name for t in chosen}}
            write_group_file(group.state, state)
        return [t.name for t in chosen]

    def _remove(self, group: GroupDir) -> None:
        # Rename first so readers see the whole group or nothing.
        trash = self.state_dir / f".deleting-{group.path.name}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(group.path, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)


def _reserve_attempt(spec: GroupSpec, attempt: int) -> tuple[int, str | None]:
    """The first attempt number from ``attempt`` on whose ``<run_dir>/logs/attempt-<N>/`` does not
    exist yet, and that directory, created here so no later attempt overwrites its logs."""
    run_dir = _local_path(spec.training.run_dir) if spec.training is not None else None
    if run_dir is None:
        return attempt, None
    while True:
        target = run_dir.resolve() / "logs" / f"attempt-{attempt}"
        try:
            target.mkdir(parents=True)
            return attempt, str(target)
        except FileExistsError:
            attempt += 1


def _temporary_parents(saved: dict[str, Any] | None) -> list[str]:
    """Where the supervisor of the group ``saved`` made its tasks' temporary directories: the
    temporary directory of its environment, or the one a role's ``env`` names."""
    parents = [tempfile.gettempdir()]
    if saved is not None:
        spec = GroupSpec.from_dict(saved["spec"])
        parents += [task_environment(spec.pass_env).get("TMPDIR") or parents[0]]
        parents += [r.env["TMPDIR"] for r in spec.roles.values() if "TMPDIR" in r.env]
    return list(dict.fromkeys(parents))


def _check_inputs(spec: GroupSpec) -> None:
    """Refuse, before anything starts, a dataset that is not committed, a run directory that
    cannot be created, and remote storage that a network-isolated group could not reach."""
    if spec.training is None:
        return
    if spec.isolate_network:
        for what, uri in (("dataset", spec.training.dataset), ("run directory", spec.training.run_dir)):
            if _local_path(uri) is None:
                raise BackendError(
                    f"{what} {uri!r} is on remote storage, which a local group cannot reach from its private "
                    "network namespace; use a local path, or set isolate_network=False (its unauthenticated "
                    "gRPC ports then listen on every interface: firewall them)"
                )
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
