"""Whose group is it? A launch that remembers what it created (its record: the group's name
and uid, kept where a retry of the same task finds it, e.g. Airflow 3.3's task state store)
re-attaches only to that group, and refuses a same-named group it did not create.

The record is written in two steps: ``{"name", "uid": None}`` before creating (the intent),
then with the uid once created. A retry that finds the intent without a uid and a group of
that name re-attaches: the first try checked that no group of that name existed before
recording its intent, so the group is the one it created before it was lost."""

from __future__ import annotations

from typing import Any

from .base import BackendError, GroupRef


class NotOurGroupError(BackendError):
    """A group of the launch's name exists that this launch did not create."""


def intent(name: str) -> dict[str, Any]:
    return {"name": name, "uid": None}


def record_of(ref: GroupRef) -> dict[str, Any]:
    return {"name": ref.name, "uid": ref.uid, "backend": ref.backend, "namespace": ref.namespace}


def check_ours(name: str, record: Any, found: GroupRef | None, who: str) -> bool:
    """Whether to re-attach (True) or create (False) the group ``name`` given this launch's
    ``record`` (None: it created nothing yet) and the group ``found`` under that name. Raises
    :class:`NotOurGroupError` for a group it did not create; ``who`` names the launch."""
    if found is None:
        return False  # nothing there (a group it created and that is gone is created again)
    mine = record if isinstance(record, dict) and record.get("name") == name else None
    if mine is None:
        raise NotOurGroupError(
            f"training group {name} ({_where(found)}, uid {found.uid or 'unknown'}) already exists, but {who} did "
            "not create it: it belongs to another DAG run, deployment or Airflow using the same group name, or was "
            "left by one. Not re-attaching to it. Delete it if it is stale, or give this launch another group_name."
        )
    if mine.get("uid") is None or mine["uid"] == found.uid:
        return True
    raise NotOurGroupError(
        f"training group {name} ({_where(found)}) is not the one {who} created: it has uid {found.uid or 'unknown'}, "
        f"{who} created uid {mine['uid']}. Someone else replaced it under the same name; not re-attaching. "
        "Delete it if it is stale, or give this launch another group_name."
    )


def _where(ref: GroupRef) -> str:
    return f"{ref.backend} backend" + (f", namespace {ref.namespace}" if ref.namespace else "")
