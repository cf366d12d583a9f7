"""The JobSet workload form (``workload="jobset"``): a training group as ONE JobSet
(``jobset.x-k8s.io/v1alpha2``, JobSet v0.11), so that Kueue admits it as one Workload, whole or
not at all. Each role with tasks is a replicated job (``replicas: 1``) whose Job is the same
Indexed Job as the Jobs form's (:func:`.manifests.role_job`: environment with TF_CONFIG, probes,
placement, volumes, per-task restarts), in this order: ps, worker, chief, evaluator.

What the JobSet adds, and how each keeps the Jobs form's meaning:

- **Names.** The JobSet is named after the group; its controller names a role's Job
  ``<group>-<role>-0`` and the Job controller a pod's host ``<group>-<role>-0-<index>``. So a
  task's address in TF_CONFIG is ``<group>-<role>-0-<index>.<service>.<namespace>.svc[.<cluster
  domain>]:<port>`` (:func:`jobset_task_address`): the Jobs form's with the JobSet's job index,
  the only part of a pod's DNS name the backend cannot choose. The subdomain is today's Service
  name (``network.subdomain``); the JobSet controller makes that headless Service and owns it.
- **Restarts.** As in the Jobs form, the Job controller restarts a failed task within
  ``backoffLimitPerIndex`` (a killed ps comes back under the same name) and, under the
  ``ExitCode`` restart policy, fails the Job at once on a program error. The JobSet's
  ``failurePolicy`` then fails the whole group on the first failed Job (``FailJobSet``,
  ``maxRestarts: 0``): a group is never recreated behind Airflow's back.
- **Success.** ``successPolicy`` All on the trainers' replicated jobs: ``AllWorkers`` waits for
  the workers' (and the chief's) Jobs; ``ChiefOrWorker0`` for the lead trainer's Job, which
  completes when its index 0 succeeds (its own ``successPolicy``, as in the Jobs form). Once the
  JobSet completes, its controller deletes the Jobs still running: the parameter servers.
- **Start.** ``startupPolicy`` InOrder: the ps first; each next role once the one before is ready.
- **Queue.** With ``queue_name`` (the same for every role) the JobSet carries Kueue's queue label
  and is created ``suspend: true``; its Jobs carry no queue label (Kueue admits the JobSet). With
  ``workload_priority_class`` too, it carries Kueue's priority label: a group of a higher
  WorkloadPriorityClass preempts a running lower one, which Kueue suspends whole.
- **Lifetime.** ``ttlSecondsAfterFinished`` on the JobSet removes the whole group; the ps Job's
  ``activeDeadlineSeconds`` bounds the parameter servers as in the Jobs form.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from airflow_tf.cluster import CHIEF_OR_WORKER0, GroupSpec, SpecError

from ..base import BackendError

from .labels import GROUP_LABEL, KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL, REPLICAS, SUCCESS_POLICY
from .manifests import (
    DEFAULT_PS_MAX_LIFETIME_SECONDS,
    DEFAULT_TTL_SECONDS_AFTER_FINISHED,
    Group,
    Role,
    group_selector,
    job_name,
    owned_by,
    plan_group,
    render,
    role_job,
    service_name,
)
from .nodes import DEFAULT_UNREACHABLE_TOLERATION_SECONDS, disruption_budget as budget
from .workloads import refuse_priority_without_queue

log = logging.getLogger(__name__)

API_VERSION = "jobset.x-k8s.io/v1alpha2"
START_ORDER = ("ps", "worker", "chief", "evaluator")
"""The replicated jobs' order, which ``startupPolicy: InOrder`` follows."""
JOB_INDEX = 0
"""The JobSet's index of a replicated job's only Job (``replicas: 1``)."""
FAILURE_RULE = "FailGroupOnFailedJob"


def jobset_host(group: str, role: str, index: int) -> str:
    """A task's pod host: the Job controller's ``<job>-<index>``, the Job being the JobSet
    controller's ``<jobset>-<replicated job>-<job index>``."""
    return f"{job_name(group, role)}-{JOB_INDEX}-{index}"


def jobset_task_address(group: str, role: str, index: int, namespace: str, port: int, *,
                        cluster_domain: str | None = None) -> str:
    """``<group>-<role>-0-<index>.<service>.<namespace>.svc[.<cluster domain>]:<port>``."""
    host = f"{jobset_host(group, role, index)}.{service_name(group)}.{namespace}.svc"
    return host + (f".{cluster_domain}" if cluster_domain else "") + f":{port}"


_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
POD_NAME_SUFFIX = "-abcde"
"""The random suffix of a pod's generated name, as the JobSet webhook counts it."""


def check_names(spec: GroupSpec) -> None:
    """What the JobSet webhook checks of a JobSet's names, checked before anything is sent: the
    longest pod name of each replicated job (``<group>-<role>-0-<last index>-xxxxx``) must be a
    DNS-1035 label, so at most 63 characters starting with a letter."""
    for role, _ in spec.tasks():
        longest = jobset_host(spec.name, role, spec.replicas(role) - 1) + POD_NAME_SUFFIX
        if not _DNS1035_LABEL.match(longest):
            spare = 63 - len(longest) + len(spec.name)
            raise SpecError(
                f"name: with workload='jobset' the {role} pods are named like {longest!r} ({len(longest)} characters), "
                "which must be a DNS-1035 label (at most 63 characters, starting with a letter); "
                f"use a group name of at most {spare} characters that starts with a letter")


def _queue(roles: dict[str, Role], key: str = "queue_name", what: str = "queue") -> str | None:
    """The group's one Kueue queue (or WorkloadPriorityClass): a JobSet is one Workload, so every
    role names the same one."""
    queues = {name: getattr(role.options, key) for name, role in roles.items()}
    if len(set(queues.values())) > 1:
        raise SpecError(f"{key}: a JobSet is admitted as one Kueue Workload, so every role must name the same "
                        f"{what} (set it once in pod_defaults); got "
                        + ", ".join(f"{role}: {queue!r}" for role, queue in sorted(queues.items())))
    return next(iter(queues.values()), None)


def _priority(roles: dict[str, Role], queue: str | None) -> str | None:
    """The group's Kueue WorkloadPriorityClass, which only a queued group can have."""
    priority = _queue(roles, "workload_priority_class", "WorkloadPriorityClass")
    refuse_priority_without_queue(priority, queue)
    return priority


def _replicated_job(group: Group, role: Role) -> dict[str, Any]:
    """A role's replicated job: the Jobs form's Job as a template (its name and namespace are
    the JobSet controller's to set)."""
    job = role_job(group, role, standalone=False)
    spec = dict(job["spec"])
    spec.pop("suspend", None)  # the JobSet controller suspends and resumes its Jobs
    meta = job["metadata"]
    return {"name": role.name,
            "template": {"metadata": {"labels": meta["labels"], "annotations": meta["annotations"]}, "spec": spec}}


def success_policy(group: Group, roles: dict[str, Role]) -> dict[str, Any]:
    """All of the trainers' Jobs: every worker's and chief's (``AllWorkers``), or the lead
    trainer's, which completes with its index 0 (``ChiefOrWorker0``)."""
    if group.spec.success_policy == CHIEF_OR_WORKER0:
        targets = [group.root]
    else:
        targets = [r for r in START_ORDER if r in roles and r in group.spec.training_roles()]
    return {"operator": "All", "targetReplicatedJobs": targets}


def render_jobset(spec: GroupSpec, namespace: str, *, cluster_domain: str | None = None,
                  network_policy: bool = False, pod_defaults: dict[str, Any] | None = None,
                  ttl_seconds_after_finished: int | None = DEFAULT_TTL_SECONDS_AFTER_FINISHED,
                  ps_max_lifetime_seconds: int = DEFAULT_PS_MAX_LIFETIME_SECONDS,
                  unreachable_toleration_seconds: int | None = DEFAULT_UNREACHABLE_TOLERATION_SECONDS,
                  spread_over_nodes: bool = True, disruption_budget: bool = False) -> list[dict]:
    """Every object of the group, in creation order: the JobSet, then the NetworkPolicy and the
    PodDisruptionBudget (if asked)."""
    check_names(spec)
    group, roles = plan_group(
        spec, namespace, lambda role, index: jobset_task_address(spec.name, role, index, namespace, spec.port,
                                                                 cluster_domain=cluster_domain),
        cluster_domain=cluster_domain, pod_defaults=pod_defaults,
        ttl_seconds_after_finished=ttl_seconds_after_finished, ps_max_lifetime_seconds=ps_max_lifetime_seconds,
        unreachable_toleration_seconds=unreachable_toleration_seconds, spread_over_nodes=spread_over_nodes)
    queue = _queue(roles)
    priority = _priority(roles, queue)
    root = roles[group.root].options
    objects = render(
        "jobset.yaml.j2", name=spec.name, namespace=namespace,
        labels={**root.labels, **group.labels, **({KUEUE_QUEUE_LABEL: queue} if queue else {}),
                **({KUEUE_PRIORITY_LABEL: priority} if priority else {})},
        annotations={**root.annotations, **group.annotations, SUCCESS_POLICY: spec.success_policy,
                     REPLICAS: group.replicas},
        suspend=queue is not None, subdomain=service_name(spec.name),
        success_policy=success_policy(group, roles),
        failure_policy={"maxRestarts": 0, "rules": [{"name": FAILURE_RULE, "action": "FailJobSet"}]},
        ttl_seconds_after_finished=ttl_seconds_after_finished,
        replicated_jobs=[_replicated_job(group, roles[r]) for r in START_ORDER if r in roles],
    )
    if network_policy:
        objects += render("networkpolicy.yaml.j2", name=f"{spec.name}-grpc", namespace=namespace,
                          labels=group.labels, selector={GROUP_LABEL: spec.name}, port=spec.port)
    if disruption_budget:
        objects.append(budget(spec.name, namespace, group.labels, spec.name))
    return objects


# -- the live group: launch, find, status, teardown of a JobSet ---------------------------------
JOBSET_GROUP, JOBSET_VERSION, JOBSETS = "jobset.x-k8s.io", "v1alpha2", "jobsets"
KUEUE_GROUP, KUEUE_VERSION, WORKLOADS = "kueue.x-k8s.io", "v1beta2", "workloads"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
"""On the Kueue Workload of a job-like object: that object's uid."""


def is_jobset(ref: Any) -> bool:
    """Whether the group of ``ref`` was launched as one JobSet."""
    return (ref.options or {}).get("workload") == "jobset"


def lead_template(jobset: dict) -> dict | None:
    """The lead trainer's pod template (the evaluation and export Jobs reuse it)."""
    jobs = {r["name"]: r for r in (jobset.get("spec") or {}).get("replicatedJobs") or []}
    for name in ("chief", "worker"):  # the group's root role: its chief, else its workers
        if name in jobs:
            return ((jobs[name].get("template") or {}).get("spec") or {}).get("template")
    return None


def queue_reason(workloads: list[dict]) -> str | None:
    """Why Kueue keeps a JobSet suspended, from its Workload's conditions: evicted (preempted) or
    not admitted yet, with Kueue's own message (e.g. not enough quota in the ClusterQueue)."""
    if not workloads:
        return "Kueue has made no Workload for it yet (is Kueue running, with the jobset.x-k8s.io/jobset integration?)"
    conditions = {c.get("type"): c for c in (workloads[0].get("status") or {}).get("conditions") or []}
    evicted = conditions.get("Evicted")
    if evicted and evicted.get("status") == "True":
        return f"evicted by Kueue ({evicted.get('reason')}): {evicted.get('message') or ''}".rstrip(": ")
    for kind in ("QuotaReserved", "Admitted"):
        cond = conditions.get(kind)
        if cond and cond.get("status") == "False" and cond.get("message"):
            return cond["message"]
    return None


class JobSetGroup:
    """The Kubernetes calls for a group launched as one JobSet, made through the backend's
    connection (its hook, error wording and Job, pod and NetworkPolicy calls)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    @property
    def _custom(self):
        from kubernetes import client

        return client.CustomObjectsApi(api_client=self.backend.hook.api_client)

    def list_jobsets(self, namespace: str, group: str) -> list[dict]:
        try:
            with self.backend._api(f"list jobsets of group {group} in namespace {namespace}"):
                result = self._custom.list_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSETS,
                                                                    label_selector=group_selector(group))
        except BackendError as e:
            raise _without_crd(e) from e.__cause__
        return [j for j in result.get("items") or [] if j["metadata"]["name"] == group]

    def get(self, namespace: str, group: str) -> dict | None:
        return next(iter(self.list_jobsets(namespace, group)), None)

    def workloads(self, namespace: str, jobset: dict) -> list[dict] | None:
        """Kueue's Workloads of the JobSet; None when they cannot be read (no Kueue, no right)."""
        from kubernetes.client.exceptions import ApiException

        uid = jobset["metadata"].get("uid")
        try:
            result = self._custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOADS,
                                                                label_selector=f"{KUEUE_JOB_UID_LABEL}={uid}")
        except ApiException as e:
            if e.status in (403, 404):
                log.warning("cannot read Kueue's Workload of JobSet %s (HTTP %s); grant 'list' on workloads "
                            "(kueue.x-k8s.io, airflow_tf/rbac/role.yaml) to see why it waits", _name(jobset), e.status)
                return None
            raise
        return result.get("items") or []

    def view(self, namespace: str, group: str) -> dict[str, Any]:
        """What assess() reads of the JobSet: the JobSet itself, and why its queue holds it."""
        jobset = self.get(namespace, group)
        reason = None
        if jobset is not None and (jobset.get("spec") or {}).get("suspend") and _queue_of(jobset):
            workloads = self.workloads(namespace, jobset)
            reason = None if workloads is None else queue_reason(workloads)
        return {"jobset": jobset, "queue_reason": reason}

    def launch(self, spec: GroupSpec, objects: list[dict]) -> tuple[dict, list[str]]:
        """Create the JobSet (re-attach to it when it exists) and what it owns; the JobSet as
        stored and what was created."""
        from kubernetes.client.exceptions import ApiException

        namespace, body = self.backend.namespace, objects[0]
        created: list[str] = []
        jobset = self.get(namespace, spec.name)
        if jobset is None:
            try:
                with self.backend._api(f"create JobSet {spec.name} in namespace {namespace}"):
                    jobset = self._custom.create_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace,
                                                                          JOBSETS, body)
                created.append(f"JobSet/{spec.name}")
            except BackendError as e:
                if not (isinstance(e.__cause__, ApiException) and e.__cause__.status == 409):
                    raise _without_crd(e) from e.__cause__
                jobset = self.get(namespace, spec.name)  # created by a concurrent try since we listed
                if jobset is None:
                    raise BackendError(f"JobSet {spec.name} in namespace {namespace} exists but cannot be "
                                       "listed (being deleted?); launch again in a moment") from e
        existing = {_name(o) for o in self.backend._list("networkpolicies", namespace, group_selector(spec.name))} \
            if len(objects) > 1 else set()
        for obj in objects[1:]:
            if _name(obj) not in existing and self.backend._create(owned_by(obj, jobset)) is not None:
                created.append(f"{obj['kind']}/{_name(obj)}")
        return jobset, created

    def delete(self, namespace: str, name: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            with self.backend._api(f"delete JobSet {name} in namespace {namespace}"):
                self._custom.delete_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSETS, name,
                                                             propagation_policy="Background")
        except Exception as e:
            if isinstance(e.__cause__, ApiException) and e.__cause__.status == 404:
                return False
            raise
        return True


def _name(obj: dict) -> str:
    return obj["metadata"]["name"]


def _without_crd(error: BackendError) -> BackendError:
    """``error``, and when the API server answered 404 (no such resource), that the JobSet CRD may
    be missing."""
    cause = error.__cause__
    if getattr(cause, "status", None) == 404:
        return BackendError(f"{error}; or the JobSet CRD (jobset.x-k8s.io/v1alpha2) is not installed in this "
                            "cluster: install the JobSet controller (v0.11), or launch with workload='jobs'")
    return error


def _queue_of(jobset: dict) -> str | None:
    return (jobset["metadata"].get("labels") or {}).get(KUEUE_QUEUE_LABEL)


async def read_view(api: Any, namespace: str, group: str) -> dict[str, Any]:
    """:meth:`JobSetGroup.view` through the asynchronous client (the deferrable sensor's watch)."""
    from kubernetes_asyncio import client as async_client
    from kubernetes_asyncio.client.exceptions import ApiException

    custom = async_client.CustomObjectsApi(api)
    result = await custom.list_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSETS,
                                                        label_selector=group_selector(group))
    jobset = next((j for j in result.get("items") or [] if j["metadata"]["name"] == group), None)
    reason = None
    if jobset is not None and (jobset.get("spec") or {}).get("suspend") and _queue_of(jobset):
        try:
            workloads = await custom.list_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOADS,
                label_selector=f"{KUEUE_JOB_UID_LABEL}={jobset['metadata'].get('uid')}")
            reason = queue_reason(workloads.get("items") or [])
        except ApiException as e:
            if e.status not in (403, 404):
                raise
    return {"jobset": jobset, "queue_reason": reason}
