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
    failed_task: TaskStatus | None = None


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
        return Outcome(False, False, "no training task reported yet")
    succeeded = _succeeded(status, success_policy, trainers)
    if succeeded is not None:
        return succeeded
    done = sum(t.phase is Phase.SUCCEEDED for t in trainers)
    return Outcome(False, False, f"workers done {done}/{len(trainers)}")


def _failed(status: GroupStatus) -> Outcome | None:
    if not status.exists:
        return Outcome(True, False, f"training group {status.name!r} does not exist (never launched, or deleted)")
    if status.failure:
        return Outcome(True, False, status.failure)
    for t in status.tasks:
        if t.phase is Phase.FAILED:
            return Outcome(True, False, f"task {t.name} ({t.role} {t.index}) failed: {t.reason or 'unknown reason'}", t)
    return None


def _succeeded(status: GroupStatus, success_policy: str, trainers: list[TaskStatus]) -> Outcome | None:
    if success_policy == CHIEF_OR_WORKER0:
        lead = status.task("chief", 0) or status.task("worker", 0)
        if lead is not None and lead.phase is Phase.SUCCEEDED:
            return Outcome(True, True, f"{lead.name} succeeded")
    elif success_policy == ALL_WORKERS:
        if all(t.phase is Phase.SUCCEEDED for t in trainers):
            return Outcome(True, True, f"all {len(trainers)} training task(s) succeeded")
    else:
        raise ValueError(f"unknown success policy {success_policy!r}")
    return None


def evaluate(status: GroupStatus, success_policy: str = ALL_WORKERS) -> Outcome:
    """Deprecated: :func:`group_outcome` (``evaluate`` now means only a model's evaluation)."""
    deprecated("airflow_tf.cluster.evaluate", "airflow_tf.cluster.group_outcome")
    return group_outcome(status, success_policy)
