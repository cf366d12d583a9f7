"""The deprecation rule for public names: a renamed or removed parameter keeps working for one
minor release, with :class:`AirflowTFDeprecationWarning` naming its replacement (CHANGELOG.md).
A leaf: every room may warn with it, the data layer included, without importing Airflow."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

REMOVED_IN = "0.3.0"


class AirflowTFDeprecationWarning(DeprecationWarning):
    """A parameter or name of airflow-tf that still works but goes away in the next minor release."""


def _our_directories() -> tuple[str, ...]:
    """airflow-tf's and, once imported, Airflow's own code: frames the warning looks past."""
    directories = [os.path.dirname(os.path.abspath(__file__))]
    for name in ("airflow", "airflow.sdk"):
        module = sys.modules.get(name)
        if getattr(module, "__file__", None):
            directories.append(os.path.dirname(os.path.abspath(module.__file__)))  # type: ignore[union-attr,arg-type]
    return tuple(directories)


def deprecated(what: str, replacement: str) -> None:
    """Warns that ``what`` is deprecated, naming its replacement. The warning points at the
    user's line: the first caller outside airflow-tf and Airflow (an operator's ``__init__``
    runs under Airflow's own wrappers)."""
    ours = _our_directories()
    frame, stacklevel = sys._getframe(1), 2
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(ours):
        frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(f"{what} is deprecated and will be removed in airflow-tf {REMOVED_IN}: use {replacement}",
                  AirflowTFDeprecationWarning, stacklevel=stacklevel)


def renamed(where: str, old: str, new: str, old_value: Any, new_value: Any, *, unset: Any = None) -> Any:
    """The value of a parameter renamed from ``old`` to ``new``: ``old_value`` (with the
    warning) when only the old name was given, else ``new_value``. Both given is refused, as
    the two could disagree."""
    if old_value is None:
        return new_value
    deprecated(f"{where}({old}=...)", f"{new}=... (the same value)")
    if new_value is not None and new_value != unset:
        raise ValueError(f"{where}: {old} is the deprecated name of {new}; give {new} only")
    return old_value
