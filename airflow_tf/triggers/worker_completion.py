"""Deferrable wait for a training group: runs on the triggerer, frees the worker slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_tf.backends import GroupRef, backend_for
from airflow_tf.backends.wait import completion_event, waiting_message


class WorkerCompletionTrigger(BaseTrigger):
    """Fires once the group's completion rule holds, or it fails.

    It only reads the group's state, so running it twice (triggerer failover) is harmless;
    it never deletes anything: teardown is the teardown task's job.

    :param group: the group reference (a :class:`~airflow_tf.backends.GroupRef` dict).
    :param success_policy: ``AllWorkers`` or ``ChiefOrWorker0``; default the group's.
    :param log_tail_lines: lines of the failed task's log carried in the event.
    :param log_every_seconds: seconds between progress lines in the task log.
    """

    def __init__(self, group: dict[str, Any], success_policy: str | None = None,
                 log_tail_lines: int = 30, log_every_seconds: float = 10.0) -> None:
        super().__init__()
        self.group = GroupRef.coerce(group).to_dict()
        self.success_policy = success_policy or self.group.get("success_policy", "AllWorkers")
        self.log_tail_lines = log_tail_lines
        self.log_every_seconds = log_every_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "group": self.group,
                "success_policy": self.success_policy,
                "log_tail_lines": self.log_tail_lines,
                "log_every_seconds": self.log_every_seconds,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        ref = GroupRef.coerce(self.group)
        backend = backend_for(ref)
        loop = asyncio.get_running_loop()
        last_log = 0.0
        async for status in backend.watch(ref):
            event = await asyncio.to_thread(completion_event, backend, ref, status, self.success_policy,
                                            self.log_tail_lines)
            if event is not None:
                yield TriggerEvent(event)
                return
            if loop.time() - last_log >= self.log_every_seconds:
                last_log = loop.time()
                self.log.info("group %s: %s", ref.name, waiting_message(status, self.success_policy))
