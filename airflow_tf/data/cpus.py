"""The cores this process may use (affinity and cgroup CPU quota): the default number of threads that
read and encode, and what a training task's threads per op share out (runtime.task)."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cpus(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """The cores this process may use, the default count of threads that read and encode: its CPU affinity,
    capped by a cgroup v2 CPU quota (a pod's ``resources.limits.cpu``). ``os.cpu_count()`` is
    the node's, so a part pod limited to 2 of 64 cores would start 64 threads that the quota
    then throttles."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError, ZeroDivisionError):  # no cgroup v2 here, or a value it never writes
        pass
    return cores
