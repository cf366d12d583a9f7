"""Admission of a local group by memory: what its tasks are expected to take, what this machine has
available, and the refusal of a group that would not fit."""

from __future__ import annotations

import logging
import os

from airflow_tf.cluster import GroupSpec
from airflow_tf.cluster.memory import TASK_BASELINE_BYTES, mem_available_bytes, memory_bytes

from ..base import BackendError

TASK_MEMORY_MIB = TASK_BASELINE_BYTES // 2**20
"""Expected resident memory of one TensorFlow task (ps or worker); override per role with
``resources.requests.memory``."""

log = logging.getLogger(__name__)


def memory_mib(quantity: str, where: str = "memory") -> float:
    """A Kubernetes memory quantity (``512Mi``, ``2Gi``, ``1G``, ``1500k``) in MiB; BackendError
    naming ``where`` when it is not one."""
    try:
        return memory_bytes(quantity, where) / 2**20
    except ValueError as err:
        raise BackendError(str(err)) from None


def mem_available_mib() -> float | None:
    """``MemAvailable`` of /proc/meminfo in MiB (None where there is no such file)."""
    available = mem_available_bytes()
    return None if available is None else available / 2**20


def expected_memory_mib(spec: GroupSpec) -> dict[str, float]:
    """Expected resident MiB of one task of each role that counts (see :data:`TASK_MEMORY_MIB`)."""
    per_role = {}
    for role, role_spec in spec.roles.items():
        requested = role_spec.resources.get("requests", {}).get("memory")
        if requested is not None:
            per_role[role] = memory_mib(requested, f"roles.{role}.resources.requests.memory")
        elif role_spec.command is None and role != "evaluator":  # the runtime's evaluator exits at once
            per_role[role] = TASK_MEMORY_MIB
    return per_role


def resident_mib(pid: int) -> float:
    """``VmRSS`` of a process in MiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def check_capacity(spec: GroupSpec, promised_mib: float = 0.0) -> None:
    """Refuse a group whose tasks would not fit in the memory available now, less
    ``promised_mib`` (what groups already launched will still take as their tasks start: they
    are not in ``MemAvailable`` yet); warn when its training tasks outnumber the CPU cores
    (they would share them, each slower)."""
    per_role = expected_memory_mib(spec)
    needed = sum(per_role.get(role, 0) for role, _ in spec.tasks())
    available = mem_available_mib()
    if available is not None and needed > available - promised_mib:
        parts = ", ".join(f"{spec.replicas(r)} {r} x {mb:.0f} MiB" for r, mb in per_role.items() if spec.replicas(r))
        starting = (f", of which {promised_mib:.0f} MiB will be taken by groups still starting"
                    if promised_mib >= 1 else "")
        raise BackendError(
            f"training group {spec.name!r} needs about {needed:.0f} MiB ({parts}) but this machine has only "
            f"{available:.0f} MiB available (MemAvailable in /proc/meminfo{starting}); launch fewer tasks, wait "
            "for other trainings to finish (retries of the launch do), free memory, or use the kubernetes backend"
        )
    trainers = spec.replicas("worker") + spec.replicas("chief")
    cores = len(os.sched_getaffinity(0))
    if trainers > cores:
        log.warning("training group %r has %d training tasks for %d CPU core(s): they share the cores, so each "
                    "trains slower and the group may be no faster than %d worker(s) would be", spec.name,
                    trainers, cores, cores)
