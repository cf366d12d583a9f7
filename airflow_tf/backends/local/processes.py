"""Local processes of a group: telling a live process from a reused pid, signalling and stopping
them, their CPU time, free loopback ports, the minimal environment they start with, and the
supervisor's record of each task and its current process (:class:`TaskProcess`)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from airflow_tf.cluster import Phase, TaskStatus
from airflow_tf.cluster.spec import LAUNCH_FAILED

STOP_GRACE = 1.0
"""Seconds between SIGTERM and SIGKILL when stopping a task."""
KILL_WAIT = 5.0
"""Seconds a SIGKILLed process is given to be gone before a stop returns anyway."""
PASSED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH",
              "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "KERAS_HOME", "KERAS_BACKEND")
PASSED_ENV_PREFIXES = ("LC_", "TF_")
"""What every task gets from the launcher's environment: what TensorFlow and the runtime need."""
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


class ChildProcess(Protocol):
    """A task's process as the supervisor handles it: a :class:`subprocess.Popen`, or the handle
    of a task its group's fork server forked."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...

    def send_signal(self, sig: int) -> None: ...


@dataclass
class TaskProcess:
    """The supervisor's record of one task (role, index) and its current process."""

    role: str
    index: int
    name: str
    restart_policy: str
    port: int = 0
    phase: Phase = Phase.PENDING
    restarts: int = 0
    failures: int = 0
    """Restarts charged to this task's ``backoff_limit``: its own failures, not the group
    restarts another task's (a parameter server's) failure caused."""
    exit_code: int | None = None
    reason: str | None = None
    code: str | None = None
    proc: ChildProcess | None = None
    start_time: int | None = None
    deleted: bool = False
    last_progress: float = 0.0
    """Monotonic time of the task's last sign of progress (its start, a new global step, CPU time)."""
    progress_mark: Any = None
    """What progress is measured against: the chief's global step, else CPU time."""
    start_step: int | None = None
    stepping: bool = False
    """The chief reported a step since it started (before that, starting up, it counts CPU time)."""
    stalled: bool = False
    answered: bool = False
    """Its server answered a health question since it started (before that it is starting up)."""
    unanswered: int = 0
    """Health questions in a row it left unanswered."""
    stuck: str | None = None
    """Why the supervisor killed it as stuck (it stopped answering its health question)."""
    started: float = 0.0
    """Monotonic time its process started."""
    start_ticks: int | None = None
    """Its CPU time at the last question it left unanswered before its first answer."""
    temporary: str | None = None
    """The temporary directory of its current process, removed when that process ends."""

    def status(self) -> TaskStatus:
        return TaskStatus(self.role, self.index, self.name, self.phase, self.restarts, self.exit_code, self.reason,
                          self.code)

    @property
    def terminal(self) -> bool:
        return self.proc is None and self.phase in (Phase.SUCCEEDED, Phase.FAILED)


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


def task_environment(pass_env: Iterable[str] = (), environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a group's supervisor and tasks: ``PASSED_ENV``, ``LC_*`` and ``TF_*``
    (TensorFlow's settings), the names in ``pass_env``, and a ``PYTHONPATH`` that finds this
    package. Never the rest: the launcher's ``AIRFLOW__*`` settings, connections, variables,
    database URLs and secrets stay with the launcher."""
    source: Mapping[str, str] = os.environ if environ is None else environ
    env = {k: v for k, v in source.items()
           if (k in PASSED_ENV or k.startswith(PASSED_ENV_PREFIXES)) and k != "TF_CONFIG"}
    env.update({k: source[k] for k in pass_env if k in source})
    root = str(Path(__file__).resolve().parents[2])
    if not root.startswith(sys.prefix) and root not in env.get("PYTHONPATH", "").split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), root) if p)
    return env


def signal_process(pid: int, start_time: int | None, signum: int, group: bool = False) -> None:
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
    """SIGTERM each (pid, start time) and its process group, SIGKILL what is left after ``grace``;
    returns once they are gone (or ``KILL_WAIT`` after the SIGKILL)."""
    procs = [p for p in procs if is_running(*p)]
    for pid, start in procs:
        signal_process(pid, start, signal.SIGTERM, group=True)
    wait_gone(procs, grace)
    for pid, start in procs:
        signal_process(pid, start, signal.SIGKILL, group=True)
    wait_gone(procs, KILL_WAIT)


def wait_gone(procs: list[tuple[int, int | None]], timeout: float) -> bool:
    """Wait up to ``timeout`` for every (pid, start time) to be gone; True when they are. A killed
    process takes a moment to exit (a ps unmaps its tables): a teardown returns after that."""
    deadline = time.monotonic() + timeout
    while (left := any(is_running(*p) for p in procs)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not left


def marked_processes(marks: Mapping[str, str]) -> list[tuple[int, int | None]]:
    """(pid, start time) of every live process, this one excepted, whose environment in ``/proc``
    holds each ``name=value`` of ``marks``: what a local group's supervisor starts, and whatever
    those start, carries the group's name and state directory there (a task the fork server
    forked shows the server's, which carries them too). Others' processes are not readable."""
    wanted = {f"{name}={value}".encode() for name, value in marks.items()}
    found: list[tuple[int, int | None]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = set(f.read().split(b"\0"))
        except OSError:  # gone, or not ours
            continue
        if wanted <= environ and (start := process_start_time(int(entry))) is not None:
            found.append((int(entry), start))
    return found


def describe_process(pid: int) -> str:
    """``pid``'s state and command line (its title), as ps shows them, for an error message."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    return f"state {state}: {command[:200]}"


def cpu_ticks(pid: int) -> int | None:
    """User + system CPU time of ``pid`` in clock ticks (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports nobody listens on right now (held together so none repeats)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def kill_group(proc: ChildProcess, signum: int) -> None:
    """Signal the task and anything it started (each task leads its own process group)."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):  # it has exited already
            proc.send_signal(signum)


def die_with_parent(parent: int, unblock: set[signal.Signals]):
    """A ``preexec_fn`` for a child of the single-threaded ``parent`` (PR_SET_PDEATHSIG can only be
    set in the child): it dies when ``parent`` dies, even by SIGKILL, and gets back the signals
    ``parent`` blocks for itself."""

    def setup() -> None:
        # Runs in the forked child before exec.
        if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(LAUNCH_FAILED)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, unblock)

    return setup


TEMPORARY_PREFIX = "airflow-tf-task-"


def temporary_directory(parent: str | None) -> str | None:
    """A new directory for one task's temporary files (in ``parent``, else the default one), or
    None where none can be made."""
    try:
        return tempfile.mkdtemp(prefix=TEMPORARY_PREFIX, dir=parent)
    except OSError:
        return None


def remove_temporary_directory(path: str | None, parents: Iterable[str] | None = None) -> None:
    """Remove a task's temporary directory. A path read back from a state file also names its
    allowed ``parents``: one not named as a task's, or elsewhere, is left alone."""
    if not path or not os.path.basename(path.rstrip("/")).startswith(TEMPORARY_PREFIX):
        return
    if parents is not None:
        real = os.path.realpath(path)
        if os.path.dirname(real) not in {os.path.realpath(p) for p in parents} or os.path.islink(path):
            return
    shutil.rmtree(path, ignore_errors=True)
