"""The workload forms a group can take on Kubernetes (the backend option ``workload``), declared
once here: what ``KubernetesBackend(workload=...)``, the operators' ``backend_options`` and
``airflow-tf render --workload`` accept, and the rule that a queued group must be one JobSet.

- ``jobs`` (the default): one Indexed Job per role (:mod:`.jobs`), built-in objects only.
- ``jobset``: the whole group as one JobSet (:mod:`.jobset`, ``jobset.x-k8s.io/v1alpha2``), which
  Kueue admits as ONE Workload: the whole group or none of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_tf.cluster import SpecError

WORKLOADS = {
    "jobs": "one Indexed Job per role (default)",
    "jobset": "the group as one JobSet (jobset.x-k8s.io), admitted whole by Kueue",
}
"""Each workload form and what it is."""
DEFAULT_WORKLOAD = "jobs"


def check_workload(value: Any, where: str = "workload") -> str:
    """``value`` when it names a workload form, else a SpecError naming ``where`` and the forms."""
    if not isinstance(value, str) or value not in WORKLOADS:
        raise SpecError(f"{where}: {value!r} is not a workload form; the forms are: "
                        + "; ".join(f"{name!r} ({doc})" for name, doc in WORKLOADS.items()))
    return value


def refuse_queue_without_jobset(workload: str, queues: Iterable[str | None],
                                priorities: Iterable[str | None] = ()) -> None:
    """A Kueue queue with the ``jobs`` form is refused: Kueue makes one Workload per Job and admits
    them one by one, so half a group (parameter servers that never exit, holding quota) could run
    while its other half waits, or two groups' ps could each hold the quota the other's workers need."""
    queued = sorted({q for q in queues if q is not None})
    if queued and workload == "jobs":
        raise SpecError(
            f"queue_name: {queued[0]!r} needs workload='jobset': with workload='jobs' every role is a Job of its "
            "own, and Kueue admits each Job as its own Workload, so a group would be admitted role by role "
            "(parameter servers holding quota and never exiting while their workers wait); a JobSet is one "
            "Workload, admitted whole or not at all. Set backend_options={'workload': 'jobset'} "
            "(airflow-tf render --workload jobset), or drop queue_name")
    priority = sorted({p for p in priorities if p is not None})
    if priority and workload == "jobs":
        raise SpecError(
            f"workload_priority_class: {priority[0]!r} needs workload='jobset' and a queue_name: Kueue orders and "
            "preempts only the groups of its queues, and a queued group must be one JobSet. Set "
            "backend_options={'workload': 'jobset'} and queue_name, or give the pods a priority_class instead")


def _known(value: Any) -> bool:
    """A plain value, not one only known when the task runs (Jinja text, an XComArg)."""
    return value is None or (isinstance(value, str) and "{{" not in value and "{%" not in value)


def refuse_priority_without_queue(priority: str | None, queue: str | None) -> None:
    """A Kueue WorkloadPriorityClass only orders the groups of a queue: without one it would do nothing."""
    if priority is not None and queue is None:
        raise SpecError(f"workload_priority_class: {priority!r} needs queue_name: Kueue orders and preempts only the "
                        "groups of its queues; set queue_name too, or give the pods a priority_class instead")


def check_launch_options(backend_options: Any, role_options: Any = None) -> None:
    """What a launch on the Kubernetes backend would refuse, checked as soon as the operator's
    arguments are known (DAG parse time): an unknown ``workload``, a ``queue_name`` or a
    ``workload_priority_class`` (in ``pod_defaults`` or a role's ``kubernetes`` settings) with the
    ``jobs`` form, and a ``workload_priority_class`` without a queue. Values only known when the
    task runs (templates) are left to the launch, which checks them again."""
    if not isinstance(backend_options, dict):
        return
    workload = backend_options.get("workload", DEFAULT_WORKLOAD)
    if not _known(workload):
        return
    check_workload(workload, "backend_options.workload")
    pod_defaults = backend_options.get("pod_defaults")
    defaults = pod_defaults if isinstance(pod_defaults, dict) else {}
    settings = [defaults] + [
        {**defaults, **role["kubernetes"]} for role in (role_options.values() if isinstance(role_options, dict) else ())
        if isinstance(role, dict) and isinstance(role.get("kubernetes"), dict)]
    pairs = [(one.get("queue_name"), one.get("workload_priority_class")) for one in settings]
    pairs = [(queue, priority) for queue, priority in pairs if _known(queue) and _known(priority)]
    refuse_queue_without_jobset(workload, (queue for queue, _ in pairs), (priority for _, priority in pairs))
    for queue, priority in pairs:
        refuse_priority_without_queue(priority, queue)
