"""What the backend's synchronous calls (:mod:`.backend`) and its asynchronous watch (:mod:`.watch`)
share, whichever client sends them: the text of an error the API returned, the selector of a
pod's events, and which of the objects listed by a group's label are its tasks."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from typing import Any

from .labels import ROLE_LABEL
from .one_off import STARTED_PHASES, is_one_off
from .status import lead_pod


def role_of(obj: dict) -> str | None:
    return (obj["metadata"].get("labels") or {}).get(ROLE_LABEL)


def tasks(objects: Iterable[dict]) -> list[dict]:
    """The group's own Jobs or pods among ``objects`` (listed by the group's label), without its
    one-off Jobs and their pods."""
    return [obj for obj in objects if not is_one_off(obj)]


def progress_pod(pods: list[dict]) -> dict | None:
    """The pod whose log tells the group's progress: the lead trainer's, once it started."""
    lead = lead_pod(pods)
    return lead if lead is not None and (lead.get("status") or {}).get("phase") in STARTED_PHASES else None


def event_selector(pod: str) -> str:
    return f"involvedObject.kind=Pod,involvedObject.name={pod}"


def explain(action: str, status: int | None, reason: str | None, body: Any) -> str:
    """The error of an API call refused with ``status``: what failed, the API's message and what to do."""
    message = reason or ""
    with contextlib.suppress(TypeError, ValueError, AttributeError):  # a body that is no JSON object
        message = json.loads(body).get("message") or message
    hint = {
        401: "the credentials were refused; check the Kubernetes connection",
        403: "the Airflow worker/triggerer's service account lacks this permission; "
             "bind it to the Role in airflow_tf/rbac/role.yaml",
        404: "check that the namespace exists",
        422: "the API server refused the manifest; run `airflow-tf render` with the same options to inspect it",
    }.get(status or 0, "")
    return f"{action}: HTTP {status} {message}" + (f" ({hint})" if hint else "")
