"""How a group lives with its nodes: how soon its pods leave a lost node (tolerations), how it
spreads over nodes (preferred pod anti-affinity), whether a drain may interrupt it (a
PodDisruptionBudget), and which pods stuck ``Terminating`` on a lost node the backend
force-deletes so that the Job controller replaces them.

A lost node (its kubelet gone) is marked ``NotReady`` by the node lifecycle controller after its
``node-monitor-grace-period`` (40 to 50 s by default) and tainted
``node.kubernetes.io/unreachable:NoExecute``; the taint eviction controller then deletes the pods
that tolerate the taint no longer (``tolerationSeconds``; Kubernetes' admission default is 300 s),
marking them with a ``DisruptionTarget`` condition (reason ``DeletionByTaintManager``). Their
kubelet cannot confirm the deletion, so they stay ``Terminating``, and a Job with a
``podFailurePolicy`` replaces a pod only once it is terminal (``podReplacementPolicy: Failed``,
the only one allowed with a policy): without help the task would wait for the node forever.
A force deletion alone does not help (seen on a real plane): the pod keeps the Job's tracking
finalizer and its ``Running`` phase, so the Job still waits. The backend therefore does what the pod
garbage collector does for pods on a node marked out of service: it marks the pod ``Failed`` (the
Job controller replaces it within a second or so, the disruption not counted, and removes its
finalizer) and deletes it with grace 0, so nothing is left ``Terminating``.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Collection
from typing import Any

from .labels import GROUP_LABEL, INDEX_LABEL, JOB_NAME_LABEL, ROLE_LABEL

UNREACHABLE = "node.kubernetes.io/unreachable"
NOT_READY = "node.kubernetes.io/not-ready"
DEFAULT_UNREACHABLE_TOLERATION_SECONDS = 30
"""How long a group's pod stays bound to a node judged lost before it is evicted (and replaced):
long enough to ride out a kubelet restart, far shorter than Kubernetes' 300 s, which would leave a
whole group idle for five minutes waiting for one task."""
FORCE_DELETE_AFTER_SECONDS = 10
"""How far past the end of its grace period a pod evicted from a lost node must be before the
backend force-deletes it: its kubelet had the grace period and this much more to confirm."""
TAINT_EVICTION = "DeletionByTaintManager"
"""The reason of the ``DisruptionTarget`` condition the taint eviction controller sets."""
LOST_NODE_REASONS = (TAINT_EVICTION, "DeletionByPodGC")
"""``DisruptionTarget`` reasons of a pod whose node was lost: evicted by its taint, or removed by the
pod garbage collector once the Node was deleted or marked out of service."""
EVICTION_API = "EvictionByEvictionAPI"
"""The reason of the ``DisruptionTarget`` condition of a pod evicted through the Eviction API (a drain)."""

SPREAD_WEIGHTS = {"ps": 100, "worker": 50}
"""Preferred anti-affinity weights: a parameter server away from the trainers matters most (its
node lost takes every variable and table slice with it), workers away from each other less."""


def node_tolerations(own: list[dict], seconds: int | None) -> list[dict]:
    """The pod's tolerations: the user's, then the backend's for ``unreachable`` and ``not-ready``
    (NoExecute, ``seconds``) for each key the user did not tolerate already; none of the backend's
    when ``seconds`` is None (Kubernetes' own default then applies)."""
    if seconds is None:
        return list(own)
    keys = {t.get("key") for t in own}
    return list(own) + [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
                        for key in (UNREACHABLE, NOT_READY) if key not in keys]


def _away_from(group: str, roles: list[str], weight: int) -> dict:
    return {"weight": weight, "podAffinityTerm": {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": {GROUP_LABEL: group},
                          "matchExpressions": [{"key": ROLE_LABEL, "operator": "In", "values": roles}]}}}


def spread_affinity(group: str, role: str) -> dict | None:
    """The default affinity of a task of ``role``: the parameter servers prefer nodes without the
    group's trainers, the workers nodes without another worker of the group (the scheduler
    weighs both ways, so a chief placed after its ps avoids it too). None for other roles."""
    if role == "ps":
        terms = [_away_from(group, ["chief", "worker"], SPREAD_WEIGHTS["ps"])]
    elif role == "worker":
        terms = [_away_from(group, ["worker"], SPREAD_WEIGHTS["worker"])]
    else:
        return None
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}


def disruption_budget(name: str, namespace: str, labels: dict[str, str], group: str) -> dict:
    """A PodDisruptionBudget that lets no pod of the group be evicted through the Eviction API
    (``kubectl drain`` waits instead): ``maxUnavailable: 0``."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {GROUP_LABEL: group}}}}


def _condition(obj: dict, kind: str, status: str = "True") -> dict | None:
    """The condition ``kind`` of a pod or Job when it has ``status``, else None."""
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c.get("type") == kind and c.get("status") == status), None)


def _time(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def disruption(pod: dict) -> tuple[str, dt.datetime | None] | None:
    """(the ``DisruptionTarget`` condition's reason, when it was set) of a pod Kubernetes
    disrupted, or None."""
    cond = _condition(pod, "DisruptionTarget")
    return None if cond is None else (cond.get("reason") or "", _time(cond.get("lastTransitionTime")))


def release_due(pod: dict) -> dt.datetime | None:
    """When a pod the taint eviction controller deleted (its node judged lost) is to be released if
    still not terminal: ``FORCE_DELETE_AFTER_SECONDS`` after its grace period ended (its kubelet is
    not there to confirm, and the Job replaces it only once it is gone); None for any other pod.
    Read from the pod alone."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    deleting = _time(meta.get("deletionTimestamp"))
    evicted = disruption(pod)
    if deleting is None or evicted is None or evicted[0] not in LOST_NODE_REASONS:
        return None
    if meta.get("deletionGracePeriodSeconds") == 0:  # force-deleted already
        return None
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    # deletionTimestamp is the end of the grace period (the deletion time plus the grace).
    return deleting + dt.timedelta(seconds=FORCE_DELETE_AFTER_SECONDS)


def stuck_on_lost_node(pod: dict, now: dt.datetime) -> bool:
    """A pod evicted from a lost node whose release is due (:func:`release_due`)."""
    due = release_due(pod)
    return due is not None and now >= due


def lost_pods(pods: list[dict], now: dt.datetime) -> list[dict]:
    """The group's pods to force-delete now (see :func:`stuck_on_lost_node`)."""
    return [p for p in pods if stuck_on_lost_node(p, now)]


def failed_on_lost_node(pod: dict) -> dict:
    """The status patch that marks a pod stuck on a lost node ``Failed``, as the pod garbage
    collector marks the pods it removes: the Job controller replaces a pod only once it is terminal
    (a force deletion alone leaves it ``Running`` behind the Job's tracking finalizer). The uid
    makes the patch fail (409) on a newer pod of the same name."""
    return {"metadata": {"uid": (pod.get("metadata") or {}).get("uid")},
            "status": {"phase": "Failed", "reason": "NodeLost",
                       "message": f"node {node_of(pod)} judged lost; marked Failed by airflow-tf so that its Job "
                                  "replaces the pod"}}


def node_of(pod: dict) -> str:
    return (pod.get("spec") or {}).get("nodeName") or "?"


FORCE_DELETE_MISSES = (404, 409)
"""API statuses of a force deletion that finds the pod gone (404) or replaced by a newer pod of its
name (409, the uid precondition): nothing is left to release."""


@dataclasses.dataclass(frozen=True)
class ForceDeletion:
    """How the backend releases a pod stuck on a lost node, whichever client sends the calls (the
    status read's sync one, the watch's async one): patch its status with ``status_patch`` (marked
    ``Failed``: its Job replaces it at once, the disruption not counted), then delete it with
    ``delete_options`` (grace 0, so nothing is left ``Terminating``). Both carry the pod's uid,
    which spares a newer pod of the same name. A call failing with a status in
    :data:`FORCE_DELETE_MISSES` means the pod needs no release any more."""

    pod: str
    namespace: str
    node: str
    status_patch: dict
    delete_options: dict

    @property
    def marking(self) -> str:
        """What the status patch does, for an error message."""
        return f"mark pod {self.pod} Failed in namespace {self.namespace}"

    @property
    def deleting(self) -> str:
        """What the deletion does, for an error message."""
        return f"force-delete pod {self.pod} in namespace {self.namespace}"

    def done(self, log: logging.Logger) -> None:
        """Log the release on the caller's logger (the status read's or the watch's)."""
        log.warning("pod %s marked Failed and force-deleted: its node %s was judged lost and Kubernetes evicted "
                    "the pod, which its kubelet cannot confirm; its Job replaces it on another node",
                    self.pod, self.node)


def force_deletion(pod: dict, namespace: str) -> ForceDeletion:
    """The release of ``pod`` (one of :func:`lost_pods`) in ``namespace``."""
    meta = pod.get("metadata") or {}
    return ForceDeletion(pod=meta["name"], namespace=namespace, node=node_of(pod),
                         status_patch=failed_on_lost_node(pod),
                         delete_options={"gracePeriodSeconds": 0, "preconditions": {"uid": meta.get("uid")}})


# -- a task cut off from its group (its node's pod network cut, the kubelet still Ready) ------------
CUT_OFF_AFTER_SECONDS = 5
"""How long a task must have been not Ready (its readiness probe failed ``HEALTH_FAILURES`` times
in a row: no other task of its group answered) before the backend moves it: one more question."""
CUT_NODE_READY_SECONDS = 90
"""How long a task started on a node its group was cut off on (see :func:`cut_nodes`) has to turn
Ready before it is judged cut off too, never Ready as it is: a task's start (TensorFlow's import,
its server, one question of its peers) took well under that on a loaded node here. Without it, a
trainer restarted onto that node, which the scheduler's spreading favours once it is empty, would
never reach its group and the training would wait for good."""
HOSTNAME = "kubernetes.io/hostname"
PEERS_ANSWERED = "/tmp/airflow-tf-peers-answered"
"""The file a task's liveness probe keeps while another task of its group answers it, and its
readiness probe checks (:func:`.manifests.health_probes`)."""
MOVING = "airflow-tf/moving-off-node"
"""A Job's annotation while the backend moves one of its tasks off a node (JSON: task, node, at):
the Job is suspended until its pods are gone, then resumed with that node excluded."""
MOVED = "airflow-tf/moved-off-nodes"
"""A Job's annotation: the moves done (JSON list of task, node, at), for the group's status."""


def _running_since(pod: dict) -> dt.datetime | None:
    """When the pod's containers all run (the latest start), else None."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    starts = [_time(((s.get("state") or {}).get("running") or {}).get("startedAt")) for s in statuses]
    return max(starts) if starts and all(starts) else None  # type: ignore[type-var]


def _peers_probed(pod: dict) -> bool:
    """Whether the pod's readiness is the peers' question (not a probe of the user's)."""
    return any(PEERS_ANSWERED in json.dumps(c.get("readinessProbe") or {})
               for c in (pod.get("spec") or {}).get("containers") or [])


@dataclasses.dataclass(frozen=True)
class _Clock:
    """The verdict's clock on a pod not Ready (:func:`cut_off_due`)."""

    due: dt.datetime
    peers_ready_before: dt.datetime | None
    """Another pod must have been Ready since then for the verdict (None: any Ready pod will do)."""


def _cut_off_clock(pod: dict, cut: Collection[str]) -> _Clock | None:
    """The verdict's clock on ``pod``, if it runs (:func:`cut_off_due`, :func:`cut_off_pods`)."""
    ready, running = _condition(pod, "ContainersReady", "False"), _running_since(pod)
    if (not _peers_probed(pod) or ready is None or running is None
            or (pod.get("status") or {}).get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp")):
        return None
    since = _time(ready.get("lastTransitionTime"))
    if since is not None and since > running:
        return _Clock(since + dt.timedelta(seconds=CUT_OFF_AFTER_SECONDS), peers_ready_before=since)
    if node_of(pod) in cut:  # nobody there turned Ready by reaching it: any Ready pod reaches the others
        return _Clock(running + dt.timedelta(seconds=CUT_NODE_READY_SECONDS), peers_ready_before=None)
    return None


def cut_off_due(pod: dict, cut: Collection[str] = ()) -> dt.datetime | None:
    """When a running pod with the peers' readiness probe that turned not Ready is to be judged
    (:func:`cut_off_pods`), else None. Read from the pod alone: its ``ContainersReady``, which only
    its kubelet sets (the node lifecycle controller marks the pods of a node it judges lost not
    ``Ready`` and leaves that; they are the lost node's, :func:`release_due`). A pod never Ready
    since its container started is judged only on a node in ``cut`` (:func:`cut_nodes`), after
    ``CUT_NODE_READY_SECONDS``; elsewhere its peers may simply not be up yet."""
    clock = _cut_off_clock(pod, cut)
    return None if clock is None else clock.due


def cut_nodes(jobs: list[dict]) -> frozenset[str]:
    """The nodes the group moved a task off, or is moving one off: its pod network there was cut."""
    return frozenset(note["node"] for job in jobs for note in [*moves(job), moving(job)] if note)


def cut_off_pods(pods: list[dict], now: dt.datetime, cut: Collection[str] = ()) -> list[dict]:
    """The group's pods cut off from it: running pods with the peers' readiness probe
    (:func:`.manifests.health_probes`) that were Ready and have not been for
    ``CUT_OFF_AFTER_SECONDS`` (no other task answered their question), or that never were on a
    node in ``cut`` (:func:`cut_off_due`), while another pod of the group is Ready: the others
    still reach each other (pods on one node reach each other whatever befell the node's
    network). For a pod that was Ready, the other must have been Ready since before it turned not
    Ready: a peer restarted meanwhile turns Ready by reaching this very task, which proves nothing."""
    live = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
            and not (p.get("metadata") or {}).get("deletionTimestamp")]
    ready_since = {_name(p): _time(c.get("lastTransitionTime")) for p in live if (c := _condition(p, "Ready"))}
    judged = []
    for pod in live:
        clock = _cut_off_clock(pod, cut)
        if clock is None or now < clock.due:
            continue
        before = clock.peers_ready_before
        if any(name != _name(pod) and (before is None or since is None or since <= before)
               for name, since in ready_since.items()):
            judged.append(pod)
    return judged


def _name(pod: dict) -> str:
    return (pod.get("metadata") or {}).get("name") or ""


def job_of(pod: dict) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(JOB_NAME_LABEL)


def _annotation(job: dict, key: str) -> Any:
    text = ((job.get("metadata") or {}).get("annotations") or {}).get(key)
    return json.loads(text) if text else None


def moving(job: dict) -> dict | None:
    """The move under way in ``job`` (task, node, at), or None."""
    return _annotation(job, MOVING)


def moves(job: dict) -> list[dict]:
    """The moves done in ``job`` (task, node, at), oldest first."""
    return _annotation(job, MOVED) or []


@dataclasses.dataclass(frozen=True)
class JobPatch:
    """A patch of a group's Job the backend sends through whichever client (the status read's,
    the watch's), and what to log once it is done."""

    job: str
    namespace: str
    patch: dict
    doing: str
    """What the patch does, for an error message."""
    done: str
    """What was done, for the task log."""


def move_off(pod: dict, job: dict, namespace: str, now: dt.datetime) -> JobPatch | None:
    """The first step of moving a cut-off pod's task to another node: suspend its Job (the Job
    controller deletes the Job's pods; a running Job's pod template cannot change) and note the
    move. None when a move of that Job is under way already."""
    if moving(job) is not None or (job.get("spec") or {}).get("suspend"):
        return None
    created = _time((pod.get("metadata") or {}).get("creationTimestamp"))
    if created is not None and any((at := _time(m.get("at"))) is not None and created < at for m in moves(job)):
        return None  # an attempt from before the last move, on its way out
    labels = (pod.get("metadata") or {}).get("labels") or {}
    task, node, name = f"{labels.get(ROLE_LABEL)}-{labels.get(INDEX_LABEL)}", node_of(pod), (job.get("metadata") or {})["name"]
    note = {"task": task, "node": node, "at": now.isoformat().replace("+00:00", "Z")}
    return JobPatch(job=name, namespace=namespace,
                    patch={"metadata": {"annotations": {MOVING: json.dumps(note)}}, "spec": {"suspend": True}},
                    doing=f"suspend Job {name} in namespace {namespace} to move {task} off node {node}",
                    done=f"{task} cut off from its group on node {node} (no other task answered its health "
                         f"question): Job {name} suspended, to be resumed without that node once its pods are gone")


def _without(affinity: dict | None, node: str) -> dict:
    """``affinity`` (a pod's) whose required node affinity also excludes ``node``."""
    affinity = copy.deepcopy(affinity or {})
    required = affinity.setdefault("nodeAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    away = {"key": HOSTNAME, "operator": "NotIn", "values": [node]}
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [{**t, "matchExpressions": [*(t.get("matchExpressions") or []), away]}
                                     for t in terms]
    return affinity


def resume_elsewhere(job: dict, namespace: str) -> JobPatch | None:
    """The second step, once the Job suspended by :func:`move_off` has no active pod left (the
    JobSuspended condition: its pod template is mutable then): resume it with the node excluded
    from its pods' required node affinity, and the move recorded. None while not due."""
    note = moving(job)
    status = job.get("status") or {}
    if note is None or _condition(job, "Suspended") is None or status.get("active"):
        return None
    name, template = (job.get("metadata") or {})["name"], (job.get("spec") or {}).get("template") or {}
    affinity = _without((template.get("spec") or {}).get("affinity"), note["node"])
    return JobPatch(job=name, namespace=namespace,
                    patch={"metadata": {"annotations": {MOVING: None, MOVED: json.dumps([*moves(job), note])}},
                           "spec": {"suspend": False, "template": {"spec": {"affinity": affinity}}}},
                    doing=f"resume Job {name} in namespace {namespace} without node {note['node']}",
                    done=f"Job {name} resumed: {note['task']} and the other tasks of its role start again on "
                         f"nodes other than {note['node']}")


def job_patches(jobs: list[dict], pods: list[dict], namespace: str, now: dt.datetime) -> list[JobPatch]:
    """The Job patches that move the group's cut-off tasks (:func:`cut_off_pods`) off their nodes,
    each step when due."""
    by_name = {(j.get("metadata") or {}).get("name"): j for j in jobs}
    patches = [p for j in jobs if (p := resume_elsewhere(j, namespace)) is not None]
    started: set[str] = set()
    for pod in cut_off_pods(pods, now, cut_nodes(jobs)):
        job = by_name.get(job_of(pod))
        if job is None or job_of(pod) in started:
            continue
        patch = move_off(pod, job, namespace, now)
        if patch is not None:
            started.add(patch.job)
            patches.append(patch)
    return patches
