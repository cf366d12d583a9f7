"""Following one task's log as it is written, for the wait's own task log: the chief's by
default (``follow_logs="chief"``), or any task's (``"worker-1"``). Each read returns the whole
lines written since the last one; the cursor that says where it stopped is JSON, so a sensor
hands it to its trigger and nothing is logged twice or skipped."""

from __future__ import annotations

import re
from typing import Any

from airflow_tf.cluster import GroupStatus

from .base import Backend, BackendError, GroupRef

FOLLOW_CHIEF = "chief"
"""The lead trainer: the chief, or worker 0 when the group has no chief (it is the chief then)."""
LOG_CHUNK_BYTES = 1 << 20
"""At most this much of a log is read at once, so one read never holds a whole log in memory."""
DRAIN_READS = 64
"""Reads at the end of a wait to catch up with what the task wrote last (64 MiB at most)."""
_TASK = re.compile(r"^(chief|worker|ps|evaluator)-(0|[1-9][0-9]{0,5})$")


def check_follow_logs(value: Any, argument: str = "follow_logs") -> str | None:
    """``value`` when it names a task to follow (``chief``, or ``<role>-<index>`` such as
    ``worker-1``) or is None (follow none); else a ValueError naming ``argument``."""
    if value is None or value == FOLLOW_CHIEF or (isinstance(value, str) and _TASK.match(value)):
        return value
    raise ValueError(f"{argument}: expected 'chief' (the lead trainer), a task as <role>-<index> (e.g. 'worker-1', "
                     f"'ps-0'), or None to follow no log; got {value!r}")


class LogFollower:
    """Reads the new lines of one task's log each time it is asked (see the module's doc).

    :param follow: what :func:`check_follow_logs` accepts, but not None.
    :param cursor: where an earlier follower of the same wait stopped (its :meth:`state`)."""

    def __init__(self, backend: Backend, ref: GroupRef, follow: str, cursor: dict[str, Any] | None = None) -> None:
        self.backend, self.ref = backend, ref
        self.follow = check_follow_logs(follow) or FOLLOW_CHIEF
        self.cursor: dict[str, Any] = dict(cursor or {})

    def state(self) -> dict[str, Any]:
        return dict(self.cursor)

    def task(self, status: GroupStatus) -> tuple[str, int] | None:
        """The (role, index) followed in this group; None while the group lists no task yet.
        A task the group does not have is a ValueError that lists the ones it has."""
        if not status.tasks:
            return None
        if self.follow == FOLLOW_CHIEF:
            roles = {t.role for t in status.tasks}
            return ("chief", 0) if "chief" in roles else ("worker", 0)
        role, _, index = self.follow.rpartition("-")
        if status.task(role, int(index)) is None:
            names = ", ".join(f"{t.role}-{t.index}" for t in status.tasks)
            raise ValueError(f"follow_logs={self.follow!r}: group {self.ref.name} has no such task; its tasks are "
                             f"{names} (or pass 'chief', or None to follow no log)")
        return role, int(index)

    def read(self, status: GroupStatus, *, drain: bool = False) -> tuple[str, list[str]]:
        """The followed task's name and its lines written since the last read (all that is
        there with ``drain``, up to :data:`DRAIN_READS` chunks)."""
        task = self.task(status)
        if task is None:
            return "", []
        role, index = task
        name = f"{self.ref.name}-{role}-{index}"
        lines: list[str] = []
        for _ in range(DRAIN_READS if drain else 1):
            try:
                text, self.cursor = self.backend.log_since(self.ref, role, index, self.cursor, LOG_CHUNK_BYTES)
            except BackendError as err:  # the log is a view of the training, never a reason to fail it
                lines.append(f"(log not read this time: {err})")
                break
            lines += text.splitlines()
            if not text:
                break
        return name, lines
