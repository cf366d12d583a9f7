"""Memory sizes: Kubernetes quantities, and what one TensorFlow task takes before its variables."""

from __future__ import annotations

import re
from decimal import Decimal

TASK_BASELINE_BYTES = 512 * 2**20
"""Resident memory of one TensorFlow task (ps or worker) before its variables: 485-500 MiB
measured here (TF 2.21, 1 ps + 2 workers training the linear model)."""

QUANTITY = re.compile(r"^\+?(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
"""A Kubernetes resource quantity (never negative): ``2``, ``500m``, ``4Gi``, ``1e9``."""
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal(10**3),
            "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18)}


def quantity_value(text: str) -> Decimal:
    """The value of a Kubernetes quantity (``4Gi`` -> 4294967296, ``500m`` -> 0.5); ValueError
    when ``text`` is not one (see :data:`QUANTITY`)."""
    match = QUANTITY.match(text)
    if not match:
        raise ValueError(text)
    number, suffix = Decimal(match["number"]), match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * (Decimal(10) ** int(suffix[1:])) if suffix else number


def memory_bytes(quantity: str | int | float) -> int:
    """A Kubernetes memory quantity (``512Mi``, ``2Gi``, ``1G``, ``1000000``) in bytes; ValueError
    naming the value when it is not a positive one."""
    text = str(quantity).strip() if not isinstance(quantity, bool) else ""
    try:
        value = quantity_value(text)
    except ValueError:
        raise ValueError(f"{quantity!r} is not a memory quantity (e.g. 512Mi, 2Gi)") from None
    if not value >= 1:
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
