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

This form takes no Kueue queue (``queue_name``): Kueue would admit each Job on its own, so a
group could run by halves; a queued group is one JobSet (:mod:`.jobset`, ``workload="jobset"``).
"""

from __future__ import annotations

from typing import Any

from airflow_tf.cluster import GroupSpec

from .labels import GROUP_LABEL
from .manifests import (
    DEFAULT_PS_MAX_LIFETIME_SECONDS,
    DEFAULT_TTL_SECONDS_AFTER_FINISHED,
    plan_group,
    render,
    role_job,
    service_name,
    task_address,
)
from .nodes import DEFAULT_UNREACHABLE_TOLERATION_SECONDS, disruption_budget as budget
from .workloads import refuse_queue_without_jobset


def render_group(spec: GroupSpec, namespace: str, *, cluster_domain: str | None = None,
                 network_policy: bool = False, pod_defaults: dict[str, Any] | None = None,
                 ttl_seconds_after_finished: int | None = DEFAULT_TTL_SECONDS_AFTER_FINISHED,
                 ps_max_lifetime_seconds: int = DEFAULT_PS_MAX_LIFETIME_SECONDS,
                 unreachable_toleration_seconds: int | None = DEFAULT_UNREACHABLE_TOLERATION_SECONDS,
                 spread_over_nodes: bool = True, disruption_budget: bool = False) -> list[dict]:
    """Every object of the group, in creation order: the root Job (the lead trainer's),
    the headless Service, the NetworkPolicy and the PodDisruptionBudget (if asked), the other Jobs."""
    group, roles = plan_group(
        spec, namespace, lambda role, index: task_address(spec.name, role, index, namespace, spec.port,
                                                          cluster_domain=cluster_domain),
        cluster_domain=cluster_domain, pod_defaults=pod_defaults,
        ttl_seconds_after_finished=ttl_seconds_after_finished, ps_max_lifetime_seconds=ps_max_lifetime_seconds,
        unreachable_toleration_seconds=unreachable_toleration_seconds, spread_over_nodes=spread_over_nodes)
    refuse_queue_without_jobset("jobs", (role.options.queue_name for role in roles.values()),
                                (role.options.workload_priority_class for role in roles.values()))
    jobs = {name: role_job(group, role) for name, role in roles.items()}

    objects = [jobs.pop(group.root)]
    objects += render("service.yaml.j2", name=service_name(spec.name), namespace=namespace, labels=group.labels,
                       selector={GROUP_LABEL: spec.name}, port=spec.port)
    if network_policy:
        objects += render("networkpolicy.yaml.j2", name=f"{spec.name}-grpc", namespace=namespace,
                           labels=group.labels, selector={GROUP_LABEL: spec.name}, port=spec.port)
    if disruption_budget:
        objects.append(budget(spec.name, namespace, group.labels, spec.name))
    return objects + list(jobs.values())
