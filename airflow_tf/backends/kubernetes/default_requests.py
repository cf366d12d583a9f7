"""The CPU and memory a pod requests when its settings request none: what one task of its role
took on a 2-core machine (``bench/bench_role_footprint.py``; the figures and the command are in
docs/reference/kubernetes.md, "Default requests"), so that the scheduler places it where it fits and
a Kueue ClusterQueue counts a group as what it takes, not as nothing.

A request the user gives wins: in the role's ``resources``, in its ``pod_template``'s container,
or implied by a limit of the same resource (Kubernetes then requests the limit; a default below
it would lower what the user asked for, one above it would be refused)."""

from __future__ import annotations

from typing import Any

ROLE_REQUESTS: dict[str, dict[str, str]] = {
    "ps": {"cpu": "250m", "memory": "512Mi"},  # peak RSS 430 MiB, 0.13 of a core on average
    "worker": {"cpu": "500m", "memory": "640Mi"},  # 350 MiB forked (about 500 MiB started alone), 0.36 cores
    "chief": {"cpu": "500m", "memory": "640Mi"},  # a worker that also checkpoints
    "evaluator": {"cpu": "100m", "memory": "256Mi"},  # the runtime's evaluator exits at once: 205 MiB
}
"""Each training role's default requests. The evaluation and export Jobs run on the lead
trainer's pod template (chief, else worker), so they request what it does (they took 602 and
578 MiB, under a core)."""

PART_REQUESTS: dict[str, str] = {"cpu": "500m", "memory": "640Mi"}
"""Each prepare part's default requests: 134 MiB measured on a small input plus the default
``buffer_mib`` (512) of rows; half a core, as a worker (it bursts to a whole one, as
bench_prepare's 1.94 CPU s in 2.19 s, on a core left idle: a request is what is reserved, and
no CPU limit is set)."""


def with_default_requests(resources: dict[str, dict[str, str]], defaults: dict[str, str],
                          pod_template: dict[str, Any] | None, container: str) -> dict[str, dict[str, str]]:
    """``resources`` (validated) with each of ``defaults`` it does not request itself, nor its
    limits imply, nor the pod template's container ``container`` (or ``base``) requests."""
    under = _template_requests(pod_template, container)
    given = {**resources.get("limits", {}), **resources.get("requests", {}), **under}
    added = {name: amount for name, amount in defaults.items() if name not in given}
    if not added:
        return resources
    return {**resources, "requests": {**added, **resources.get("requests", {})}}


def _template_requests(pod_template: dict[str, Any] | None, container: str) -> dict[str, Any]:
    """What the pod template's main container requests or limits (either sets the request)."""
    containers = ((pod_template or {}).get("spec") or {}).get("containers") or []
    main = next((c for c in containers if isinstance(c, dict) and c.get("name") in (container, "base")), None)
    resources = (main or {}).get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
