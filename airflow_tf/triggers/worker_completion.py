"""Deferrable wait for a training group: runs on the triggerer, frees the worker slot."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_tf.backends import GroupRef, backend_for
from airflow_tf.backends.follow import LogFollower, check_follow_logs
from airflow_tf.backends.wait import completion_event, timeout_event, waiting_message
from airflow_tf.cluster.spec import DEFAULT_SUCCESS_POLICY
from airflow_tf.metrics import TrainingMetrics


class WorkerCompletionTrigger(BaseTrigger):
    """Fires once the group's completion rule holds, or it fails.

    It only reads the group's state, so running it twice (triggerer failover) is harmless;
    it never deletes anything: teardown is the teardown task's job.

    Its event is :func:`airflow_tf.backends.wait.completion_event`'s payload (``status``
    ``"success"`` or ``"failed"``, ``reason``, ``reason_code``: an
    :class:`~airflow_tf.cluster.OutcomeCode` value, ``group``, ``counts``, ``progress``,
    ``failed_task``, ``log_tail``, ``replacements``), or once ``deadline`` passes
    ``{"status": "timeout", "reason", "group", "replacements"}``.

    :param group: the group reference (a :class:`~airflow_tf.backends.GroupRef` dict).
    :param success_policy: ``AllWorkers`` or ``ChiefOrWorker0``; default the group's.
    :param log_tail_lines: lines of the failed task's log carried in the event.
    :param log_every_seconds: seconds between progress lines in the task log.
    :param deadline: when the wait ends unfinished (Unix time; None: never), with a ``timeout``
        event that says what the group still waits for (a queue that never admits it, say).
    :param deadline_label: what set the deadline, for that event's reason (``the sensor's timeout
        (600 s)``).
    :param follow_logs: the task whose new log lines this trigger logs every ``logging_interval``
        seconds (the triggerer puts them in the waiting task's log), and all that is left of them
        before it fires; None: none. See :class:`~airflow_tf.sensors.WorkerCompletionSensor`.
    :param log_cursor: where the sensor stopped reading that log.
    :param metrics: what the sensor measured for the training's metrics
        (:meth:`airflow_tf.metrics.TrainingMetrics.state`), and ``metric_tags`` their tags;
        the trigger sends them at each status it reads.
    """

    def __init__(self, group: dict[str, Any], success_policy: str | None = None,
                 log_tail_lines: int = 30, log_every_seconds: float = 10.0, *, deadline: float | None = None,
                 deadline_label: str = "its deadline", follow_logs: str | None = None,
                 logging_interval: float = 5.0, log_cursor: dict[str, Any] | None = None,
                 metrics: dict[str, Any] | None = None, metric_tags: dict[str, str] | None = None) -> None:
        super().__init__()
        self.group = GroupRef.coerce(group).to_dict()
        self.success_policy = success_policy or self.group.get("success_policy", DEFAULT_SUCCESS_POLICY)
        self.log_tail_lines = log_tail_lines
        self.log_every_seconds = log_every_seconds
        self.deadline = deadline
        self.deadline_label = deadline_label
        self.follow_logs = check_follow_logs(follow_logs)
        self.logging_interval = logging_interval
        self.log_cursor = log_cursor
        self.metrics = metrics
        self.metric_tags = metric_tags

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
                "follow_logs": self.follow_logs,
                "logging_interval": self.logging_interval,
                "log_cursor": self.log_cursor,
                "metrics": self.metrics,
                "metric_tags": self.metric_tags,
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
        metrics = TrainingMetrics(self.metric_tags or {"group": ref.name}, state=self.metrics)
        follower = None if self.follow_logs is None else LogFollower(backend, ref, self.follow_logs, self.log_cursor)
        latest: dict[str, Any] = {}
        following = None if follower is None else asyncio.create_task(self._follow(follower, latest))
        try:
            async for status in backend.watch(ref, timeout=seconds_left):
                latest["status"] = status
                await asyncio.to_thread(metrics.observe, status)
                event = await asyncio.to_thread(completion_event, backend, ref, status, self.success_policy,
                                                self.log_tail_lines)
                if event is not None:
                    if follower is not None:
                        await self._stop(following)
                        await self._log_lines(follower, status, drain=True)
                    yield TriggerEvent(event)
                    return
                if loop.time() - last_log >= self.log_every_seconds:
                    last_log = loop.time()
                    self.log.info("group %s: %s", ref.name, waiting_message(status, self.success_policy))
        finally:
            await self._stop(following)
        if self.deadline is not None:
            if status is None:
                status = await asyncio.to_thread(backend.status, ref)
            yield TriggerEvent(timeout_event(ref, status, self.success_policy, self.deadline_label))

    async def _follow(self, follower: LogFollower, latest: dict[str, Any]) -> None:
        """Every ``logging_interval`` seconds, the followed task's new lines into the log."""
        while True:
            if "status" in latest:
                await self._log_lines(follower, latest["status"])
            await asyncio.sleep(self.logging_interval)

    async def _log_lines(self, follower: LogFollower, status: Any, *, drain: bool = False) -> None:
        name, lines = await asyncio.to_thread(follower.read, status, drain=drain)
        for line in lines:
            self.log.info("[%s] %s", name, line)

    @staticmethod
    async def _stop(task: asyncio.Task | None) -> None:
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        elif task is not None and task.done() and not task.cancelled():
            task.result()  # a follow that failed (a task the group does not have) fails the wait
