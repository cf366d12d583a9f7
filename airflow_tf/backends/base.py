"""The one backend protocol. Sensors, triggers and teardown talk to this, never to a
particular backend: they hold a :class:`GroupRef` (JSON, fit for XCom) and call
:func:`airflow_tf.backends.backend_for`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from airflow_tf.cluster import GroupSpec, GroupStatus
from airflow_tf.cluster.spec import DEFAULT_SUCCESS_POLICY


@dataclass(frozen=True)
class GroupRef:
    """Everything needed to find a launched group again, from any process."""

    backend: str
    name: str
    namespace: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """Backend settings needed to reconnect (state dir; connection id, config file, ...)."""
    success_policy: str = DEFAULT_SUCCESS_POLICY
    uid: str | None = None
    """What tells this group from another of the same name, made when it was created: the root
    Job's uid on Kubernetes, the group's id on the local backend (None from an older launch)."""
    labels: dict[str, str] = field(default_factory=dict)
    """The labels the launch stamped on the group (the Airflow dag, run, task and map index)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroupRef:
        return cls(**data)

    @classmethod
    def coerce(cls, value: GroupRef | dict[str, Any]) -> GroupRef:
        """A GroupRef from itself, its dict, or a launch result (``{"group": {...}, ...}``)."""
        if isinstance(value, GroupRef):
            return value
        if isinstance(value, dict) and isinstance(value.get("group"), dict):
            value = value["group"]
        if not isinstance(value, dict) or not {"backend", "name"} <= set(value):
            raise ValueError(
                f"expected a training group reference (the launch task's XCom), got {value!r}"
            )
        return cls.from_dict(value)


class BackendError(RuntimeError):
    """The backend could not do what was asked; the message says what and what to do."""


class ComponentRefusedError(BackendError):
    """A one-off component (evaluation, export) refused its request: a retry would fail again."""


@runtime_checkable
class Backend(Protocol):
    name: str

    def launch(self, spec: GroupSpec) -> GroupRef:
        """Create every task of the group. Idempotent: when a group of this name already
        exists, return a reference to it and create nothing (a retried launch re-attaches)."""

    def hand_over(self, ref: GroupRef) -> None:
        """The launch is complete and its result returned: from now on the group no longer
        ends with the process that launched it. Until this is called, a launching process that
        dies (e.g. a SIGKILLed Airflow task) takes its group with it, so no group is left
        running that nobody knows about. A backend with nothing to untie does nothing."""

    def find(self, name: str) -> GroupRef | None:
        """The existing group of this name, or None."""

    def status(self, ref: GroupRef) -> GroupStatus:
        """Per-task phases, restarts and failure reasons. A group that is gone reports
        ``exists=False``."""

    def watch(self, ref: GroupRef, timeout: float | None = None) -> AsyncIterator[GroupStatus]:
        """Async: yield a status now and then whenever it may have changed, until ``timeout``
        seconds passed (None: forever). The trigger waits on this instead of polling."""

    def logs(self, ref: GroupRef, role: str, index: int, tail_lines: int | None = None) -> str:
        """The task's log (its last ``tail_lines`` lines), '' when there is none."""

    def log_since(self, ref: GroupRef, role: str, index: int, cursor: dict[str, Any] | None = None,
                  limit_bytes: int = 1 << 20) -> tuple[str, dict[str, Any]]:
        """The task's whole log lines written since ``cursor`` (None: since its start), at most
        about ``limit_bytes``, and the cursor after them (JSON). '' while there is nothing new."""

    def teardown(self, ref: GroupRef, roles: Iterable[str] | None = None) -> list[str]:
        """Stop and delete the tasks of ``roles`` (None: all, and the group itself).
        Tolerates tasks already gone; returns the names of what it deleted."""

    def run_component(self, ref: GroupRef, component: str, request: dict[str, Any]) -> dict[str, Any]:
        """Run a one-off component of the group once (``evaluate`` or ``export``: the request
        and the result are those of :mod:`airflow_tf.serving.requests`) where the group's
        storage is, and return its result, a JSON object. Works after the teardown. A refused
        request raises :class:`ComponentRefusedError` (run in this process: the component's own
        error); a component that could not run or gave no result raises BackendError naming
        where it ran."""


async def poll_watch(backend: Backend, ref: GroupRef, interval: float, timeout: float | None) -> AsyncIterator[GroupStatus]:
    """A ``watch`` for backends whose status is cheap to read (a local state file)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        yield await asyncio.to_thread(backend.status, ref)
        if deadline is not None and loop.time() >= deadline:
            return
        await asyncio.sleep(interval if deadline is None else max(0.0, min(interval, deadline - loop.time())))
