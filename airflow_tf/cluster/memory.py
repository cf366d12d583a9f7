"""Memory sizes: Kubernetes quantities, and what one TensorFlow task takes before its variables."""

from __future__ import annotations

TASK_BASELINE_BYTES = 512 * 2**20
"""Resident memory of one TensorFlow task (ps or worker) before its variables: 485-500 MiB
measured here (TF 2.21, 1 ps + 2 workers training the linear model)."""

_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "": 1}


def memory_bytes(quantity: str | int | float) -> int:
    """A Kubernetes memory quantity (``512Mi``, ``2Gi``, ``1G``, ``1000000``) in bytes; ValueError
    naming the value when it is not one."""
    text = str(quantity).strip()
    number = text.rstrip("KMGTi")
    try:
        value = float(number) * _UNITS[text[len(number):]]
    except (KeyError, ValueError):
        raise ValueError(f"{quantity!r} is not a memory quantity (e.g. 512Mi, 2Gi)") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{quantity!r} is not a positive memory quantity (e.g. 512Mi, 2Gi)")
    return int(value)


def mem_available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
