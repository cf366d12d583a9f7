"""Group status as every backend reports it, and the rules that say when a group is done."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from airflow_tf.deprecation import deprecated

ALL_WORKERS = "AllWorkers"
"""Success policy: the group succeeds when every worker (and the chief, if any) has."""
CHIEF_OR_WORKER0 = "ChiefOrWorker0"
"""Success policy: the group succeeds when its lead trainer has, the chief or else worker 0."""
SUCCESS_POLICIES = (ALL_WORKERS, CHIEF_OR_WORKER0)


GROUP_RESTARTED = "group restarted: "
"""How the reason of a task restarted with its group (after its ps was lost) begins."""


class ReasonCode(StrEnum):
    """What kind of reason a task's ``reason`` is, for code to branch on (the reason itself is
    words for people, and may change)."""

    OOM_KILLED = "OOMKilled"
    """Killed for running out of memory: the same limit would only fail again."""
    EVICTED = "Evicted"
    """Its node or the cluster took the pod back (pressure, drain): not the task's fault."""
    PREEMPTED = "Preempted"
    """Disrupted to make room for other work: not the task's fault."""
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    GROUP_RESTARTED = "GroupRestarted"
    """Restarted because its group was (after a ps was lost): another task says why."""
    IMAGE_PULL = "ImagePull"
    """Its image cannot be pulled (or its name is not valid): waiting would not help."""
    CONFIG_MISSING = "ConfigMissing"
    """A Secret or ConfigMap its pod refers to is missing."""
    UNSCHEDULABLE = "Unschedulable"
    """No node could take it within its schedule timeout."""
    STUCK = "Stuck"
    """Killed after it stopped answering its health question."""
    NO_PROGRESS = "NoProgress"
    """Stopped by the watchdog after making no progress for ``progress_timeout``."""


class OutcomeCode(StrEnum):
    """What a group's :class:`Outcome` is, for code to branch on: ``Outcome.reason`` (and the
    sensor's ``reason``) is words for people and may change; the code is kept."""

    WAITING = "Waiting"
    """Not done: no training task reported yet."""
    RUNNING = "Running"
    """Not done: its training tasks are there (pending, running, some finished)."""
    SUCCEEDED = "Succeeded"
    """Done: the success policy holds."""
    TASK_FAILED = "TaskFailed"
    """A task failed beyond its restart budget (an exit code, a signal, a program error)."""
    OUT_OF_MEMORY = "OutOfMemory"
    """A task was killed for running out of memory (the same limit would only fail again)."""
    IMAGE_PULL = "ImagePull"
    """A task's image cannot be pulled, or its name is not valid."""
    CONFIG_MISSING = "ConfigMissing"
    """A Secret or ConfigMap a task's pod refers to is missing."""
    UNSCHEDULABLE = "Unschedulable"
    """A task's pod found no node within its schedule timeout."""
    EVICTED = "Evicted"
    """A task was evicted beyond its restart budget."""
    PREEMPTED = "Preempted"
    """A task was preempted beyond its restart budget."""
    STUCK = "Stuck"
    """A task stopped answering its health question, beyond its restart budget."""
    NO_PROGRESS = "NoProgress"
    """A task made no progress for ``progress_timeout``, beyond its restart budget."""
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    """The group (or a task's pod) ran past its active deadline."""
    LAUNCHER_EXITED = "LauncherExited"
    """The launching process exited before handing the group over (local backend)."""
    SUPERVISOR_LOST = "SupervisorLost"
    """The group's supervisor died, crashed, was signalled or never started (local backend)."""
    GROUP_NOT_FOUND = "GroupNotFound"
    """The group does not exist: never launched, or deleted."""
    GROUP_DELETED = "GroupDeleted"
    """Part of the group (a trainer's Job) was deleted outside airflow-tf."""
    GROUP_FAILED = "GroupFailed"
    """The group failed as a whole for another reason (its Job's or JobSet's own failure)."""


_TASK_FAILURE_CODES: dict[str, OutcomeCode] = {
    ReasonCode.OOM_KILLED: OutcomeCode.OUT_OF_MEMORY, ReasonCode.EVICTED: OutcomeCode.EVICTED,
    ReasonCode.PREEMPTED: OutcomeCode.PREEMPTED, ReasonCode.DEADLINE_EXCEEDED: OutcomeCode.DEADLINE_EXCEEDED,
    ReasonCode.IMAGE_PULL: OutcomeCode.IMAGE_PULL, ReasonCode.CONFIG_MISSING: OutcomeCode.CONFIG_MISSING,
    ReasonCode.UNSCHEDULABLE: OutcomeCode.UNSCHEDULABLE, ReasonCode.STUCK: OutcomeCode.STUCK,
    ReasonCode.NO_PROGRESS: OutcomeCode.NO_PROGRESS,
}
"""The group's outcome code when a task with this reason code failed it (any other: TASK_FAILED)."""



class Phase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    """Terminal: failed beyond its restart budget (or under a policy that does not retry)."""
    RESTARTING = "Restarting"


@dataclass
class TaskStatus:
    role: str
    index: int
    name: str
    phase: Phase
    restarts: int = 0
    exit_code: int | None = None
    reason: str | None = None
    """Why it failed or is not running: 'exit code 1', 'OOMKilled: ...', 'ImagePullBackOff: ...'."""
    code: str | None = None
    """The reason's kind when code acts on it (a :class:`ReasonCode`), else None."""

    def __post_init__(self) -> None:
        self.phase = Phase(self.phase)


@dataclass
class GroupStatus:
    name: str
    tasks: list[TaskStatus] = field(default_factory=list)
    failure: str | None = None
    """Set when the group as a whole failed (deadline passed, backoff limit reached, ...)."""
    failure_code: str | None = None
    """The kind of ``failure`` (an :class:`OutcomeCode`); None with a failure: GROUP_FAILED."""
    progress: dict[str, Any] | None = None
    """Latest training progress (global_step, target_step, examples_per_sec, loss) if known."""
    exists: bool = True

    def __post_init__(self) -> None:
        self.tasks = [t if isinstance(t, TaskStatus) else TaskStatus(**t) for t in self.tasks]

    def task(self, role: str, index: int) -> TaskStatus | None:
        return next((t for t in self.tasks if t.role == role and t.index == index), None)

    def role_tasks(self, role: str) -> list[TaskStatus]:
        return [t for t in self.tasks if t.role == role]

    def replacements(self) -> list[str]:
        """``<task> restarted N time(s), last: <why>`` for each task restarted for a cause of its
        own (a task restarted only because its group was, after a ps, is left out: the ps says why)."""
        return [f"{t.name} restarted {t.restarts} time(s), last: {t.reason}" for t in self.tasks
                if t.restarts and t.reason and t.code != ReasonCode.GROUP_RESTARTED]

    def counts(self) -> dict[str, dict[str, int]]:
        """Per role, how many tasks are in each phase: ``{"worker": {"Succeeded": 1, ...}}``."""
        result: dict[str, dict[str, int]] = {}
        for t in self.tasks:
            per_role = result.setdefault(t.role, {p.value: 0 for p in Phase})
            per_role[t.phase.value] += 1
        return result

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for t in data["tasks"]:
            t["phase"] = Phase(t["phase"]).value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroupStatus:
        return cls(**data)


@dataclass(frozen=True)
class Outcome:
    done: bool
    succeeded: bool
    reason: str
    """Why, in words for people (they may change: branch on ``code``)."""
    failed_task: TaskStatus | None = None
    code: OutcomeCode | None = None
    """What the outcome is (:class:`OutcomeCode`); :func:`group_outcome` always sets it."""


def _trainers(status: GroupStatus) -> list[TaskStatus]:
    return status.role_tasks("chief") + status.role_tasks("worker")


def group_outcome(status: GroupStatus, success_policy: str = ALL_WORKERS) -> Outcome:
    """Apply the completion rules to a status: is the group done, and did it succeed.

    - failed: the group failed as a whole, or any task failed beyond its restart budget;
    - AllWorkers: every worker (and the chief, if any) succeeded;
    - ChiefOrWorker0: the chief, or worker 0 when there is no chief, succeeded.
    Parameter servers never finish by themselves and are not counted."""
    failed = _failed(status)
    if failed is not None:
        return failed
    trainers = _trainers(status)
    if not trainers:
        return Outcome(False, False, "no training task reported yet", code=OutcomeCode.WAITING)
    succeeded = _succeeded(status, success_policy, trainers)
    if succeeded is not None:
        return succeeded
    done = sum(t.phase is Phase.SUCCEEDED for t in trainers)
    return Outcome(False, False, f"workers done {done}/{len(trainers)}", code=OutcomeCode.RUNNING)


def _failed(status: GroupStatus) -> Outcome | None:
    if not status.exists:
        return Outcome(True, False, f"training group {status.name!r} does not exist (never launched, or deleted)",
                       code=OutcomeCode.GROUP_NOT_FOUND)
    if status.failure:
        return Outcome(True, False, status.failure, code=OutcomeCode(status.failure_code or OutcomeCode.GROUP_FAILED))
    for t in status.tasks:
        if t.phase is Phase.FAILED:
            return Outcome(True, False, f"task {t.name} ({t.role} {t.index}) failed: {t.reason or 'unknown reason'}", t,
                           _TASK_FAILURE_CODES.get(t.code or "", OutcomeCode.TASK_FAILED))
    return None


def _succeeded(status: GroupStatus, success_policy: str, trainers: list[TaskStatus]) -> Outcome | None:
    if success_policy == CHIEF_OR_WORKER0:
        lead = status.task("chief", 0) or status.task("worker", 0)
        if lead is not None and lead.phase is Phase.SUCCEEDED:
            return Outcome(True, True, f"{lead.name} succeeded", code=OutcomeCode.SUCCEEDED)
    elif success_policy == ALL_WORKERS:
        if all(t.phase is Phase.SUCCEEDED for t in trainers):
            return Outcome(True, True, f"all {len(trainers)} training task(s) succeeded", code=OutcomeCode.SUCCEEDED)
    else:
        raise ValueError(f"unknown success policy {success_policy!r}")
    return None


def evaluate(status: GroupStatus, success_policy: str = ALL_WORKERS) -> Outcome:
    """Deprecated: :func:`group_outcome` (``evaluate`` now means only a model's evaluation)."""
    deprecated("airflow_tf.cluster.evaluate", "airflow_tf.cluster.group_outcome")
    return group_outcome(status, success_policy)
