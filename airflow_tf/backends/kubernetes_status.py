"""From pods (as the API server returns them, JSON dicts) to a :class:`GroupStatus`.

Pure functions, shared by the synchronous ``status()`` and the asynchronous ``watch()``.
Everything a decision needs is on the pods themselves: role and index labels, and the
annotations written at launch (restart policy, restarts so far, the group's backoff
limit, schedule timeout, deadline, expected replicas).

Restart policy on Kubernetes: pods run with ``restartPolicy: Never`` and the backend
applies the group's policy (``Never`` / ``OnFailure`` / ``ExitCode``, as for the local
backend) by recreating a failed pod under the same name, so its Service and DNS name
stay valid. Restarts count against ``backoff_limit`` across the whole group. Failures a
restart would only repeat fail fast instead: image pull errors, a missing Secret or
ConfigMap, OOMKilled, eviction, a pod unschedulable past its schedule timeout, and the
group's deadline.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from airflow_tf.cluster import GroupStatus, Phase, TaskStatus, describe_exit, is_retryable_exit

from .kubernetes_manifests import (
    BACKOFF_LIMIT, DEADLINE, DEFAULT_SCHEDULE_TIMEOUT, INDEX_LABEL, REPLICAS, RESTART_POLICY, RESTARTS,
    ROLE_LABEL, SCHEDULE_TIMEOUT,
)

FAIL_FAST_WAITING = {
    "ErrImagePull": "the image cannot be pulled; check the image name, tag and image_pull_secrets",
    "ImagePullBackOff": "the image cannot be pulled; check the image name, tag and image_pull_secrets",
    "InvalidImageName": "the image name is not valid",
    "CreateContainerConfigError": "a Secret or ConfigMap the pod refers to is missing",
}
TRAINERS = ("chief", "worker")


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def _meta(pod: dict) -> dict:
    return pod.get("metadata") or {}


def _annotation(pod: dict, key: str, default: str) -> str:
    return (_meta(pod).get("annotations") or {}).get(key) or default


def role_index(pod: dict) -> tuple[str, int]:
    labels = _meta(pod).get("labels") or {}
    return labels.get(ROLE_LABEL, "?"), int(labels.get(INDEX_LABEL, "0"))


def restarts(pod: dict) -> int:
    """Times this task was recreated, plus any in-place container restarts."""
    in_place = sum(c.get("restartCount") or 0 for c in (pod.get("status") or {}).get("containerStatuses") or [])
    return int(_annotation(pod, RESTARTS, "0")) + in_place


def _container_state(pod: dict) -> tuple[str | None, dict]:
    """The first container's state: ('waiting'|'running'|'terminated', details)."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        for kind in ("terminated", "waiting", "running"):
            if (c.get("state") or {}).get(kind):
                return kind, c["state"][kind]
    return None, {}


def unschedulable_since(pod: dict) -> dt.datetime | None:
    """When the scheduler first found no node for this pending pod, or None."""
    if (pod.get("status") or {}).get("phase") != "Pending":
        return None
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return parse_time(cond.get("lastTransitionTime")) or parse_time(_meta(pod).get("creationTimestamp"))
    return None


def schedule_deadline(pod: dict) -> dt.datetime | None:
    since = unschedulable_since(pod)
    if since is None:
        return None
    return since + dt.timedelta(seconds=float(_annotation(pod, SCHEDULE_TIMEOUT, str(DEFAULT_SCHEDULE_TIMEOUT))))


def overdue_unschedulable(pods: list[dict], now: dt.datetime) -> list[str]:
    """Pods past their schedule timeout: the caller looks up the scheduler's events for these."""
    return [_meta(p)["name"] for p in pods if (d := schedule_deadline(p)) is not None and now >= d]


def next_wakeup(pods: list[dict], now: dt.datetime) -> dt.datetime | None:
    """The next moment the status can change without any pod event (a timeout passing)."""
    moments = [d for p in pods if (d := schedule_deadline(p)) is not None and d > now]
    moments += [d for p in pods if (d := parse_time(_annotation(p, DEADLINE, ""))) is not None and d > now]
    return min(moments) if moments else None


def lead_pod(pods: list[dict]) -> dict | None:
    """The pod whose log carries training progress: the chief, else worker 0."""
    by_task = {role_index(p): p for p in pods}
    return by_task.get(("chief", 0)) or by_task.get(("worker", 0))


def _limit(pod: dict, resource: str) -> str | None:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return ((containers[0].get("resources") or {}).get("limits") or {}).get(resource)


@dataclass
class Assessment:
    status: GroupStatus
    restart: list[dict] = field(default_factory=list)
    """Failed pods to recreate now, under the group's restart policy and budget."""
    missing: list[str] = field(default_factory=list)
    """Trainer pods that should exist and do not (deleted by someone else)."""


def assess(group: str, pods: list[dict], now: dt.datetime, *, scheduler_messages: dict[str, str] | None = None,
           progress: dict[str, Any] | None = None) -> Assessment:
    """The group's status from its pods, and which pods the backend must recreate."""
    if not pods:
        return Assessment(GroupStatus(name=group, exists=False))
    scheduler_messages = scheduler_messages or {}
    pods = sorted(pods, key=role_index)
    budget = max(int(_annotation(p, BACKOFF_LIMIT, "0")) for p in pods)
    spent = sum(restarts(p) for p in pods)
    tasks: list[TaskStatus] = []
    to_restart: list[dict] = []
    failure = None

    for pod in pods:
        if _meta(pod).get("deletionTimestamp") and role_index(pod)[0] not in TRAINERS:
            continue  # a parameter server being torn down: its exit is expected
        task = _task_status(pod, now, scheduler_messages)
        if task.phase is Phase.FAILED and task.exit_code is not None and task.reason is None:
            # A plain non-zero exit: the restart policy and the group's budget decide.
            policy = _annotation(pod, RESTART_POLICY, "Never")
            leaving = _meta(pod).get("deletionTimestamp") is not None
            if leaving or not is_retryable_exit(policy, task.exit_code):
                task.reason = f"{describe_exit(task.exit_code)} (restart policy {policy})"
            elif spent >= budget:
                task.reason = (f"{describe_exit(task.exit_code)}; restart budget spent "
                               f"(backoff_limit {budget}, {spent} restart(s) in the group)")
            else:
                spent += 1
                task.phase, task.restarts = Phase.RESTARTING, task.restarts + 1
                task.reason = f"{describe_exit(task.exit_code)}; restarting ({spent}/{budget} of the group's budget)"
                to_restart.append(pod)
        tasks.append(task)

    # Trainers that should exist but do not were deleted by someone else: the group
    # cannot finish. (Parameter servers are missing after a ps-only teardown: fine.)
    expected = json.loads(_annotation(pods[0], REPLICAS, "{}"))
    present = {(t.role, t.index) for t in tasks}
    missing = [(role, index) for role in TRAINERS for index in range(int(expected.get(role, 0)))
               if (role, index) not in present]
    for role, index in missing:
        tasks.append(TaskStatus(role=role, index=index, name=f"{group}-{role}-{index}", phase=Phase.FAILED,
                                reason="pod not found: it was deleted outside airflow-tf; launch the group again"))
    deadline = parse_time(_annotation(pods[0], DEADLINE, ""))
    if deadline is not None and now >= deadline and not all(
            t.phase is Phase.SUCCEEDED for t in tasks if t.role in TRAINERS):
        failure = (f"training group {group!r} passed its active_deadline_seconds at "
                   f"{deadline.strftime('%Y-%m-%dT%H:%M:%SZ')} before the workers finished")
        to_restart = []
    tasks.sort(key=lambda t: (t.role, t.index))
    return Assessment(GroupStatus(name=group, tasks=tasks, failure=failure, progress=progress), to_restart,
                      [f"{group}-{role}-{index}" for role, index in missing])


def _task_status(pod: dict, now: dt.datetime, scheduler_messages: dict[str, str]) -> TaskStatus:
    role, index = role_index(pod)
    name = _meta(pod)["name"]
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    kind, state = _container_state(pod)
    task = TaskStatus(role=role, index=index, name=name, phase=Phase.PENDING, restarts=restarts(pod))

    if phase == "Pending":
        if kind == "waiting" and state.get("reason") in FAIL_FAST_WAITING:
            task.phase = Phase.FAILED
            task.reason = (f"{state['reason']}: {state.get('message') or FAIL_FAST_WAITING[state['reason']]} "
                           f"({FAIL_FAST_WAITING[state['reason']]})")
        elif (deadline := schedule_deadline(pod)) is not None and now >= deadline:
            timeout = _annotation(pod, SCHEDULE_TIMEOUT, str(DEFAULT_SCHEDULE_TIMEOUT))
            message = scheduler_messages.get(name) or _scheduled_condition_message(pod)
            task.phase = Phase.FAILED
            task.reason = (f"unschedulable for more than {timeout}s (schedule_timeout_seconds); "
                           f"the scheduler says: {message}")
        elif kind == "waiting":
            task.reason = state.get("reason")
        elif unschedulable_since(pod) is not None:
            task.reason = f"waiting for a node: {_scheduled_condition_message(pod)}"
        return task
    if phase == "Running":
        task.phase = Phase.RUNNING
        return task
    if phase == "Succeeded":
        task.phase, task.exit_code = Phase.SUCCEEDED, 0
        return task
    if phase == "Failed":
        task.phase = Phase.FAILED
        if status.get("reason") == "Evicted":
            task.reason = f"Evicted: {status.get('message') or 'the node ran short of resources'}"
        elif status.get("reason") == "DeadlineExceeded":
            task.reason = f"DeadlineExceeded: {status.get('message') or 'the pod ran past activeDeadlineSeconds'}"
        elif kind == "terminated":
            task.exit_code = int(state.get("exitCode", 1))
            if state.get("reason") == "OOMKilled":
                limit = _limit(pod, "memory")
                task.reason = (f"OOMKilled: the container ran out of memory "
                               f"({f'limit {limit}' if limit else 'no memory limit set'}); "
                               f"raise roles.{role}.resources.limits.memory")
        else:
            task.reason = f"{status.get('reason') or 'Failed'}: {status.get('message') or 'the pod failed before its container ran'}"
        return task
    task.reason = f"pod phase {phase}: the node is not reporting (node lost?)"
    return task


def _scheduled_condition_message(pod: dict) -> str:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled":
            return cond.get("message") or cond.get("reason") or "no reason given"
    return "no reason given"


def scheduler_message(events: list[dict]) -> str | None:
    """The latest FailedScheduling message among a pod's events."""
    failed = [e for e in events if e.get("reason") == "FailedScheduling"]
    if not failed:
        return None
    latest = max(failed, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or
                 (e.get("metadata") or {}).get("creationTimestamp") or "")
    return latest.get("message")


def recreated(pod: dict, now: dt.datetime) -> dict:
    """The manifest that replaces a failed pod: same name, labels and spec, one more restart."""
    meta = _meta(pod)
    annotations = dict(meta.get("annotations") or {})
    annotations[RESTARTS] = str(int(annotations.get(RESTARTS, "0")) + 1)
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    # The service-account token volume is added by the API server on admission; sending
    # it back would pin the old token's projected volume name.
    injected = {v["name"] for v in spec.get("volumes") or [] if v.get("name", "").startswith("kube-api-access-")}
    if injected:
        spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in injected]
        spec["containers"] = [{**c, "volumeMounts": [m for m in c.get("volumeMounts") or [] if m["name"] not in injected]}
                              for c in spec["containers"]]
    deadline = parse_time(annotations.get(DEADLINE))
    if deadline is not None:
        spec["activeDeadlineSeconds"] = max(1, int((deadline - now).total_seconds()))
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": meta["name"], "namespace": meta.get("namespace"),
                     "labels": meta.get("labels") or {}, "annotations": annotations},
        "spec": spec,
    }
