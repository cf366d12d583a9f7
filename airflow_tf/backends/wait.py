"""Following a group to its end, for any backend: the blocking wait of ``airflow-tf run``
(deciding with :func:`airflow_tf.cluster.group_outcome`, like the Airflow sensor), the failure
report, and a run from launch to teardown."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_tf.cluster import GroupSpec, GroupStatus, Outcome, Phase, group_outcome
from airflow_tf.cluster.progress import describe as describe_progress
from airflow_tf.deprecation import deprecated
from airflow_tf.files import atomic_write_text

from .base import Backend, GroupRef


def wait_for_group(backend: Backend, ref: GroupRef, *, timeout: float | None = None, interval: float = 0.5,
                   success_policy: str | None = None,
                   on_status: Callable[[GroupStatus], None] | None = None) -> tuple[Outcome, GroupStatus]:
    """Poll ``backend.status`` until the completion rule holds or the group fails.

    Returns the outcome and the last status; when ``timeout`` seconds pass first, the
    outcome is not done (``outcome.done is False``) and the group is left as it is."""
    policy = success_policy or ref.success_policy
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        status = backend.status(ref)
        if on_status is not None:
            on_status(status)
        outcome = group_outcome(status, policy)
        if outcome.done or (deadline is not None and time.monotonic() >= deadline):
            return outcome, status
        time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))


def group_failure_message(group: str, reason: str, failed_task: str | None = None, log_tail: str = "",
                          tail_lines: int = 20) -> str:
    """``training group G failed: <reason>`` and, when one task is to blame, its last log lines:
    the message of a failed wait (the sensor's error, ``airflow-tf run``'s report)."""
    text = f"training group {group} failed: {reason}"
    lines = log_tail.rstrip().splitlines()[-tail_lines:]
    if failed_task and lines:
        text += f"\nlast {len(lines)} log lines of {failed_task}:\n" + "\n".join(f"    {line}" for line in lines)
    return text


def describe_failure(group: str, reason: str, failed_task: str | None = None, log_tail: str = "",
                     tail_lines: int = 20) -> str:
    """Deprecated: :func:`group_failure_message` (a task's own failure reason is
    :func:`airflow_tf.cluster.task_failure_reason`)."""
    deprecated("airflow_tf.backends.wait.describe_failure", "airflow_tf.backends.wait.group_failure_message")
    return group_failure_message(group, reason, failed_task, log_tail, tail_lines)


def failure_report(backend: Backend, ref: GroupRef, outcome: Outcome, tail_lines: int = 20) -> str:
    """The reason a group failed and, when one task is to blame, its last log lines."""
    failed = outcome.failed_task
    tail = backend.logs(ref, failed.role, failed.index, tail_lines) if failed is not None else ""
    return group_failure_message(ref.name, outcome.reason, failed.name if failed is not None else None, tail, tail_lines)


def completion_event(backend: Backend, ref: GroupRef, status: GroupStatus, success_policy: str,
                     tail_lines: int = 30) -> dict[str, Any] | None:
    """Once the group is done, what the sensor needs to finish (JSON, fit for a trigger
    event), None while it is still running. Poke mode and the trigger share it. Keys:

    - ``status``: ``"success"`` or ``"failed"``;
    - ``reason``: why, in words for people (they may change);
    - ``reason_code``: what the outcome is, an :class:`~airflow_tf.cluster.OutcomeCode` value
      (``"Succeeded"``, ``"TaskFailed"``, ``"OutOfMemory"``, ``"DeadlineExceeded"``, ...): branch on this;
    - ``group``: the group reference; ``counts``: per role, tasks per phase; ``progress``: the last
      training progress; ``failed_task``: the task to blame (role, index, name) or None;
      ``log_tail``: its last log lines; ``replacements``: each task restarted for a cause of its own."""
    outcome = group_outcome(status, success_policy)
    if not outcome.done:
        return None
    failed = outcome.failed_task
    return {
        "status": "success" if outcome.succeeded else "failed",
        "reason": outcome.reason,
        "reason_code": str(outcome.code),
        "group": ref.to_dict(),
        "counts": status.counts(),
        "progress": status.progress,
        "failed_task": None if failed is None else {"role": failed.role, "index": failed.index, "name": failed.name},
        "log_tail": "" if failed is None else backend.logs(ref, failed.role, failed.index, tail_lines),
        "replacements": status.replacements(),
    }


def waiting_message(status: GroupStatus, success_policy: str) -> str:
    """``workers done 1/2; global step 120/1000 (12.0%), 5300 examples/s, ETA 8s``, and each task
    restarted so far and why (``; replaced: G-ps-0 restarted 1 time(s), last: stuck: ...``); when
    every task waits for one same reason (a queue holding the whole group), that reason
    (``; waiting: JobSet G is suspended: waiting for the queue q to admit the whole group (...)``)."""
    replaced = status.replacements()
    reasons = {t.reason for t in status.tasks}
    waiting = next(iter(reasons)) if len(reasons) == 1 and status.tasks and all(
        t.phase is Phase.PENDING for t in status.tasks) else None
    return (f"{group_outcome(status, success_policy).reason}; {describe_progress(status.progress)}"
            + (f"; waiting: {waiting}" if waiting else "")
            + (f"; replaced: {'; '.join(replaced)}" if replaced else ""))


def still_waiting_message(group: str, bound: str, waiting: str) -> str:
    """Why a wait that reached its bound failed: the bound, then the group's last waiting message,
    which carries the reason it waits (a queue that never admits it, say), so the failure says
    what to fix rather than only that time ran out."""
    return f"training group {group} did not finish within {bound}: {waiting}"


def timeout_event(ref: GroupRef, status: GroupStatus, success_policy: str, bound: str) -> dict[str, Any]:
    """The trigger's event when the wait's bound passes first (JSON, like :func:`completion_event`)."""
    return {
        "status": "timeout",
        "reason": still_waiting_message(ref.name, bound, waiting_message(status, success_policy)),
        "group": ref.to_dict(),
        "replacements": status.replacements(),
    }


def kept_log(data: bytes, limit: int | None, dropped: int = 0) -> bytes:
    """A log as kept in the run directory: at most ``limit`` bytes (None: all), its last whole
    lines. ``data`` is the end of the log, ``dropped`` the bytes before it not read; when any are
    left out, a first line says how many and which setting bounds it."""
    if limit is None or (not dropped and len(data) <= limit):
        return data
    header = ("[airflow-tf: the first {} bytes of this log are left out: [airflow_tf] kept_log_bytes is "
              f"{limit}]\n")
    room = max(0, limit - len(header.format(" " * 20)))
    if len(data) > room:
        dropped, data = dropped + len(data) - room, data[-room:] if room else b""
    cut = data.find(b"\n") + 1  # the first line was cut into
    return header.format(dropped + cut).encode() + data[cut:]


def keep_logs(backend: Backend, ref: GroupRef, tasks: Iterable[tuple[str, int]], directory: str | os.PathLike,
              limit: int | None = None) -> Path:
    """Copy each task's log to ``<directory>/<group>-<role>-<index>.log`` (before the group is
    deleted), its end only when it is longer than ``limit`` bytes (:func:`kept_log`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for role, index in tasks:
        text = backend.logs(ref, role, index)
        if text:
            data = kept_log(text.encode("utf-8", "replace"), limit)
            atomic_write_text(directory / f"{ref.name}-{role}-{index}.log", data.decode("utf-8", "replace"),
                              fsync=False)
    return directory


def save_logs(backend: Backend, ref: GroupRef, spec: GroupSpec, directory: str | os.PathLike) -> Path:
    """Copy every task's log to ``<directory>/<task name>.log`` (before the group is deleted)."""
    return keep_logs(backend, ref, spec.tasks(), directory)


@dataclass
class RunResult:
    ref: GroupRef
    outcome: Outcome
    status: GroupStatus
    report: str | None
    """The failure report (reason and the failed task's last log lines); None on success."""


def run_group(backend: Backend, spec: GroupSpec, *, logs_dir: str | os.PathLike | None = None,
              on_launched: Callable[[GroupRef], None] | None = None,
              on_status: Callable[[GroupStatus], None] | None = None,
              tail_lines: int = 20, interval: float = 0.2, **launch_options: Any) -> RunResult:
    """Launch ``spec``, wait for its workers, then tear everything down, on every path.

    The parameter servers (and any evaluator) are stopped as soon as training is done; the
    task logs are copied to ``logs_dir`` and the group is deleted, even when the wait is
    interrupted (KeyboardInterrupt, or an exception raised by a signal handler)."""
    ref = backend.launch(spec, **launch_options)
    try:
        if on_launched is not None:
            on_launched(ref)
        outcome, status = wait_for_group(backend, ref, interval=interval, on_status=on_status)
        report = None
        if outcome.succeeded:
            backend.teardown(ref, [role for role in spec.roles if role not in spec.training_roles()])
        else:
            report = failure_report(backend, ref, outcome, tail_lines)
        return RunResult(ref, outcome, status, report)
    finally:
        try:
            if logs_dir is not None:
                save_logs(backend, ref, spec, logs_dir)
        finally:
            backend.teardown(ref)
