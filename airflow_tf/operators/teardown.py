"""TeardownTFClusterOperator: stops the parameter servers (which never exit by themselves)."""

from __future__ import annotations

from typing import Any, Sequence

from airflow.sdk import BaseOperator

from airflow_tf.backends import GroupRef, backend_for, get_backend
from airflow_tf.cluster import group_name


class TeardownTFClusterOperator(BaseOperator):
    """Copies the tasks' logs into this task's log, then deletes them.

    Use it as the launch's teardown (``teardown.as_teardown(setups=launch)``) so it runs when
    the sensor fails or the run is killed. It succeeds when there is nothing left to delete.

    :param group: the launch task's XCom (``launch.output``). When the launch failed before it
        returned, the group is found by name from ``launch_task_id`` and ``backend``.
    :param roles: roles to delete, e.g. ``["ps"]`` to keep finished worker pods for inspection;
        None (default) deletes every task and the group itself.
    """

    template_fields: Sequence[str] = ("group", "roles", "backend_options")
    ui_color = "#ef9a9a"

    def __init__(self, *, group: Any = None, roles: list[str] | None = None, launch_task_id: str | None = None,
                 backend: str = "local", backend_options: dict[str, Any] | None = None,
                 log_tail_lines: int = 200, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.group = group
        self.roles = roles
        self.launch_task_id = launch_task_id
        self.backend = backend
        self.backend_options = backend_options or {}
        self.log_tail_lines = log_tail_lines

    def _find_ref(self, context: Any) -> GroupRef | None:
        if self.group:
            return GroupRef.coerce(self.group)
        if not self.launch_task_id:
            return None
        ti = context["ti"]
        return get_backend(self.backend, **self.backend_options).find(group_name(ti.dag_id, self.launch_task_id, ti.run_id))

    def execute(self, context: Any) -> list[str]:
        ref = self._find_ref(context)
        if ref is None:
            self.log.info("no training group to tear down (the launch did not start one)")
            return []
        backend = backend_for(ref)
        status = backend.status(ref)
        if not status.exists:
            self.log.info("training group %s is already gone; nothing to delete", ref.name)
            return []
        wanted = set(self.roles) if self.roles else None
        for task in status.tasks:
            if wanted is None or task.role in wanted:
                text = backend.logs(ref, task.role, task.index, self.log_tail_lines)
                self.log.info("---- log of %s (%s, last %d lines) ----\n%s", task.name, task.phase.value,
                              self.log_tail_lines, text.rstrip() or "(empty)")
        deleted = backend.teardown(ref, self.roles)
        self.log.info("tore down %d task(s) of group %s: %s", len(deleted), ref.name, ", ".join(deleted) or "none")
        return deleted
