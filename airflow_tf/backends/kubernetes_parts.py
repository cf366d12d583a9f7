"""Deprecated: the Kubernetes prepare parts moved to :mod:`airflow_tf.backends.kubernetes.parts`;
``KubernetesPartOptions`` is importable from :mod:`airflow_tf.backends.kubernetes`."""

from __future__ import annotations

import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    from airflow_tf.backends.kubernetes import parts
    from airflow_tf.deprecation import AirflowTFDeprecationWarning

    value = getattr(parts, name)  # AttributeError for a name the module never had
    warnings.warn(f"airflow_tf.backends.kubernetes_parts.{name} is deprecated: import it from "
                  f"airflow_tf.backends.kubernetes (the module is airflow_tf.backends.kubernetes.parts)",
                  AirflowTFDeprecationWarning, stacklevel=2)
    return value
