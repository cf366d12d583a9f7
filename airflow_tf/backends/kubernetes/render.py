"""A group's objects in the workload form it asks for (:mod:`.workloads` declares the forms;
:mod:`.jobs` and :mod:`.jobset` build them): what the backend creates and ``airflow-tf render``
prints."""

from __future__ import annotations

from typing import Any

from airflow_tf.cluster import GroupSpec

from .jobs import render_group
from .jobset import render_jobset
from .workloads import check_workload


def render_workload(workload: str, spec: GroupSpec, namespace: str, **options: Any) -> list[dict]:
    """Every object of the group in the form ``workload``, in creation order (the root first)."""
    check_workload(workload)
    if workload == "jobset":
        return render_jobset(spec, namespace, **options)
    return render_group(spec, namespace, **options)
