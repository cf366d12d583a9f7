"""The one sanitizer: every user-given name passes through here before it becomes a
pod name, label value, path component or group name."""

from __future__ import annotations

import hashlib
import re
from typing import Any

DNS1123_LABEL_MAX = 63
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def is_name(value: Any) -> bool:
    """Whether a user gave a name (a non-empty string) where a dataset, model or group is named:
    None, '' or 7 would make its directory and asset quietly wrong."""
    return isinstance(value, str) and bool(value.strip())


def _digest(value: str, length: int = 8) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()[:length]


def is_dns1123_label(value: str) -> bool:
    return len(value) <= DNS1123_LABEL_MAX and bool(_DNS1123_LABEL.match(value))


def dns1123_label(value: str, max_length: int = DNS1123_LABEL_MAX) -> str:
    """A valid DNS-1123 label derived from any string.

    When the string had to be changed (case, characters, length), a short hash of the
    original is appended so that two different inputs never collapse to the same name
    (``My_Model`` and ``my-model`` stay distinct)."""
    if max_length < 10:
        raise ValueError(f"max_length must be at least 10, got {max_length}")
    if is_dns1123_label(value) and len(value) <= max_length:
        return value
    cleaned = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")
    cleaned = re.sub(r"-{2,}", "-", cleaned)
    suffix = _digest(value)
    head = cleaned[: max_length - len(suffix) - 1].strip("-")
    return f"{head}-{suffix}" if head else f"x-{suffix}"


def label_value(value: str) -> str:
    """A valid Kubernetes label value (63 chars of [A-Za-z0-9_.-], alphanumeric ends)."""
    value = str(value)
    if len(value) <= DNS1123_LABEL_MAX and _LABEL_VALUE.match(value):
        return value
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)
    suffix = _digest(value)
    head = cleaned[: DNS1123_LABEL_MAX - len(suffix) - 1]
    head = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", head)
    return f"{head}-{suffix}" if head else suffix


def path_component(value: str) -> str:
    """A safe single path component (no separators, no dot-dot, no leading dot)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.=-]+", "_", str(value)).lstrip(".")
    if not cleaned or cleaned != str(value):
        cleaned = f"{cleaned[:80]}-{_digest(str(value))}" if cleaned else _digest(str(value))
    return cleaned


def group_name(dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """Deterministic group name for one Airflow task instance in one DAG run.

    A retry (or second try) of the same task gets the same name, so it finds the group it
    launched; each mapped instance (``map_index`` >= 0) gets its own. The name leaves room for
    ``-<role>-<index>`` suffixes within 63 characters."""
    mapped = map_index is not None and int(map_index) >= 0
    readable = dns1123_label(f"{dag_id}-{task_id}" + (f"-{int(map_index)}" if mapped else ""), max_length=30)
    identity = "\x00".join((dag_id, task_id, run_id) + ((str(int(map_index)),) if mapped else ()))
    return f"tf-{readable}-{_digest(identity, 10)}"


def task_name(group: str, role: str, index: int) -> str:
    """Name of one task (pod, Service, process) of a group: ``<group>-<role>-<index>``."""
    name = f"{group}-{role}-{index}"
    if not is_dns1123_label(name):
        raise ValueError(
            f"task name {name!r} is not a valid DNS-1123 label; shorten the group name {group!r}"
        )
    return name


PROCESS_TITLE = "airflow-tf"
"""The first word of a local group's process titles: ``pgrep -af '^airflow-tf '`` lists them."""
GROUP_ENV, RUN_ENV, TASK_ENV = "AIRFLOW_TF_GROUP", "AIRFLOW_TF_RUN", "AIRFLOW_TF_TASK"
"""The environment variables that name a local process's group, run and task."""


def process_title(task: str, group: str, run: str) -> str:
    """What ``ps``, ``top -c`` and ``/proc/<pid>/cmdline`` show for a task of a local group:
    ``airflow-tf worker-0 group=<group> run=<run>``. Words are separated by one space and ``run=``
    comes last, running to the end of the title, so a run directory may hold spaces; a control
    character (which would break the line a script reads) shows as ``?``."""
    title = f"{PROCESS_TITLE} {task} group={group} run={run or '-'}"
    return "".join(c if c.isprintable() else "?" for c in title)
