"""TF_CONFIG: the cluster every task sees, and which task it is."""

from __future__ import annotations

import json
from collections.abc import Callable

from .spec import ROLES, GroupSpec


def cluster_def(spec: GroupSpec, address: Callable[[str, int], str]) -> dict[str, list[str]]:
    """``{"ps": ["host:port", ...], "worker": [...]}`` using ``address(role, index)``.

    The evaluator is left out, as TensorFlow expects: it watches checkpoints, it is not
    a member of the training cluster."""
    return {
        role: [address(role, index) for index in range(spec.replicas(role))]
        for role in ROLES
        if spec.replicas(role) and role != "evaluator"
    }


def tf_config(cluster: dict[str, list[str]], role: str, index: int) -> dict:
    if role == "evaluator":
        return {"cluster": cluster, "task": {"type": role, "index": int(index)}}
    if role not in cluster or not 0 <= index < len(cluster[role]):
        raise ValueError(f"task {role}:{index} is not in the cluster {sorted(cluster)}")
    return {"cluster": cluster, "task": {"type": role, "index": int(index)}}


def tf_config_json(cluster: dict[str, list[str]], role: str, index: int) -> str:
    return json.dumps(tf_config(cluster, role, index), sort_keys=True)
