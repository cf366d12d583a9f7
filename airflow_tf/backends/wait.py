"""Waiting for a group to finish, for any backend: the blocking loop of ``airflow-tf run``
(and of anything else that waits in-process), deciding with :func:`airflow_tf.cluster.evaluate`."""

from __future__ import annotations

import time
from typing import Callable

from airflow_tf.cluster import GroupStatus, Outcome, evaluate

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
        outcome = evaluate(status, policy)
        if outcome.done or (deadline is not None and time.monotonic() >= deadline):
            return outcome, status
        time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))


def failure_report(backend: Backend, ref: GroupRef, outcome: Outcome, tail_lines: int = 20) -> str:
    """The reason a group failed and, when one task is to blame, its last log lines."""
    text = f"training group {ref.name} failed: {outcome.reason}"
    failed = outcome.failed_task
    if failed is not None:
        tail = backend.logs(ref, failed.role, failed.index, tail_lines).rstrip()
        if tail:
            text += f"\nlast {tail_lines} log lines of {failed.name}:\n" + "\n".join(
                f"    {line}" for line in tail.splitlines()
            )
    return text
