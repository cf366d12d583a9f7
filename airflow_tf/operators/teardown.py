"""TeardownTFClusterOperator: stops the parameter servers (which never exit by themselves)."""

from __future__ import annotations

import os
from typing import Any
from collections.abc import Iterable, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.definitions.mappedoperator import MappedOperator
from airflow.sdk.definitions.xcom_arg import XComArg
from airflow.providers.common.compat.sdk import AirflowFailException

from airflow_tf.backends import GroupRef, backend_for, get_backend
from airflow_tf.cluster import group_outcome, group_name, label_value
from airflow_tf.backends.wait import keep_logs
from airflow_tf.files import is_local, strip_file_scheme
from airflow_tf.storage import kept_log_bytes, runs_dir, team_of

from .common import deprecated, launch_labels, resolved_backend


ON_FINISH_ACTIONS = ("delete_pod", "delete_succeeded_pod", "keep_pod")
"""As the KubernetesPodOperator's ``on_finish_action``: delete the group, delete it only when
the training succeeded (else keep the trainers for inspection), or keep the trainers. The
parameter servers are deleted in every case: they never exit by themselves."""


def _launch_setting(launch: Any, key: str) -> Any:
    """A setting of the launch operator (plain or mapped): where its group runs."""
    if isinstance(launch, MappedOperator):
        return launch.partial_kwargs.get(key)
    return getattr(launch, key, None)


def _task_id(task: Any, what: str) -> str | None:
    if task is None:
        return None
    if isinstance(task, (BaseOperator, MappedOperator)):
        return task.task_id
    raise TypeError(f"{what}: pass the operator object (e.g. {what}={what}), not {task!r}; its task id is read "
                    "from it, so renaming the task breaks nothing")


class TeardownTFClusterOperator(BaseOperator):
    """Copies the tasks' logs into this task's log (their last ``log_tail_lines``) and into the run
    directory (whole, up to ``[airflow_tf] kept_log_bytes`` each), then deletes them.

    Use it as the launch's teardown (``teardown.as_teardown(setups=launch)``) so it runs when
    the sensor fails or the run is killed; :func:`airflow_tf.task_groups.tf_training` wires
    it so. It succeeds when there is nothing left to delete, unless ``wait`` is given.

    :param group: the launch task's XCom (``launch.output``; the list of them for a mapped
        launch), or a group reference dict.
    :param launch: the launch operator. Default: the task behind ``group``. A group whose launch
        did not return (killed after starting it) is then still found by name, for every map
        index of a mapped launch.
    :param wait: the :class:`~airflow_tf.sensors.WorkerCompletionSensor` of the group. When set,
        this task fails after tearing down unless every instance of the wait succeeded: a
        training that failed, timed out or whose run was marked failed (the sensor killed)
        then fails the DAG run (with ``as_teardown(..., on_failure_fail_dagrun=True)``).
    :param roles: roles to delete, e.g. ``["ps"]`` to keep finished worker pods for inspection;
        None (default) deletes every task and the group itself.
    :param backend: the launch's backend, to find a group by name. Default: the launch
        operator's own ``backend`` (never another backend than the one that launched).
    :param backend_options: default: the launch operator's ``backend_options`` (connection, namespace).
    :param on_finish_action: ``delete_pod`` (default), ``delete_succeeded_pod`` (keep a
        failed group's trainers for inspection) or ``keep_pod``; the logs are copied first
        in every case, and the parameter servers are always deleted.
    :param log_tail_lines: lines of each task's log copied into this task's log.
    :param launch_task_id: deprecated since 0.2.0, removed in 0.3.0: pass ``launch=<the launch
        operator>`` (or only ``group=launch.output``) instead of its task id.
    """

    template_fields: Sequence[str] = ("group", "roles", "backend_options")
    ui_color = "#ef9a9a"

    def __init__(self, *, group: Any = None, launch: Any = None, wait: Any = None, roles: list[str] | None = None,
                 backend: str | None = None, backend_options: dict[str, Any] | None = None,
                 log_tail_lines: int = 200, on_finish_action: str = "delete_pod", launch_task_id: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if on_finish_action not in ON_FINISH_ACTIONS:
            raise ValueError(f"on_finish_action: {on_finish_action!r} is not one of {', '.join(ON_FINISH_ACTIONS)}")
        if launch_task_id is not None:
            deprecated("TeardownTFClusterOperator(launch_task_id=...)",
                       "launch=<the launch operator>, or only group=launch.output")
            launch = self._launch_by_id(launch_task_id, launch)
        if launch is None and isinstance(group, XComArg):
            launch = next(iter(group.iter_references()))[0]
        # A group whose launch did not return is found where the launch put it.
        backend = backend or _launch_setting(launch, "backend")
        if backend_options is None:
            backend_options = _launch_setting(launch, "backend_options")
        self.on_finish_action = on_finish_action
        self.group = group
        self.launch_task_id = launch if isinstance(launch, str) and launch == launch_task_id else _task_id(launch, "launch")
        self.launch_is_mapped = isinstance(launch, MappedOperator)
        self.wait_task_id = _task_id(wait, "wait")
        self.roles = roles
        self.backend = backend
        self.backend_options = backend_options
        self.log_tail_lines = log_tail_lines

    def _launch_by_id(self, task_id: str, launch: Any) -> Any:
        """The launch operator named by the deprecated ``launch_task_id``: the task of this DAG
        when it is already defined (so a mapped launch and its backend are known), else the id."""
        if not isinstance(task_id, str) or not task_id:
            raise TypeError(f"launch_task_id: expected the launch's task id, got {task_id!r}")
        dag = getattr(self, "dag", None)
        task = dag.task_dict.get(task_id) if dag is not None else None
        if launch is not None and _task_id(launch, "launch") != task_id:
            raise ValueError(f"launch_task_id={task_id!r} names another task than launch "
                             f"({_task_id(launch, 'launch')!r}); pass only launch=")
        return launch if launch is not None else (task if task is not None else task_id)

    def _given_refs(self) -> list[GroupRef]:
        value = self.group
        if not value:
            return []
        if isinstance(value, (dict, GroupRef)):
            return [GroupRef.coerce(value)]
        return [GroupRef.coerce(item) for item in value if item]

    def _run_dirs(self) -> dict[str, str]:
        """The run directory of each group whose launch result was given, by group name."""
        value = self.group
        items = [value] if isinstance(value, dict) else list(value or []) if not isinstance(value, GroupRef) else []
        return {GroupRef.coerce(item).name: item["run_dir"] for item in items
                if isinstance(item, dict) and isinstance(item.get("run_dir"), str) and item["run_dir"]}

    def _keep_logs(self, backend: Any, ref: GroupRef, tasks: list[tuple[str, int]]) -> None:
        """Every task's whole log (its end beyond ``[airflow_tf] kept_log_bytes``) into the run
        directory, before its pods go, for a backend that does not keep them itself (the local
        one does, in ``<run_dir>/logs/attempt-<N>/``). A group whose launch did not return is kept
        in the default run directory, when there is one."""
        if getattr(backend, "keeps_logs", False):
            return
        run_dir = self._run_dirs().get(ref.name) or os.path.join(runs_dir(), ref.name)
        if not is_local(run_dir) or not os.path.isdir(strip_file_scheme(run_dir)):
            self.log.warning("not keeping the logs of group %s: its run directory %s is not a directory here",
                             ref.name, run_dir)
            return
        target = os.path.join(strip_file_scheme(run_dir), "logs", f"{backend.name}-{ref.uid or ref.name}")
        try:
            keep_logs(backend, ref, tasks, target, kept_log_bytes())
        except OSError as err:
            self.log.warning("could not keep the logs of group %s in %s: %s", ref.name, target, err)
            return
        self.log.info("kept the logs of group %s in %s", ref.name, target)

    def _refs(self, context: Any) -> list[GroupRef]:
        refs = {ref.name: ref for ref in self._given_refs()}
        if self.launch_task_id:
            ti = context["ti"]
            indexes: Iterable[int] = [-1]
            if self.launch_is_mapped:
                count = ti.get_ti_count(dag_id=ti.dag_id, task_ids=[self.launch_task_id], run_ids=[ti.run_id])
                indexes = range(count)
            backend_name, options = resolved_backend(self.backend, self.backend_options, team_of(context))
            backend = get_backend(backend_name, **options)
            for index in indexes:
                name = group_name(ti.dag_id, self.launch_task_id, ti.run_id, index)
                if name not in refs and (found := backend.find(name)) is not None:
                    expected = launch_labels(ti.dag_id, self.launch_task_id, ti.run_id, index)
                    # A Kubernetes label holds the value made a valid label value ("-1" is not one).
                    if any(found.labels.get(key) not in (value, label_value(value)) for key, value in expected.items()):
                        # Same name, someone else's group (another run or deployment): not ours to delete.
                        self.log.warning("group %s (uid %s) has this launch's name but was not launched by it "
                                         "(its labels: %s); leaving it alone", name, found.uid, found.labels)
                        continue
                    refs[name] = found
        return list(refs.values())

    def _teardown(self, ref: GroupRef) -> list[str]:
        backend = backend_for(ref)
        status = backend.status(ref)
        if not status.exists:
            self.log.info("training group %s is already gone; nothing to delete", ref.name)
            return []
        roles = self.roles
        if roles is None and self.on_finish_action != "delete_pod":
            succeeded = group_outcome(status, ref.success_policy).succeeded
            if self.on_finish_action == "keep_pod" or not succeeded:
                roles = ["ps"]
                self.log.info("on_finish_action=%s: keeping the trainers of group %s, deleting its parameter servers",
                              self.on_finish_action, ref.name)
        self._keep_logs(backend, ref, [(task.role, task.index) for task in status.tasks])
        for task in status.tasks:  # logs first, whatever is deleted
            text = backend.logs(ref, task.role, task.index, self.log_tail_lines)
            self.log.info("---- log of %s (%s, last %d lines) ----\n%s", task.name, task.phase.value,
                          self.log_tail_lines, text.rstrip() or "(empty)")
        deleted = backend.teardown(ref, roles)
        self.log.info("tore down %d task(s) of group %s: %s", len(deleted), ref.name, ", ".join(deleted) or "none")
        return deleted

    def execute(self, context: Any) -> list[str]:
        refs = self._refs(context)
        if not refs:
            self.log.info("no training group to tear down (the launch did not start one)")
        deleted = [name for ref in refs for name in self._teardown(ref)]
        if self.wait_task_id:
            self._check_training_completed(context)
        return deleted

    def _check_training_completed(self, context: Any) -> None:
        ti = context["ti"]
        query = {"dag_id": ti.dag_id, "task_ids": [self.wait_task_id], "run_ids": [ti.run_id]}
        total = ti.get_ti_count(**query)
        succeeded = ti.get_ti_count(**query, states=["success"])
        if total == 0 or succeeded < total:
            raise AirflowFailException(
                f"the training did not complete ({succeeded} of {total} {self.wait_task_id} task(s) succeeded): "
                "it failed, timed out, or the run was marked failed or cancelled while it trained. Its group was "
                "torn down; the wait task's log says why it ended."
            )
