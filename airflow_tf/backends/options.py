"""The options of a backend (``backend_options`` of the operators, ``[airflow_tf] backend_options``,
the keyword arguments of a backend's class), each declared once with its meaning and its check.

A wrong value is refused before the backend makes anything, naming where the options came from
(the setting or the argument), the key, the value and what is expected: a string ``"false"`` is not
taken as true, nor a zero interval as a tight loop."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_tf.cluster import SpecError

from .base import BackendError


class BackendOptionError(BackendError, ValueError):
    """A backend option with a wrong key, type or range: a retry cannot fix it."""


@dataclass(frozen=True)
class BackendOption:
    """One option: what it means (listed when a key is unknown) and its check, which returns the
    value to keep or raises ValueError saying what is expected (the words after "expected"), or a
    SpecError whose message stands alone (the settings inside an object, each named)."""

    doc: str
    check: Callable[[Any], Any]


def check_options(backend: str, table: Mapping[str, BackendOption], options: Mapping[str, Any],
                  where: str) -> dict[str, Any]:
    """``options`` checked against ``table``: the values to keep, or one BackendOptionError listing
    every problem, each naming ``where`` and the key."""
    errors = [f"{where}: {key!r}: the {backend} backend has no such option; its options are: "
              + "; ".join(f"{name} ({option.doc})" for name, option in table.items())
              for key in options if key not in table]
    checked: dict[str, Any] = {}
    for key, value in options.items():
        if key not in table:
            continue
        try:
            checked[key] = table[key].check(value)
        except SpecError as e:
            errors.append(f"{where}: {key}: {e}")
        except ValueError as e:
            errors.append(f"{where}: {key}: got {value!r}; expected {e}")
    if errors:
        raise BackendOptionError(errors[0] if len(errors) == 1 else "\n  ".join(
            [f"{where}: {len(errors)} invalid options of the {backend} backend:", *errors]))
    return checked


# -- checks ---------------------------------------------------------------------------------
# Each returns the value to keep or raises ValueError with what is expected (the message is
# put after "expected").

def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("true or false (a boolean, not a string or a number)")
    return value


def text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a non-empty string")
    return value


def path_option(value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ValueError("a path (a non-empty string)")
    return os.fspath(value)


def seconds(value: Any) -> float:
    """An interval: a finite number of seconds > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError("a number of seconds > 0 (finite)")
    return float(value)


def whole_seconds(minimum: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"a whole number of seconds >= {minimum}")
        return value
    return check


def mapping(value: Any) -> dict:
    if not isinstance(value, dict):
        raise ValueError("an object (a dict)")
    return value


def optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``check``, or None (the option's default)."""
    def check_or_none(value: Any) -> Any:
        if value is None:
            return None
        try:
            return check(value)
        except SpecError:
            raise
        except ValueError as e:
            raise ValueError(f"{e}, or null") from None
    return check_or_none
