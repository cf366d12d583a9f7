"""The task's log lines: every runtime module logs through here (a leaf: it imports nothing of
the runtime, so any module may use it)."""

from __future__ import annotations

import sys
from datetime import datetime, UTC


def log(message: str) -> None:
    """One line of the task's log, flushed at once (the log is read while the task runs). On
    stdout: Airflow shows a task's stderr as errors; ``airflow-tf``, whose stdout is its result,
    moves these lines to stderr while a command runs."""
    stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    # One write with its newline: print() writes the newline separately, and on an unbuffered
    # stdout TensorFlow's C++ logging (stderr, same file) could land in between.
    sys.stdout.write(f"{stamp} {message}\n")
    sys.stdout.flush()


def log_exit(result: dict) -> int:
    """The task's last line, ``airflow-tf task exit key=value ...`` (what the backends read); 0."""
    log("airflow-tf task exit " + " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in result.items()))
    return 0
