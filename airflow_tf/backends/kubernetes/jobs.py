"""The Jobs workload form: a training group as one Indexed ``batch/v1`` Job per role, one
headless Service (the pods' subdomain) and optionally a NetworkPolicy. What a task's pod holds
whatever the form (environment, probes, placement, volumes) is in :mod:`.manifests`.

Lifecycle (Kubernetes 1.31 or newer): the Job controller runs, restarts and fails the
tasks, also while no Airflow component runs. ``backoffLimitPerIndex`` is each task's
restart budget; ``podFailurePolicy`` does not count disruptions (preemption, eviction:
the ``DisruptionTarget`` condition) and, under the ``ExitCode`` restart policy, fails the
Job at once on a program error (exit codes 1-128, e.g. a refused model); ``maxFailedIndexes:
0`` fails it as soon as one task is out of restarts. The lead trainer's Job (the chief's,
else the workers') is the group's **root**: every other object has an ownerReference to
it, so deleting it (propagation Background) removes everything, and its
``ttlSecondsAfterFinished`` removes the whole group, parameter servers included, a while
after training ended even if Airflow never comes back. The parameter servers' Job never
completes by itself; its ``activeDeadlineSeconds`` (the group's deadline, else
``ps_max_lifetime_seconds``) bounds it when the root never finishes either.
"""

from __future__ import annotations

import json
import math
from typing import Any

from airflow_tf.cluster import GroupSpec, cluster_def

from .labels import (
    GROUP_LABEL,
    KUEUE_QUEUE_LABEL,
    REPLICAS,
    RESTART_POLICY,
    ROLE_LABEL,
    ROOT_ANNOTATION,
    SCHEDULE_TIMEOUT,
    SUCCESS_POLICY,
)
from .manifests import (
    DEFAULT_PS_MAX_LIFETIME_SECONDS,
    DEFAULT_TTL_SECONDS_AFTER_FINISHED,
    USER_ERROR_EXIT_CODES,
    Group,
    Role,
    check_group,
    extra_labels,
    health_probes,
    job_name,
    merge_pod_template,
    pod_settings,
    render,
    roles_of,
    root_role,
    service_name,
    task_address,
    task_env,
)


def _pod_failure_rules(role: Role) -> list[dict]:
    """Disruptions never count; under ``ExitCode`` a program error fails the Job at once."""
    rules: list[dict] = [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    if role.spec.restart_policy == "ExitCode":
        rules.append({"action": "FailJob", "onExitCodes": {
            "containerName": role.name, "operator": "In", "values": USER_ERROR_EXIT_CODES}})
    return rules


def _job_metadata(group: Group, role: Role) -> dict[str, dict[str, str]]:
    """Labels and annotations of the Job and of its pods."""
    opts = role.options
    labels = {**opts.labels, **group.labels, ROLE_LABEL: role.name}
    job_annotations = {**opts.annotations, **group.annotations, SUCCESS_POLICY: group.spec.success_policy,
                       REPLICAS: group.replicas, RESTART_POLICY: role.spec.restart_policy}
    if role.name == group.root:
        job_annotations[ROOT_ANNOTATION] = "true"
    return {
        "job_labels": {**labels, **({KUEUE_QUEUE_LABEL: opts.queue_name} if opts.queue_name else {})},
        "job_annotations": job_annotations,
        "pod_labels": labels,
        "pod_annotations": {**opts.annotations, SCHEDULE_TIMEOUT: f"{float(opts.schedule_timeout_seconds):g}"},
    }


def _lifecycle(group: Group, role: Role) -> dict[str, Any]:
    """The Job's restart budget, failure and success rules and how long it may live."""
    is_root = role.name == group.root
    return {
        "backoff_limit_per_index": 0 if role.spec.restart_policy == "Never" else group.spec.backoff_limit,
        "pod_failure_rules": _pod_failure_rules(role),
        "success_policy": ({"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}
                           if group.spec.success_policy == "ChiefOrWorker0" and is_root else None),
        "active_deadline_seconds": group.deadline or (
            group.ps_max_lifetime_seconds if group.serves_until_stopped(role.name) else None),
        "ttl_seconds_after_finished": group.ttl_seconds_after_finished if is_root else None,
        "suspend": role.options.queue_name is not None,
    }


def _role_job(group: Group, role: Role) -> dict:
    """One role's Indexed Job: its tasks are the Job's pods, index = task index."""
    spec = group.spec
    job = render(
        "job.yaml.j2", name=job_name(spec.name, role.name), namespace=group.namespace,
        replicas=spec.replicas(role.name), service=service_name(spec.name), role=role.name,
        image=role.spec.image or spec.image, command=spec.command(role.name), env=task_env(group, role),
        port=spec.port if role.name != "evaluator" else None, **health_probes(spec, role.name),
        **_job_metadata(group, role), **_lifecycle(group, role), **pod_settings(role.options, role.resources),
    )[0]
    if role.options.pod_template:
        job["spec"]["template"] = merge_pod_template(role.options.pod_template, job["spec"]["template"])
    return job


def render_group(spec: GroupSpec, namespace: str, *, cluster_domain: str | None = None,
                 network_policy: bool = False, pod_defaults: dict[str, Any] | None = None,
                 ttl_seconds_after_finished: int | None = DEFAULT_TTL_SECONDS_AFTER_FINISHED,
                 ps_max_lifetime_seconds: int = DEFAULT_PS_MAX_LIFETIME_SECONDS) -> list[dict]:
    """Every object of the group, in creation order: the root Job (the lead trainer's),
    the headless Service, the NetworkPolicy (if asked), the other Jobs."""
    check_group(spec, namespace, cluster_domain, {"ttl_seconds_after_finished": ttl_seconds_after_finished,
                                                   "ps_max_lifetime_seconds": ps_max_lifetime_seconds})
    roles = roles_of(spec, pod_defaults)
    airflow_labels, airflow_annotations = extra_labels(spec)
    group = Group(
        spec=spec, namespace=namespace, root=root_role(spec),
        cluster=cluster_def(spec, lambda role, index: task_address(
            spec.name, role, index, namespace, spec.port, cluster_domain=cluster_domain)),
        labels={**airflow_labels, GROUP_LABEL: spec.name}, annotations=airflow_annotations,
        replicas=json.dumps({role: spec.replicas(role) for role in roles}, sort_keys=True),
        deadline=math.ceil(spec.active_deadline_seconds) if spec.active_deadline_seconds else None,
        ttl_seconds_after_finished=ttl_seconds_after_finished, ps_max_lifetime_seconds=ps_max_lifetime_seconds,
    )
    jobs = {name: _role_job(group, role) for name, role in roles.items()}

    objects = [jobs.pop(group.root)]
    objects += render("service.yaml.j2", name=service_name(spec.name), namespace=namespace, labels=group.labels,
                       selector={GROUP_LABEL: spec.name}, port=spec.port)
    if network_policy:
        objects += render("networkpolicy.yaml.j2", name=f"{spec.name}-grpc", namespace=namespace,
                           labels=group.labels, selector={GROUP_LABEL: spec.name}, port=spec.port)
    return objects + list(jobs.values())


