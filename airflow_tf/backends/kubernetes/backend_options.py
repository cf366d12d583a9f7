"""The Kubernetes backend's options, the parameters of :class:`~.backend.KubernetesBackend`, each
declared once with its doc and its check (:data:`OPTIONS`): the constructor, the operators'
``backend_options`` and ``[airflow_tf] backend_options`` all go through them."""

from __future__ import annotations

from typing import Any

from airflow_tf.cluster import SpecError

from ..options import BackendOption, boolean, mapping, optional, path_option, seconds, text, whole_seconds
from .nodes import DEFAULT_UNREACHABLE_TOLERATION_SECONDS
from .pod_options import check_cluster_domain, check_image, check_namespace, pod_options
from .workloads import WORKLOADS, check_workload

TEAM_PLACEHOLDER = "{team}"
"""In the ``namespace`` option: the team of the task's DAG (Airflow's multi-team mode), filled in
when the task runs (:func:`airflow_tf.operators.common.resolved_backend`)."""


def _check_namespace(value: Any) -> str:
    try:
        check_namespace(value.replace(TEAM_PLACEHOLDER, "team") if isinstance(value, str) else value)
    except SpecError:
        raise ValueError("a Kubernetes namespace name (a DNS-1123 label: at most 63 lowercase letters, "
                         "digits and '-', starting and ending with a letter or digit), which may hold "
                         f"{TEAM_PLACEHOLDER}, the task's team") from None
    return value


def _check_cluster_domain(value: Any) -> str | None:
    try:
        return check_cluster_domain(value)
    except SpecError:
        raise ValueError("a DNS domain such as cluster.local (no trailing dot)") from None


def _check_image(value: Any) -> str:
    try:
        return check_image(value, "image")
    except SpecError:
        raise ValueError("a container image reference ([registry[:port]/]repository[:tag][@sha256:digest], "
                         "e.g. registry.example/tf:2.21)") from None


def _check_workload(value: Any) -> str:
    try:
        return check_workload(value)
    except SpecError:
        raise ValueError("a workload form, one of " + "; ".join(f"{name!r} ({doc})" for name, doc in WORKLOADS.items())) from None


def _check_pod_defaults(value: Any) -> dict[str, Any]:
    """Every role's pod settings, checked as a role's are (each problem named under pod_defaults)."""
    pod_options("pod_defaults", mapping(value), where="pod_defaults")
    return value


OPTIONS: dict[str, BackendOption] = {
    "kubernetes_conn_id": BackendOption("the provider's Kubernetes connection; null: none", optional(text)),
    "namespace": BackendOption("where the groups run, {team}: the task's team; default: the connection's, "
                               "else default",
                               optional(_check_namespace)),
    "in_cluster": BackendOption("true/false: use the pod's service account (as KubernetesHook)", optional(boolean)),
    "config_file": BackendOption("path of a kubeconfig", optional(path_option)),
    "cluster_context": BackendOption("the kubeconfig's context", optional(text)),
    "cluster_domain": BackendOption("appended to the tasks' DNS names, e.g. cluster.local", _check_cluster_domain),
    "network_policy": BackendOption("true (default): each group's pods accept connections only from the group",
                                    boolean),
    "workload": BackendOption("'jobs' (default) or 'jobset'", _check_workload),
    "pod_defaults": BackendOption("pod settings of every role (as RoleSpec.kubernetes)", optional(_check_pod_defaults)),
    "image": BackendOption("training image of groups that name none", optional(_check_image)),
    "ttl_seconds_after_finished": BackendOption(
        "whole seconds >= 0 the group is kept after its root Job finished; null: until deleted",
        optional(whole_seconds(0))),
    "ps_max_lifetime_seconds": BackendOption("whole seconds > 0: the parameter servers' deadline when the group "
                                             "has none", whole_seconds(1)),
    "progress_interval": BackendOption("seconds > 0 between progress reads while watching", seconds),
    "poll_interval": BackendOption("seconds > 0 between lists while the watch API is unavailable", seconds),
    "task_template": BackendOption("recorded at launch: the lead trainer's pod template", optional(mapping)),
    "unreachable_toleration_seconds": BackendOption(
        "whole seconds >= 0 a group's pod stays on a node judged lost (unreachable or not-ready) before it is "
        f"evicted and replaced (default {DEFAULT_UNREACHABLE_TOLERATION_SECONDS}); null: Kubernetes' default (300)",
        optional(whole_seconds(0))),
    "spread_over_nodes": BackendOption("true (default): the ps prefer nodes without the group's trainers, the "
                                       "workers nodes without another worker (preferred pod anti-affinity)", boolean),
    "disruption_budget": BackendOption("true: a PodDisruptionBudget per group lets no eviction (kubectl drain) "
                                       "interrupt it; default false", boolean),
}
"""Every option of the Kubernetes backend (the parameters of :class:`~.backend.KubernetesBackend`)."""
