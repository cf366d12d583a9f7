"""WorkerCompletionSensor: waits until the group's workers are done, counting per role."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.configuration import conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.providers.common.compat.sdk import AirflowException, AirflowSensorTimeout, AirflowTaskTimeout

from airflow_tf.backends import GroupRef, backend_for
from airflow_tf.backends.follow import LogFollower, check_follow_logs
from airflow_tf.backends.wait import (
    completion_event,
    group_failure_message,
    still_waiting_message,
    waiting_message,
)
from airflow_tf.cluster import GroupStatus, OutcomeCode
from airflow_tf.cluster.training import parse_bool
from airflow_tf.metrics import TrainingMetrics, task_tags
from airflow_tf.triggers.worker_completion import WorkerCompletionTrigger


FAILURE_XCOM_KEY = "failure_reason"
"""Where a failed wait records why the group failed (read by the Training view)."""
FAILURE_CODE_XCOM_KEY = "failure_code"
"""Where a wait the group failed records the failure's :class:`~airflow_tf.cluster.OutcomeCode`
value, for code to branch on (the reason is words for people)."""
TRIGGER_TIMEOUT_SLACK_SECONDS = 60.0
"""How long after the trigger's own deadline Airflow's deferral timeout ends the wait: the trigger
fails it first, saying what the group waits for; Airflow's timeout is the net if no triggerer runs."""
REPLACEMENTS_XCOM_KEY = "replacements"
"""Where the wait records each task restarted for a cause of its own and why (read by the Training
view): as it changes in poke mode, and when the wait ends in both modes."""


class TrainingGroupFailed(AirflowException):
    """A task of the group failed beyond its restart budget, or the group's deadline passed."""


class WorkerCompletionSensor(BaseSensorOperator):
    """Waits for a training group launched by :class:`LaunchTFClusterOperator`.

    Succeeds when the completion rule holds (all workers succeeded by default; ``success_policy
    = "ChiefOrWorker0"`` for the chief alone). Fails fast, naming the task and the reason and
    quoting its last log lines, when a task fails beyond its restart budget or the group's
    deadline passes. ``deferrable=True`` waits on the triggerer instead of a worker slot.

    Killed (e.g. its DAG run marked failed), it tears the group down. Its ``timeout`` (seconds)
    and its ``execution_timeout`` bound the wait, deferred too: a wait that reaches either fails
    with what the group still waits for (e.g. ``waiting: JobSet G is suspended: waiting for the
    queue q to admit the whole group (...)``), and the training counts as failed.

    :param group: the launch task's XCom (``launch.output``) or a group reference dict.
    :param success_policy: ``AllWorkers`` or ``ChiefOrWorker0``; default the launch's.
    :param deferrable: wait on the triggerer; default ``[operators] default_deferrable``.
    :param log_tail_lines: lines of the failed task's log quoted in the failure.
    :param poke_interval: seconds between status reads (poke mode).
    :param follow_logs: the task whose log this task's log follows as it is written: ``chief``
        (default: the lead trainer), a task as ``<role>-<index>`` (``worker-1``), or None for
        none. Poke mode reads it at each poke; deferrable, the trigger reads it every
        ``logging_interval`` seconds and its lines reach this task's log through the triggerer.
    :param logging_interval: seconds between reads of the followed log while deferred.

    Each status read also sends the training's metrics through Airflow's ``Stats``
    (docs/reference/metrics.md).

    Its XCom (return value) once the group succeeded: ``{"reason", "reason_code", "counts",
    "progress"}``: ``reason`` in words for people, ``reason_code`` an
    :class:`~airflow_tf.cluster.OutcomeCode` value (``"Succeeded"``), ``counts`` per role the
    tasks per phase, ``progress`` the last training progress. A failed wait records ``reason``
    under the XCom key ``failure_reason`` and, when the group failed (not a timeout), its code
    (``"TaskFailed"``, ``"OutOfMemory"``, ``"DeadlineExceeded"``, ...) under ``failure_code``.
    """

    template_fields: Sequence[str] = ("group", "success_policy")
    ui_color = "#ff9f40"

    def __init__(self, *, group: Any, success_policy: str | None = None,
                 deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 log_tail_lines: int = 30, poke_interval: float = 5.0, follow_logs: str | None = "chief",
                 logging_interval: float = 5.0, **kwargs: Any) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.follow_logs = check_follow_logs(follow_logs)
        if isinstance(logging_interval, bool) or not isinstance(logging_interval, (int, float)) \
                or not 0 < logging_interval <= 3600:
            raise ValueError(f"logging_interval: expected seconds between reads of the followed log (more than 0, "
                             f"at most 3600), got {logging_interval!r}")
        self.logging_interval = float(logging_interval)
        self._follower: LogFollower | None = None
        self._metrics: TrainingMetrics | None = None
        self.group = group
        self.success_policy = success_policy
        self.deferrable = parse_bool(deferrable, "deferrable")
        self.log_tail_lines = log_tail_lines
        self._recorded_replacements: list[str] | None = None
        self._last_waiting: str | None = None

    def _ref(self) -> GroupRef:
        return GroupRef.coerce(self.group)

    def _policy(self, ref: GroupRef) -> str:
        return self.success_policy or ref.success_policy

    def _check(self, context: Any) -> dict[str, Any] | None:
        ref = self._ref()
        backend = backend_for(ref)
        status = backend.status(ref)
        if self._metrics is None:
            self._metrics = TrainingMetrics(task_tags(context, group=ref.name))
        self._metrics.observe(status)
        event = completion_event(backend, ref, status, self._policy(ref), self.log_tail_lines)
        self._follow(backend, ref, status, drain=event is not None)
        if event is None:
            self._last_waiting = waiting_message(status, self._policy(ref))
            self.log.info("group %s: %s", ref.name, self._last_waiting)
            self._record_replacements(context, status.replacements())
        return event

    def _follow(self, backend: Any, ref: GroupRef, status: GroupStatus, *, drain: bool) -> None:
        """Copy the followed task's new log lines into this task's log."""
        if self.follow_logs is None:
            return
        if self._follower is None:
            self._follower = LogFollower(backend, ref, self.follow_logs)
        name, lines = self._follower.read(status, drain=drain)
        for line in lines:
            self.log.info("[%s] %s", name, line)

    def _record_replacements(self, context: Any, replacements: list[str]) -> None:
        """Push the replacements for the Training view when they differ from the last pushed."""
        if replacements and replacements != self._recorded_replacements:
            if ti := (context or {}).get("ti"):
                ti.xcom_push(key=REPLACEMENTS_XCOM_KEY, value=replacements)
            self._recorded_replacements = replacements

    @staticmethod
    def _record_failure(context: Any, reason: str, code: str | None = None) -> None:
        """The reason alone (no log tail) for the Training view, and its code when the group
        failed; the task log has the rest."""
        if ti := (context or {}).get("ti"):
            ti.xcom_push(key=FAILURE_XCOM_KEY, value=reason)
            if code is not None:
                ti.xcom_push(key=FAILURE_CODE_XCOM_KEY, value=code)

    def poke(self, context: Any) -> PokeReturnValue | bool:
        event = self._check(context)
        if event is None:
            return False
        return PokeReturnValue(is_done=True, xcom_value=self._finish(event, context))

    def _bounds(self) -> dict[str, tuple[float, str]]:
        """The wait's bounds in seconds, each with its words for a failure, by the argument that set it."""
        bounds = {}
        if self.timeout:
            bounds["timeout"] = (float(self.timeout), f"the sensor's timeout ({float(self.timeout):g} s)")
        if self.execution_timeout:
            seconds = self.execution_timeout.total_seconds()
            bounds["execution_timeout"] = (seconds, f"its execution_timeout ({seconds:g} s)")
        return bounds

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            try:
                return super().execute(context)
            except (AirflowSensorTimeout, AirflowTaskTimeout) as timed_out:
                if self._last_waiting is None:
                    raise
                which = "execution_timeout" if isinstance(timed_out, AirflowTaskTimeout) else "timeout"
                label = self._bounds().get(which, (0.0, f"its {which}"))[1]
                reason = still_waiting_message(self._ref().name, label, self._last_waiting)
                self._record_failure(context, reason)
                raise type(timed_out)(reason) from timed_out
        event = self._check(context)
        if event is not None:
            return self._finish(event, context)
        ref = self._ref()
        # Airflow 3 applies no execution_timeout to a deferred task, and its deferral timeout
        # fails it without a reason: the trigger ends the wait itself, at the tightest bound.
        bound = min(self._bounds().values(), default=None)
        self.defer(
            trigger=WorkerCompletionTrigger(group=ref.to_dict(), success_policy=self._policy(ref),
                                            log_tail_lines=self.log_tail_lines,
                                            follow_logs=self.follow_logs, logging_interval=self.logging_interval,
                                            log_cursor=self._follower.state() if self._follower else None,
                                            metrics=self._metrics.state() if self._metrics else None,
                                            metric_tags=self._metrics.tags if self._metrics else None,
                                            deadline=None if bound is None else time.time() + bound[0],
                                            deadline_label=bound[1] if bound else ""),
            method_name="execute_complete",
            timeout=None if bound is None else timedelta(seconds=bound[0] + TRIGGER_TIMEOUT_SLACK_SECONDS),
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        return self._finish(event, context)

    def _finish(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        self._record_replacements(context, event.get("replacements") or [])
        if event["status"] == "timeout":
            self._record_failure(context, event["reason"])
            raise AirflowSensorTimeout(event["reason"])
        if event["status"] != "success":
            failed = event["failed_task"]
            self._record_failure(context, event["reason"], event.get("reason_code"))
            raise TrainingGroupFailed(group_failure_message(
                event["group"]["name"], event["reason"], failed and failed["name"], event["log_tail"],
                self.log_tail_lines,
            ))
        self.log.info("group %s done: %s; per role: %s", event["group"]["name"], event["reason"], event["counts"])
        # An event from a trigger of an earlier version (deferred across an upgrade) has no code.
        return {"reason": event["reason"], "reason_code": event.get("reason_code", str(OutcomeCode.SUCCEEDED)),
                "counts": event["counts"], "progress": event["progress"]}

    def on_kill(self) -> None:
        """A killed wait leaves nothing running: the group it watches is torn down."""
        try:
            ref = self._ref()
        except ValueError:
            return
        deleted = backend_for(ref).teardown(ref)
        self.log.info("sensor killed: tore down group %s (%d task(s))", ref.name, len(deleted))
