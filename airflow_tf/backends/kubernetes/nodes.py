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

import dataclasses
import datetime as dt
import logging

from .labels import GROUP_LABEL, ROLE_LABEL

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


def _condition(pod: dict, kind: str) -> dict | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


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
