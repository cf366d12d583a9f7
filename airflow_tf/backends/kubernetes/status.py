"""From the group's Jobs and pods (as the API server returns them, JSON dicts) to a
:class:`GroupStatus`. Pure functions, shared by the synchronous ``status()`` and the
asynchronous ``watch()``; they decide, they never act.

Kubernetes owns the lifecycle: the Job controller restarts a failed task within its
Job's ``backoffLimitPerIndex``, ignores disruptions, fails the Job on a user error
(``podFailurePolicy``) or at its deadline. This module reads the outcome: a task whose
latest pod failed is ``Restarting`` while its Job will replace it, ``Failed`` once its
index failed or its Job did. Failures a restart would only repeat are reported at once,
naming the pod: image pull errors, a missing Secret or ConfigMap, OOMKilled, a pod
unschedulable past its schedule timeout.

A group launched as one JobSet (``workload="jobset"``) is read from the same Jobs and pods, made
by the JobSet controller, and from the JobSet itself: until the controller made a role's Job
(right after the launch, or under ``startupPolicy: InOrder`` until the roles before it are
ready) its tasks wait; a suspended JobSet waits for its Kueue queue; once the JobSet finished,
the Jobs its controller deleted (the parameter servers, trainers that were not needed) are
expected gone, and a failed JobSet is the group's failure when no task says more.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from airflow_tf.cluster import GroupStatus, OutcomeCode, Phase, ReasonCode, TaskStatus, describe_exit, task_failure_reason, task_name

from .nodes import EVICTION_API, LOST_NODE_REASONS, cut_off_due, disruption, moves, moving, node_of, release_due
from .labels import INDEX_LABEL, KUEUE_QUEUE_LABEL, REPLICAS, ROLE_LABEL, ROOT_ANNOTATION, SCHEDULE_TIMEOUT
from .pod_options import DEFAULT_SCHEDULE_TIMEOUT

FAIL_FAST_WAITING = {
    "ErrImagePull": "the image cannot be pulled; check the image name, tag and image_pull_secrets",
    "ImagePullBackOff": "the image cannot be pulled; check the image name, tag and image_pull_secrets",
    "InvalidImageName": "the image name is not valid",
    "ErrImageNeverPull": "the image is not on the node and image_pull_policy is Never; load it onto the nodes "
                         "or let them pull it (image_pull_policy IfNotPresent)",
    "CreateContainerConfigError": "a Secret or ConfigMap the pod refers to is missing",
}
CONFIG_WAITING = "CreateContainerConfigError"
"""The one waiting reason of :data:`FAIL_FAST_WAITING` that is not the image's."""
TRAINERS = ("chief", "worker")


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def _meta(obj: dict) -> dict:
    return obj.get("metadata") or {}


def _annotation(obj: dict, key: str, default: str) -> str:
    return (_meta(obj).get("annotations") or {}).get(key) or default


def role_index(pod: dict) -> tuple[str, int]:
    labels = _meta(pod).get("labels") or {}
    index = labels.get(INDEX_LABEL) or (_meta(pod).get("annotations") or {}).get(INDEX_LABEL) or "0"
    return labels.get(ROLE_LABEL, "?"), int(index)


def _container_state(pod: dict) -> tuple[str | None, dict]:
    """The task container's state (the first one): ('waiting'|'running'|'terminated', details)."""
    role = role_index(pod)[0]
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for c in sorted(statuses, key=lambda c: c.get("name") != role):
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


def _attempt_order(pod: dict) -> tuple[str, bool]:
    # Creation times have a resolution of one second; within one, the attempt still
    # pending or running is the newer (the Job controller runs one pod per index at a time).
    return _meta(pod).get("creationTimestamp") or "", (pod.get("status") or {}).get("phase") in ("Pending", "Running")


def latest_pods(pods: list[dict]) -> dict[tuple[str, int], dict]:
    """The newest pod of every task (the Job controller's latest attempt)."""
    latest: dict[tuple[str, int], dict] = {}
    for pod in sorted(pods, key=_attempt_order):
        latest[role_index(pod)] = pod
    return latest


def overdue_unschedulable(pods: list[dict], now: dt.datetime) -> list[str]:
    """Pods past their schedule timeout: the caller looks up the scheduler's events for these."""
    return [_meta(p)["name"] for p in latest_pods(pods).values()
            if (d := schedule_deadline(p)) is not None and now >= d]


def next_wakeup(pods: list[dict], now: dt.datetime, cut: Collection[str] = ()) -> dt.datetime | None:
    """The next moment the status can change without any event: a schedule timeout passing, the
    release of a pod stuck on a lost node falling due (its node sends no event any more), or the
    verdict on a pod cut off from its group (``cut``: :func:`.nodes.cut_nodes`)."""
    moments = [d for p in latest_pods(pods).values() if (d := schedule_deadline(p)) is not None and d > now]
    moments += [d for p in pods if (d := release_due(p) or cut_off_due(p, cut)) is not None and d > now]
    return min(moments) if moments else None


def lead_pod(pods: list[dict]) -> dict | None:
    """The pod whose log carries training progress: the chief, else worker 0."""
    latest = latest_pods(pods)
    return latest.get(("chief", 0)) or latest.get(("worker", 0))


def _limit(pod: dict, resource: str) -> str | None:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return ((containers[0].get("resources") or {}).get("limits") or {}).get(resource)


def _condition(job: dict, kind: str) -> dict | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def _indexes(text: str | None) -> set[int]:
    """``"1,3-5"`` (a Job's completedIndexes / failedIndexes) as a set."""
    result: set[int] = set()
    for part in filter(None, (text or "").split(",")):
        low, _, high = part.partition("-")
        result.update(range(int(low), int(high or low) + 1))
    return result


@dataclass(frozen=True)
class _RoleJob:
    """One role's Job as the rules read it."""

    name: str
    job: dict
    failed: dict | None
    """Its ``Failed`` condition, once the Job controller gave up on it."""
    complete: bool
    failed_indexes: set[int]
    completed_indexes: set[int]
    suspended: bool
    queue: str | None = None
    """The Kueue queue it waits for when suspended: its own label, else its JobSet's."""
    waiting: str | None = None
    """Why it is suspended, when its JobSet says more than the Job (a suspended JobSet's)."""

    @classmethod
    def read(cls, name: str, job: dict, queue: str | None = None, waiting: str | None = None) -> _RoleJob:
        status = job.get("status") or {}
        # FailureTarget and SuccessCriteriaMet are the Job controller's decision; Failed and
        # Complete follow only once the Job's pods are gone, and no pod event comes after them.
        return cls(name=name, job=job, failed=_condition(job, "Failed") or _condition(job, "FailureTarget"),
                   complete=bool(_condition(job, "Complete") or _condition(job, "SuccessCriteriaMet")),
                   failed_indexes=_indexes(status.get("failedIndexes")),
                   completed_indexes=_indexes(status.get("completedIndexes")),
                   suspended=bool((job.get("spec") or {}).get("suspend")),
                   queue=(_meta(job).get("labels") or {}).get(KUEUE_QUEUE_LABEL) or queue, waiting=waiting)

    def failure(self) -> str:
        return _job_failure(self.job, self.failed)

    def failure_code(self) -> OutcomeCode:
        return _job_failure_code(self.failed)

    def gave_up_on(self, index: int) -> bool:
        """The Job failed, or this index spent its restarts: no new pod will come for it."""
        return self.failed is not None or index in self.failed_indexes


class _Attempts:
    """Every pod of the group by task, oldest first: the last is the task's current attempt."""

    def __init__(self, pods: list[dict]) -> None:
        self.by_task: dict[tuple[str, int], list[dict]] = {}
        for pod in sorted(pods, key=_attempt_order):
            self.by_task.setdefault(role_index(pod), []).append(pod)

    def latest(self, task: tuple[str, int]) -> dict | None:
        tried = self.by_task.get(task)
        return tried[-1] if tried else None

    def earlier(self, task: tuple[str, int]) -> list[dict]:
        return self.by_task.get(task, [])[:-1]

    def restarts(self, task: tuple[str, int]) -> int:
        return max(0, len(self.by_task.get(task, [])) - 1)


def _jobset_condition(jobset: dict, kind: str) -> dict | None:
    for cond in (jobset.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def _jobset_job_name(jobset: dict, role: str) -> str:
    """A role's Job as the JobSet controller names it: ``<jobset>-<replicated job>-<job index>``
    (one Job per replicated job: index 0)."""
    return f"{_meta(jobset).get('name')}-{role}-0"


def _jobset_suspended(jobset: dict, queue_reason: str | None) -> str | None:
    """Why a suspended JobSet waits (its queue, and Kueue's reason when known); None when it runs."""
    if not (jobset.get("spec") or {}).get("suspend"):
        return None
    name = _meta(jobset).get("name")
    queue = (_meta(jobset).get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    if not queue:
        return f"JobSet {name} is suspended"
    return (f"JobSet {name} is suspended: waiting for the queue {queue} to admit the whole group"
            + (f" ({queue_reason})" if queue_reason else ""))


def _waiting_for_jobset(jobset: dict, role: str, queue_reason: str | None = None, made: bool = False) -> str:
    """Why a role of a JobSet that has not finished has no Job yet (or, ``made``, a suspended one)."""
    suspended = _jobset_suspended(jobset, queue_reason)
    if suspended:
        return suspended
    return (f"waiting for the JobSet controller to {'start' if made else 'create'} Job "
            f"{_jobset_job_name(jobset, role)} (startupPolicy InOrder: once every pod of the roles before it is ready)")


def assess(group: str, jobs: list[dict], pods: list[dict], now: dt.datetime, *,
           scheduler_messages: dict[str, str | None] | None = None, progress: dict[str, Any] | None = None,
           jobset: dict | None = None, queue_reason: str | None = None) -> GroupStatus:
    """The group's status from its Jobs and their pods, and from its JobSet when it is one;
    ``queue_reason``: why Kueue has not admitted a suspended JobSet (its Workload's condition)."""
    if not jobs and jobset is None:
        return GroupStatus(name=group, exists=False)
    form = _Form(group, jobs, jobset, queue_reason)
    by_role = {(_meta(j).get("labels") or {}).get(ROLE_LABEL): j for j in jobs}
    attempts = _Attempts(pods)
    tasks: list[TaskStatus] = []
    stopped: set[str] = set()  # tasks Kubernetes stopped because another one failed
    failure: tuple[str, OutcomeCode] | None = None
    for role, count in sorted(form.expected.items()):
        job = by_role.get(role)
        if job is None:
            waiting, missing = form.without_job(role, count)
            tasks += waiting
            failure = missing or failure
            continue
        role_job = _RoleJob.read(form.job_name(role), job, form.queue, form.waiting(role))
        for index in range(count):
            task, was_stopped = _assess_task(group, role, index, role_job, attempts=attempts, now=now,
                                              scheduler_messages=scheduler_messages or {},
                                              name=form.task_name(role, index))
            if task is not None:
                tasks.append(task)
                if was_stopped:
                    stopped.add(task.name)
        if role_job.failed and not _failed_on_its_own(tasks, stopped, role):
            failure = failure or (f"Job {role_job.name} failed: {role_job.failure()}", role_job.failure_code())
    if failure is None and not _failed_on_its_own(tasks, stopped):
        failure = form.jobset_failure()
    # The task that failed comes before those stopped because of it: it is the reason.
    tasks.sort(key=lambda t: (t.name in stopped, t.role, t.index))
    return GroupStatus(name=group, tasks=tasks, failure=failure[0] if failure else None,
                       failure_code=failure[1] if failure else None,
                       progress=progress)


def _failed_on_its_own(tasks: list[TaskStatus], stopped: set[str], role: str | None = None) -> bool:
    """Some task (of ``role``) failed, not stopped because another one did."""
    return any(t.phase is Phase.FAILED and t.name not in stopped for t in tasks if role is None or t.role == role)


class _Form:
    """What differs between the workload forms when a group is read: the Jobs form (one Job per
    role, the root Job carrying the group's shape) or one JobSet (its controller names the Jobs,
    Kueue admits it whole, it fails or completes as one)."""

    def __init__(self, group: str, jobs: list[dict], jobset: dict | None, queue_reason: str | None) -> None:
        self.group, self.jobset, self.queue_reason = group, jobset, queue_reason
        root = jobset if jobset is not None else next(
            (j for j in jobs if _annotation(j, ROOT_ANNOTATION, "") == "true"), jobs[0])
        self.expected = {role: int(count) for role, count in json.loads(_annotation(root, REPLICAS, "{}")).items()}
        self.queue = (_meta(jobset).get("labels") or {}).get(KUEUE_QUEUE_LABEL) if jobset is not None else None
        self.failed = _jobset_condition(jobset, "Failed") if jobset is not None else None
        self.finished = jobset is not None and bool(self.failed or _jobset_condition(jobset, "Completed"))

    def job_name(self, role: str) -> str:
        return f"{self.group}-{role}" if self.jobset is None else _jobset_job_name(self.jobset, role)

    def task_name(self, role: str, index: int) -> str | None:
        """A JobSet's task's pod host; None: the Jobs form's ``<group>-<role>-<index>``."""
        return None if self.jobset is None else f"{self.job_name(role)}-{index}"

    def waiting(self, role: str) -> str | None:
        """Why a JobSet's role whose Job exists has not started (suspended, or after the roles before it)."""
        return None if self.jobset is None else _waiting_for_jobset(self.jobset, role, self.queue_reason, made=True)

    def without_job(self, role: str, count: int) -> tuple[list[TaskStatus], tuple[str, OutcomeCode] | None]:
        """A role with no Job: a JobSet's tasks waiting for it, or the group's failure when a
        trainer's Job of the Jobs form was deleted. Parameter servers are gone after a ps-only
        teardown, and every Job still running once its JobSet finished (its controller deletes
        them): fine."""
        if self.jobset is not None and not self.finished:
            reason = _waiting_for_jobset(self.jobset, role, self.queue_reason)
            return [TaskStatus(role=role, index=index, name=f"{self.job_name(role)}-{index}", phase=Phase.PENDING,
                               reason=reason) for index in range(count)], None
        if role in TRAINERS and self.jobset is None:
            return [], (f"Job {self.group}-{role} not found: it was deleted outside airflow-tf; launch the group again",
                        OutcomeCode.GROUP_DELETED)
        return [], None

    def jobset_failure(self) -> tuple[str, OutcomeCode] | None:
        """The JobSet's own failure (its condition's reason and message) and its code, when no task's explains it."""
        if self.failed is None:
            return None
        reason, message = self.failed.get("reason") or "Failed", self.failed.get("message") or ""
        return (f"JobSet {_meta(self.jobset or {}).get('name')} failed: {reason}" + (f": {message}" if message else ""),
                _job_failure_code(self.failed))


def _assess_task(group: str, role: str, index: int, job: _RoleJob, *, attempts: _Attempts, now: dt.datetime,
                 scheduler_messages: dict[str, str | None], name: str | None = None) -> tuple[TaskStatus | None, bool]:
    """One task's status and whether Kubernetes stopped it because of another's failure;
    None for a parameter server being torn down (its exit is expected). ``name``: the task's
    pod host when it is not ``<group>-<role>-<index>`` (a JobSet's)."""
    name, restarts = name or task_name(group, role, index), attempts.restarts((role, index))
    restarts += sum(1 for move in moves(job.job) if move["task"] == f"{role}-{index}")
    pod = attempts.latest((role, index))
    under_way = _moving_off(job, role, index, now)
    if under_way is not None:
        return TaskStatus(role=role, index=index, name=name, phase=Phase.RESTARTING, restarts=restarts,
                          reason=under_way), False
    if pod is None:
        task = TaskStatus(role=role, index=index, name=name, phase=Phase.PENDING, restarts=restarts)
        return task, _task_without_pod(task, job)
    lost = _on_lost_node(pod, role, index, now)
    if lost is not None:
        return TaskStatus(role=role, index=index, name=name, phase=Phase.RESTARTING, restarts=restarts,
                          reason=lost), False
    if _meta(pod).get("deletionTimestamp") and role not in TRAINERS and disruption(pod) is None:
        return None, False  # torn down: not a ps evicted (a drain) or lost with its node
    task = _task_status(pod, now, scheduler_messages, name, restarts)
    _fail_after_oom(task, attempts.earlier((role, index)), now)
    if _stopped_by_failed_job(task, pod, job):
        task.phase, task.reason = Phase.FAILED, f"stopped by Kubernetes: {job.failure()}"
        return task, True
    if task.phase is Phase.FAILED and not task.reason and task.exit_code is not None:
        _judge_exit(task, job, pod)
    elif task.phase is Phase.FAILED and _disrupted(task) and not job.gave_up_on(index):
        task.phase = Phase.RESTARTING  # a disruption: not counted, the pod is replaced
    elif task.phase in (Phase.RUNNING, Phase.PENDING):
        _say_why_replaced(task, job, attempts.earlier((role, index)), pod, now)
    return task, False


def _say_why_replaced(task: TaskStatus, job: _RoleJob, earlier: list[dict], pod: dict, now: dt.datetime) -> None:
    """The reason of a running or pending task that runs in a new pod: moved off a node its pod
    network was cut on, lost with its node or drained, else how its previous pod ended."""
    moved_off = _moved_off(job, task.role, task.index, pod)
    if moved_off is not None:
        task.reason = moved_off
    elif task.restarts and earlier:
        moved = _moved(earlier[-1], pod)
        if moved is not None:
            task.reason = moved + (f" ({task.reason})" if task.reason else "")
        elif not task.reason:
            task.reason = _replaced(earlier[-1], job, now)


def _stopped_by_failed_job(task: TaskStatus, pod: dict, job: _RoleJob) -> bool:
    """Kubernetes stopped this task because its Job failed: it was still pending or running, or
    the Job controller deleted its pod then (its exit, SIGTERM's once the kubelet stops it, is
    the failure's consequence, not its cause). The Job itself being deleted (a JobSet's cleanup,
    a teardown) deletes every pod, the cause's too."""
    if not job.failed:
        return False
    if task.phase in (Phase.RUNNING, Phase.PENDING):
        return True
    return (task.phase is Phase.FAILED and bool(_meta(pod).get("deletionTimestamp"))
            and not _meta(job.job).get("deletionTimestamp"))


def _on_lost_node(pod: dict, role: str, index: int, now: dt.datetime) -> str | None:
    """Why a task waits for a new pod while its pod is still bound to a node judged lost (evicted
    by the taint eviction controller, not terminal yet: the backend force-deletes it, :mod:`.nodes`)."""
    evicted = disruption(pod)
    if (evicted is None or evicted[0] not in LOST_NODE_REASONS or not _meta(pod).get("deletionTimestamp")
            or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")):
        return None
    ago = f" {_seconds(evicted[1], now)} ago" if evicted[1] else ""
    return f"{role}-{index} lost with node {node_of(pod)}: evicted{ago}, waiting for its replacement"


def _seconds(start: dt.datetime | None, end: dt.datetime | None) -> str:
    return "?" if start is None or end is None else f"{max(0, round((end - start).total_seconds()))} s"


def _started(pod: dict) -> dt.datetime | None:
    """When the task's container started running (else the pod started), or None before."""
    kind, state = _container_state(pod)
    if kind == "running" and state.get("startedAt"):
        return parse_time(state["startedAt"])
    return parse_time((pod.get("status") or {}).get("startTime")) if kind is not None else None


def _moved(previous: dict, current: dict) -> str | None:
    """A task moved off its node in a user's words: lost with its node, or evicted from it (a
    drain), where it runs now and how long after the eviction; None for any other replacement."""
    evicted = disruption(previous)
    if evicted is None or (evicted[0] not in LOST_NODE_REASONS and evicted[0] != EVICTION_API):
        return None
    created = parse_time(_meta(current).get("creationTimestamp"))
    if evicted[1] is not None and created is not None and created < evicted[1]:
        # An older attempt that had ended on the node is marked by the node's eviction too: the
        # pod running now predates it and is no replacement (it is lost itself, once evicted).
        return None
    role, index = role_index(previous)
    task, node = f"{role}-{index}", (current.get("spec") or {}).get("nodeName")
    how = (f"{task} lost with node {node_of(previous)}" if evicted[0] in LOST_NODE_REASONS
           else f"{task} evicted from {node_of(previous)} (drain)")
    started = _started(current)
    if started is None or (current.get("status") or {}).get("phase") != "Running":
        return f"{how}, replacement pending" + (f" on {node}" if node else "")
    return f"{how}, replaced on {node_of(current)} after {_seconds(evicted[1], started)}"


def _moving_off(job: _RoleJob, role: str, index: int, now: dt.datetime) -> str | None:
    """Why a task of a Job the backend suspended to move a cut-off task off its node waits
    (:func:`.nodes.move_off`), or None."""
    note = moving(job.job)
    if note is None:
        return None
    task = f"{role}-{index}"
    cut = (f"{task} cut off from its group on node {note['node']} (no other task answered its health question)"
           if note["task"] == task else f"{task} stopped with {note['task']}, cut off from its group on node "
           f"{note['node']}")
    return (f"{cut}: Job {job.name} suspended {_seconds(parse_time(note['at']), now)} ago, to start again on "
            "another node once its pods are gone")


def _moved_off(job: _RoleJob, role: str, index: int, pod: dict) -> str | None:
    """A task the backend moved off a node its pod network was cut on, in a user's words: where it
    runs now and how long after the verdict; None when its pod predates the last move."""
    task = f"{role}-{index}"
    done = [m for m in moves(job.job) if m["task"] == task]
    if not done:
        return None
    created, at = parse_time(_meta(pod).get("creationTimestamp")), parse_time(done[-1]["at"])
    if created is None or at is None or created < at:
        return None
    how = f"{task} cut off from its group on node {done[-1]['node']}"
    started = _started(pod)
    if started is None or (pod.get("status") or {}).get("phase") != "Running":
        node = (pod.get("spec") or {}).get("nodeName")
        return f"{how}, replacement pending" + (f" on {node}" if node else "")
    return f"{how}, replaced on {node_of(pod)} after {_seconds(at, started)}"


def _replaced(previous: dict, job: _RoleJob, now: dt.datetime) -> str:
    """Why a task runs in a new pod: how its previous pod ended (a liveness probe's kill is an
    exit by SIGKILL or SIGTERM; the pod's events name the probe)."""
    ended = _task_status(previous, now, {}, "", 0)
    why = ended.reason or (describe_exit(ended.exit_code) if ended.exit_code is not None else "it was deleted")
    return f"pod {_meta(previous)['name']} ended ({why}); Job {job.name} replaced it"


def _task_without_pod(task: TaskStatus, job: _RoleJob) -> bool:
    """A task with no pod (yet, or any more): done, queued, stopped or about to be created.
    True when Kubernetes stopped it."""
    if task.index in job.completed_indexes or job.complete:
        task.phase, task.exit_code = Phase.SUCCEEDED, 0
    elif job.suspended:
        task.reason = job.waiting or (f"Job {job.name} is suspended: waiting for the queue {job.queue} to admit it" if job.queue
                       else f"Job {job.name} is suspended")
    elif job.failed:
        task.phase, task.reason = Phase.FAILED, f"stopped by Kubernetes: {job.failure()}"
        return True
    else:
        task.reason = "waiting for the Job controller to create the pod"
    return False


def _fail_after_oom(task: TaskStatus, earlier: list[dict], now: dt.datetime) -> None:
    """Kubernetes restarts a container killed by a signal; with the same memory limit it
    would only run out again: fail now, naming the killed pod."""
    if task.phase is Phase.SUCCEEDED:
        return
    oom = next((t for p in earlier if (t := _task_status(p, now, {}, task.name, task.restarts)).reason
                and t.code == ReasonCode.OOM_KILLED), None)
    if oom is not None:
        task.phase, task.exit_code, task.reason, task.code = Phase.FAILED, oom.exit_code, oom.reason, oom.code


def _judge_exit(task: TaskStatus, job: _RoleJob, pod: dict) -> None:
    """A plain failed attempt: the Job controller's verdict decides between failed and restarting.
    With terminationMessagePolicy FallbackToLogsOnError the kubelet puts the end of a failed
    container's log into its terminated state's message."""
    assert task.exit_code is not None
    exited = task_failure_reason(task.exit_code, _container_state(pod)[1].get("message"))
    if job.gave_up_on(task.index):
        why = job.failure() if job.failed else "its restarts are spent (backoffLimitPerIndex)"
        task.reason = f"{exited}: {why}"
        if job.failed and job.failure_code() is OutcomeCode.DEADLINE_EXCEEDED:
            task.code = ReasonCode.DEADLINE_EXCEEDED  # the exit was the deadline's kill
    else:
        task.phase = Phase.RESTARTING
        task.reason = f"{exited}; Kubernetes restarts it (Job {job.name})"


def _disrupted(task: TaskStatus) -> bool:
    return task.code in (ReasonCode.EVICTED, ReasonCode.PREEMPTED)


def _job_failure_code(condition: dict | None) -> OutcomeCode:
    """The group's outcome code when a Job's (or JobSet's) failed condition, not a task, fails it."""
    reason = (condition or {}).get("reason")
    if reason == "DeadlineExceeded":
        return OutcomeCode.DEADLINE_EXCEEDED
    if reason == "PodFailurePolicy":
        return OutcomeCode.TASK_FAILED  # a program error of a task, not retried
    return OutcomeCode.GROUP_FAILED


def _job_failure(job: dict, condition: dict | None) -> str:
    condition = condition or {}
    reason, message = condition.get("reason") or "Failed", condition.get("message") or ""
    if reason == "DeadlineExceeded":
        seconds = (job.get("spec") or {}).get("activeDeadlineSeconds")
        return f"DeadlineExceeded: the Job ran past its activeDeadlineSeconds ({seconds}s) before it finished"
    if reason == "PodFailurePolicy":
        return f"a program error, not retried (podFailurePolicy): {message}"
    return f"{reason}: {message}" if message else reason


def _task_status(pod: dict, now: dt.datetime, scheduler_messages: dict[str, str | None], name: str,
                 restarts: int) -> TaskStatus:
    """What one pod says of its task, before the Job's verdict is applied."""
    role, index = role_index(pod)
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    task = TaskStatus(role=role, index=index, name=name, phase=Phase.PENDING, restarts=restarts)
    if phase == "Pending":
        _pending(task, pod, now, scheduler_messages)
    elif phase == "Running":
        task.phase = Phase.RUNNING
    elif phase == "Succeeded":
        task.phase, task.exit_code = Phase.SUCCEEDED, 0
    elif phase == "Failed":
        task.phase = Phase.FAILED
        _failed(task, pod)
    else:
        task.reason = f"pod {_meta(pod)['name']} phase {phase}: the node is not reporting (node lost?)"
    return task


def _pending(task: TaskStatus, pod: dict, now: dt.datetime, scheduler_messages: dict[str, str | None]) -> None:
    """A pending pod: failed when waiting cannot help (image, missing Secret, unschedulable
    past its timeout), else still pending with what it waits for."""
    pod_name = _meta(pod)["name"]
    kind, state = _container_state(pod)
    if kind == "waiting" and state.get("reason") in FAIL_FAST_WAITING:
        hint = FAIL_FAST_WAITING[state["reason"]]
        task.phase = Phase.FAILED
        task.reason = f"pod {pod_name}: {state['reason']}: {state.get('message') or hint} ({hint})"
        task.code = ReasonCode.CONFIG_MISSING if state["reason"] == CONFIG_WAITING else ReasonCode.IMAGE_PULL
    elif (deadline := schedule_deadline(pod)) is not None and now >= deadline:
        timeout = _annotation(pod, SCHEDULE_TIMEOUT, str(DEFAULT_SCHEDULE_TIMEOUT))
        message = scheduler_messages.get(pod_name) or _scheduled_condition_message(pod)
        task.phase = Phase.FAILED
        task.reason = (f"pod {pod_name} unschedulable for more than {timeout}s (schedule_timeout_seconds); "
                       f"the scheduler says: {message}")
        task.code = ReasonCode.UNSCHEDULABLE
    elif kind == "waiting":
        task.reason = state.get("reason")
    elif unschedulable_since(pod) is not None:
        task.reason = f"waiting for a node: {_scheduled_condition_message(pod)}"


def _failed(task: TaskStatus, pod: dict) -> None:
    """Why a failed pod failed: evicted, past its deadline, preempted, out of memory, an exit
    code (the reason left empty: the Job's verdict decides), or before its container ran."""
    pod_name = _meta(pod)["name"]
    status = pod.get("status") or {}
    kind, state = _container_state(pod)
    disrupted = any(c.get("type") == "DisruptionTarget" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
    if status.get("reason") == "Evicted" or (disrupted and kind != "terminated"):
        task.reason = f"Evicted: pod {pod_name}: {status.get('message') or 'the node ran short of resources'}"
        task.code = ReasonCode.EVICTED
    elif status.get("reason") == "DeadlineExceeded":
        task.reason = f"DeadlineExceeded: pod {pod_name} ran past activeDeadlineSeconds"
        task.code = ReasonCode.DEADLINE_EXCEEDED
    elif kind == "terminated":
        task.exit_code = int(state.get("exitCode", 1))
        if disrupted and (disruption(pod) or ("", None))[0] == EVICTION_API:
            task.reason = (f"Evicted: pod {pod_name} evicted from node {node_of(pod)} through the Eviction API "
                           f"(a drain?) ({describe_exit(task.exit_code)})")
            task.code = ReasonCode.EVICTED
        elif disrupted:
            task.reason = f"Preempted: pod {pod_name} was disrupted ({describe_exit(task.exit_code)})"
            task.code = ReasonCode.PREEMPTED
        elif state.get("reason") == "OOMKilled":
            limit = _limit(pod, "memory")
            task.reason = (f"OOMKilled: pod {pod_name} ran out of memory "
                           f"({f'limit {limit}' if limit else 'no memory limit set'}); "
                           f"raise roles.{task.role}.resources.limits.memory")
            task.code = ReasonCode.OOM_KILLED
    else:
        task.reason = (f"pod {pod_name}: {status.get('reason') or 'Failed'}: "
                       f"{status.get('message') or 'the pod failed before its container ran'}")


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
