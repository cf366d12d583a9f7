"""Counting the processes of local training groups, for the tests' no-orphan checks."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def group_processes_of(state_dir: Path) -> list[int]:
    """Pids of live processes started for groups in ``state_dir`` (supervisors and tasks;
    the local backend gives them ``AIRFLOW_TF_STATE_DIR`` in their environment)."""
    marker = f"AIRFLOW_TF_STATE_DIR={Path(state_dir).resolve()}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in environ and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def kill_leftovers(state_dir: Path, grace: float = 3.0) -> list[int]:
    """Pids still running after ``grace`` seconds (a supervisor may take a moment to exit
    after teardown); they are killed so one failing test does not leak into the next."""
    deadline = time.monotonic() + grace
    while (left := group_processes_of(state_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
