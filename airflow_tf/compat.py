"""Airflow features that only newer releases have, detected when they are used.

airflow-tf supports Airflow 3.1, 3.2 and 3.3 (pyproject.toml's ``airflow`` extra). A few features
exist only from a given release on; code that uses one asks this module instead of importing it
at the top of a module, so a DAG file never fails to parse on an older Airflow:

    from airflow_tf import compat

    if compat.has_task_state_store():         # degrade: log compat.missing(...) and carry on
        ...
    hitl = compat.require("hitl", "approval before export")   # refuse: a clear error naming 3.1

This module imports neither TensorFlow nor, until a feature is asked about, Airflow: it reads the
installed version from the package metadata.
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from collections.abc import Mapping
from typing import Any


class AirflowFeatureUnavailable(RuntimeError):
    """A feature asked for needs a newer Airflow (or a provider) than the one installed."""


@dataclass(frozen=True)
class Feature:
    name: str
    what: str  # as a user knows it
    since: tuple[int, int]  # the first Airflow release that has it
    module: str  # where it lives
    probe: str  # an attribute of ``module`` (``Context.<key>``: a key of the task context)
    install: str  # what to install or upgrade when it is missing


FEATURES: Mapping[str, Feature] = {
    feature.name: feature
    for feature in (
        Feature("hitl", "human-in-the-loop operators", (3, 1), "airflow.providers.standard.operators.hitl",
                "ApprovalOperator", "apache-airflow>=3.1 and apache-airflow-providers-standard"),
        Feature("asset_partitions", "asset partitions", (3, 2), "airflow.sdk",
                "PartitionedAssetTimetable", "apache-airflow>=3.2"),
        Feature("task_state_store", "the task state store (durable execution)", (3, 3), "airflow.sdk",
                "Context.task_state_store", "apache-airflow>=3.3"),
    )
}


@functools.cache
def airflow_version() -> tuple[int, int, int] | None:
    """The installed Airflow as (major, minor, micro); None when Airflow is not installed."""
    for distribution in ("apache-airflow-core", "apache-airflow"):  # Airflow 3 ships the code in -core
        try:
            text = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
        # "3.2.0rc1" -> (3, 2, 0): the leading digits of each part
        parts = [int(m[0]) if (m := re.match(r"\d+", part)) else 0 for part in text.split(".")[:3]]
        return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]
    return None


def _feature(name: str) -> Feature:
    try:
        return FEATURES[name]
    except KeyError:
        raise ValueError(f"airflow_tf.compat: unknown feature {name!r}; known: {', '.join(FEATURES)}") from None


@functools.cache
def _probe(name: str) -> tuple[ModuleType | None, str]:
    """(the feature's module, "") when this Airflow has it, else (None, why not)."""
    feature = _feature(name)
    version = airflow_version()
    if version is None:
        return None, "Airflow is not installed"
    if version[:2] < feature.since:
        return None, f"this is Airflow {_text(version)}"
    try:
        module = importlib.import_module(feature.module)
    except Exception as exc:  # ImportError, or a provider's own "needs Airflow 3.x" refusal
        return None, f"Airflow {_text(version)} cannot import {feature.module} ({type(exc).__name__}: {exc})"
    holder, _, attribute = feature.probe.rpartition(".")
    target: Any = getattr(module, holder, None) if holder else module
    present = attribute in getattr(target, "__annotations__", {}) if holder else hasattr(target, attribute)
    if not present:
        return None, f"Airflow {_text(version)} has no {feature.module}.{feature.probe}"
    return module, ""


def _text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def has(feature: str) -> bool:
    """Whether the installed Airflow has ``feature`` (a key of :data:`FEATURES`)."""
    return _probe(feature)[0] is not None


def has_hitl() -> bool:
    """Human-in-the-loop operators (``ApprovalOperator`` and friends): Airflow 3.1+."""
    return has("hitl")


def has_asset_partitions() -> bool:
    """Asset partitions (a run's ``partition_key``): Airflow 3.2+."""
    return has("asset_partitions")


def has_task_state_store() -> bool:
    """The task state store a task keeps across retries (``context["task_state_store"]``): Airflow 3.3+."""
    return has("task_state_store")


def missing(feature: str, purpose: str | None = None) -> str | None:
    """None when ``feature`` is available; else one sentence saying what needs which Airflow and
    what to install, for a log line (degrade) or an error (refuse)."""
    _, why = _probe(feature)
    if not why:
        return None
    spec = _feature(feature)
    needed = f"Airflow {_text(spec.since)} or newer ({spec.what}, {spec.module})"
    return f"{purpose or spec.what.capitalize()} needs {needed}; {why}: install {spec.install}"


def require(feature: str, purpose: str | None = None) -> ModuleType:
    """The module providing ``feature``; raises :class:`AirflowFeatureUnavailable` with the
    :func:`missing` message when this Airflow lacks it. ``purpose`` names what the user asked for."""
    module, _ = _probe(feature)
    if module is None:
        raise AirflowFeatureUnavailable(missing(feature, purpose))
    return module


def task_state_store(context: Mapping[str, Any]) -> Any | None:
    """The running task's state store (Airflow 3.3+), or None on an Airflow without one."""
    return context.get("task_state_store") if has_task_state_store() else None


def partition_key(context: Mapping[str, Any]) -> str | None:
    """The DAG run's partition key (Airflow 3.2+), or None (no partition, or an older Airflow).
    Airflow 3.3 puts it in the context; 3.2 has it on the context's DAG run only."""
    if not has_asset_partitions():
        return None
    return context.get("partition_key") or getattr(context.get("dag_run"), "partition_key", None)
