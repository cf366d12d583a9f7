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
  and is created ``suspend: true``; its Jobs carry no queue label (Kueue admits the JobSet).
- **Lifetime.** ``ttlSecondsAfterFinished`` on the JobSet removes the whole group; the ps Job's
  ``activeDeadlineSeconds`` bounds the parameter servers as in the Jobs form.
"""

from __future__ import annotations

import re
from typing import Any

from airflow_tf.cluster import GroupSpec, SpecError

from .labels import GROUP_LABEL, KUEUE_QUEUE_LABEL, REPLICAS, SUCCESS_POLICY
from .manifests import (
    DEFAULT_PS_MAX_LIFETIME_SECONDS,
    DEFAULT_TTL_SECONDS_AFTER_FINISHED,
    Group,
    Role,
    job_name,
    plan_group,
    render,
    role_job,
    service_name,
)

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


def _queue(roles: dict[str, Role]) -> str | None:
    """The group's one Kueue queue: a JobSet is one Workload, so every role names the same one."""
    queues = {name: role.options.queue_name for name, role in roles.items()}
    if len(set(queues.values())) > 1:
        raise SpecError("queue_name: a JobSet is admitted as one Kueue Workload, so every role must name the same "
                        "queue (set it once in pod_defaults); got "
                        + ", ".join(f"{role}: {queue!r}" for role, queue in sorted(queues.items())))
    return next(iter(queues.values()), None)


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
    if group.spec.success_policy == "ChiefOrWorker0":
        targets = [group.root]
    else:
        targets = [r for r in START_ORDER if r in roles and r in group.spec.training_roles()]
    return {"operator": "All", "targetReplicatedJobs": targets}


def render_jobset(spec: GroupSpec, namespace: str, *, cluster_domain: str | None = None,
                  network_policy: bool = False, pod_defaults: dict[str, Any] | None = None,
                  ttl_seconds_after_finished: int | None = DEFAULT_TTL_SECONDS_AFTER_FINISHED,
                  ps_max_lifetime_seconds: int = DEFAULT_PS_MAX_LIFETIME_SECONDS) -> list[dict]:
    """Every object of the group, in creation order: the JobSet, then the NetworkPolicy (if asked)."""
    check_names(spec)
    group, roles = plan_group(
        spec, namespace, lambda role, index: jobset_task_address(spec.name, role, index, namespace, spec.port,
                                                                 cluster_domain=cluster_domain),
        cluster_domain=cluster_domain, pod_defaults=pod_defaults,
        ttl_seconds_after_finished=ttl_seconds_after_finished, ps_max_lifetime_seconds=ps_max_lifetime_seconds)
    queue = _queue(roles)
    root = roles[group.root].options
    objects = render(
        "jobset.yaml.j2", name=spec.name, namespace=namespace,
        labels={**root.labels, **group.labels, **({KUEUE_QUEUE_LABEL: queue} if queue else {})},
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
    return objects
