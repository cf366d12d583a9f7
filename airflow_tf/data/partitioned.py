"""Deprecated: the parts of a parallel prepare moved to :mod:`airflow_tf.data.parts` (a
*partition* is a ``partition_key``'s data, e.g. a day; a *part* is one process's share of a
prepare's input files)."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    from airflow_tf.data import parts
    from airflow_tf.deprecation import deprecated

    value = getattr(parts, name)  # AttributeError for a name the module never had
    deprecated(f"airflow_tf.data.partitioned.{name}", f"airflow_tf.data.parts.{name}")
    return value
