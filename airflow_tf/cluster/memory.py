"""Memory sizes: Kubernetes quantities, and what one TensorFlow task takes before its variables."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

TASK_BASELINE_BYTES = 512 * 2**20
"""Resident memory of one TensorFlow task (ps or worker) before its variables: 485-500 MiB
measured here (TF 2.21, 1 ps + 2 workers training the linear model)."""

QUANTITY = re.compile(r"^\+?(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
"""Kubernetes' grammar of a resource quantity, less the minus sign (a request is never negative):
a number (``2``, ``0.5``, ``.5``, ``5.``) and one suffix: binary ``Ki Mi Gi Ti Pi Ei``, decimal
``n u m k M G T P E`` (lower-case ``k``; ``K`` is not one) or an exponent (``1e9``, ``15E-1``)."""
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal(10**3),
            "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18)}


def quantity_text(value: Any) -> str:
    """The text of a quantity as a user wrote it (a str, or an int or finite float from YAML or
    Python); "" (never a quantity) for anything else."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    return str(value).strip()


def parse_quantity(value: Any, where: str, *, positive: bool = False, example: str = "2, 500m, 4Gi") -> Decimal:
    """The value of ``value`` read as a Kubernetes quantity (``4Gi`` -> 4294967296, ``500m`` ->
    0.5, ``1500k`` -> 1500000): the one parser of quantities in the package. ValueError naming
    ``where`` and what to write when it is not one (or is 0 when ``positive``)."""
    match = QUANTITY.match(quantity_text(value))
    if match:
        number, suffix = Decimal(match["number"]), match["suffix"] or ""
        if suffix in _BINARY:
            result = number * _BINARY[suffix]
        elif suffix in _DECIMAL:
            result = number * _DECIMAL[suffix]
        else:
            result = number * (Decimal(10) ** int(suffix[1:])) if suffix else number
        if result > 0 or not positive:
            return result
    kind = "a positive Kubernetes quantity (" if positive else "a Kubernetes quantity (>= 0, "
    raise ValueError(f"{where}: {value!r} is not {kind}e.g. {example}; a number with one suffix of Ki Mi Gi Ti "
                     "(binary), k M G T (decimal; lower-case k), m (milli) or e<N> (exponent))")


def quantity_value(text: str) -> Decimal:
    """The value of a Kubernetes quantity (see :func:`parse_quantity`); ValueError when ``text``
    is not one."""
    return parse_quantity(text, "quantity")


def memory_bytes(quantity: Any, where: str = "memory") -> int:
    """A Kubernetes memory quantity (``512Mi``, ``2Gi``, ``1G``, ``1500k``, ``1000000``) in bytes,
    a fraction of a byte rounded up as Kubernetes does; ValueError naming ``where`` and the value
    when it is not a positive one."""
    value = parse_quantity(quantity, where, positive=True, example="512Mi, 2Gi, 1500M")
    if value < 1:  # Kubernetes would round it up to 1 byte: '1m' for a megabyte is the likely slip
        raise ValueError(f"{where}: {quantity!r} is {value} bytes (m means milli); write Mi or M for mebi/megabytes")
    return math.ceil(value)


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
