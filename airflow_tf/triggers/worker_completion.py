"""Deferrable wait for a training group: runs on the triggerer, frees the worker slot."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_tf.backends import GroupRef, backend_for
from airflow_tf.cluster import evaluate
from airflow_tf.cluster.progress import describe


def completion_event(ref: GroupRef, status, success_policy: str, log_tail: str = "") -> dict[str, Any] | None:
    """The event payload once the group is done, else None. Shared by poke mode and the
    trigger so both decide and report the same way."""
    outcome = evaluate(status, success_policy)
    if not outcome.done:
        return None
    failed = outcome.failed_task
    return {
        "status": "success" if outcome.succeeded else "failed",
        "reason": outcome.reason,
        "group": ref.to_dict(),
        "counts": status.counts(),
        "progress": status.progress,
        "failed_task": None if failed is None else {"role": failed.role, "index": failed.index, "name": failed.name},
        "log_tail": log_tail,
    }


def waiting_message(status, success_policy: str) -> str:
    """``workers done 1/2; global step 120/1000 (12.0%), 5300 examples/s, ETA 8s``."""
    return f"{evaluate(status, success_policy).reason}; {describe(status.progress)}"


class WorkerCompletionTrigger(BaseTrigger):
    """Fires once the group's completion rule holds, or it fails.

    It only reads the group's state, so running it twice (triggerer failover) is harmless;
    it never deletes anything: teardown is the teardown task's job."""

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
            outcome = evaluate(status, self.success_policy)
            if outcome.done:
                tail = ""
                if outcome.failed_task is not None:
                    failed = outcome.failed_task
                    tail = await asyncio.to_thread(backend.logs, ref, failed.role, failed.index, self.log_tail_lines)
                yield TriggerEvent(completion_event(ref, status, self.success_policy, tail))
                return
            if loop.time() - last_log >= self.log_every_seconds:
                last_log = loop.time()
                self.log.info("group %s: %s", ref.name, waiting_message(status, self.success_policy))
