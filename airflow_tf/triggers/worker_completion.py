"""Deferrable wait for a training group: runs on the triggerer, frees the worker slot."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_tf.backends import GroupRef, backend_for
from airflow_tf.backends.wait import completion_event, timeout_event, waiting_message


class WorkerCompletionTrigger(BaseTrigger):
    """Fires once the group's completion rule holds, or it fails.

    It only reads the group's state, so running it twice (triggerer failover) is harmless;
    it never deletes anything: teardown is the teardown task's job.

    :param group: the group reference (a :class:`~airflow_tf.backends.GroupRef` dict).
    :param success_policy: ``AllWorkers`` or ``ChiefOrWorker0``; default the group's.
    :param log_tail_lines: lines of the failed task's log carried in the event.
    :param log_every_seconds: seconds between progress lines in the task log.
    :param deadline: when the wait ends unfinished (Unix time; None: never), with a ``timeout``
        event that says what the group still waits for (a queue that never admits it, say).
    :param deadline_label: what set the deadline, for that event's reason (``the sensor's timeout
        (600 s)``).
    """

    def __init__(self, group: dict[str, Any], success_policy: str | None = None,
                 log_tail_lines: int = 30, log_every_seconds: float = 10.0, *, deadline: float | None = None,
                 deadline_label: str = "its deadline") -> None:
        super().__init__()
        self.group = GroupRef.coerce(group).to_dict()
        self.success_policy = success_policy or self.group.get("success_policy", "AllWorkers")
        self.log_tail_lines = log_tail_lines
        self.log_every_seconds = log_every_seconds
        self.deadline = deadline
        self.deadline_label = deadline_label

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "group": self.group,
                "success_policy": self.success_policy,
                "log_tail_lines": self.log_tail_lines,
                "log_every_seconds": self.log_every_seconds,
                "deadline": self.deadline,
                "deadline_label": self.deadline_label,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        ref = GroupRef.coerce(self.group)
        backend = backend_for(ref)
        loop = asyncio.get_running_loop()
        last_log = 0.0
        # Wall-clock time: the deadline was set by the sensor, maybe on another machine.
        seconds_left = None if self.deadline is None else max(0.0, self.deadline - time.time())
        status = None
        async for status in backend.watch(ref, timeout=seconds_left):
            event = await asyncio.to_thread(completion_event, backend, ref, status, self.success_policy,
                                            self.log_tail_lines)
            if event is not None:
                yield TriggerEvent(event)
                return
            if loop.time() - last_log >= self.log_every_seconds:
                last_log = loop.time()
                self.log.info("group %s: %s", ref.name, waiting_message(status, self.success_policy))
        if self.deadline is not None:
            if status is None:
                status = await asyncio.to_thread(backend.status, ref)
            yield TriggerEvent(timeout_event(ref, status, self.success_policy, self.deadline_label))
