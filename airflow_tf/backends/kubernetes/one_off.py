"""One-off Jobs of the Kubernetes backend: evaluation, export and a prepare's parts, each run
once as a Job on the group's training image (the lead trainer's pod template: its image,
volumes, service account and security), its result read from its container's termination
message (:class:`OneOffJobs`, which :class:`~.backend.KubernetesBackend` hands its connection
and delegates to)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from airflow_tf.cluster import Phase
from airflow_tf.cluster.components import REFUSED_EXIT, RESULT_MARKER, component_command

from ..base import BackendError, ComponentRefusedError, GroupRef
from .labels import COMPONENT_LABEL, GROUP_LABEL, ONE_OFF_LABEL
from .status import _task_status, latest_pods

log = logging.getLogger(__name__)

PROGRESS_TAIL_LINES = 20
STARTED_PHASES = ("Running", "Succeeded", "Failed")
ONE_OFF_LOG_TAIL_LINES = 50
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
"""Where a one-off component's container writes its result (Kubernetes' default path)."""
TERMINATION_MESSAGE_MAX_BYTES = 4096
"""The most of a termination message the kubelet keeps (the end of a longer one)."""


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def name_of(obj: dict) -> str:
    return obj["metadata"]["name"]


def is_one_off(obj: dict) -> bool:
    """A one-off Job or its pod (evaluation, export, a prepare's part): it may carry its group's
    label, but it is none of the group's tasks."""
    return COMPONENT_LABEL in (obj["metadata"].get("labels") or {})


class BackendCalls(Protocol):
    """What one-off Jobs need of the backend's connection (:class:`~.backend.KubernetesBackend`
    provides them): its namespace, and listing, creating and deleting objects and reading a
    pod's log, each turning the API's errors into BackendErrors."""

    @property
    def namespace(self) -> str: ...

    def _ns(self, ref: GroupRef) -> str: ...

    def _list(self, kind: str, namespace: str, selector: str) -> list[dict]: ...

    def _create(self, obj: dict) -> dict | None: ...

    def _delete(self, kind: str, namespace: str, name: str) -> bool: ...

    def _read_log(self, namespace: str, pod: str, container: str, tail_lines: int | None) -> str: ...


class OneOffJobs:
    """Runs one-off Jobs (evaluation, export, a prepare's parts) through ``calls``, the backend's
    connection. ``task_template``: the pod template of groups whose GroupRef records none;
    ``ttl_seconds_after_finished``: the Jobs' TTL (None: none); ``poll_interval``: the longest
    wait between checks of a running Job."""

    def __init__(self, calls: BackendCalls, *, task_template: dict[str, Any] | None,
                 ttl_seconds_after_finished: int | None, poll_interval: float) -> None:
        self.calls = calls
        self.task_template = task_template
        self.ttl_seconds_after_finished = ttl_seconds_after_finished
        self.poll_interval = poll_interval

    def run_component(self, ref: GroupRef, component: str, request: dict[str, Any], *,
                      timeout: float = 3600.0) -> dict[str, Any]:
        """Run ``python -m airflow_tf.serving <component>`` once as a Job on the group's training
        image, with the lead trainer's volumes and service account, wait for it, and return the
        result its container wrote to its termination message.

        The Job is named ``<group>-<component>``; a Job of that name left by an earlier try is
        replaced when it finished, re-attached to while it runs, and deleted once its result is
        read. Raises BackendError naming the pod and its reason when it fails
        (ComponentRefusedError when it refused the request) or when its termination message
        holds no result."""
        try:
            command = component_command(component, request, TERMINATION_MESSAGE_PATH)
        except ValueError as e:
            raise BackendError(f"group {ref.name}: {e}") from None
        template = ref.options.get("task_template") or self.task_template
        if not template:
            raise BackendError(f"group {ref.name}: the launch recorded no pod template to run {component} with; "
                               "launch the group again with this version of airflow-tf")
        namespace, name = self.calls._ns(ref), f"{ref.name}-{component}"
        body = one_off_job(name, namespace, container=component, template=template, command=command,
                           timeout=timeout, ttl=self.ttl_seconds_after_finished,
                           labels={GROUP_LABEL: ref.name, COMPONENT_LABEL: component})
        pod = self.run_one_off(body, what=component)
        result = self.one_off_result(pod, component)
        self.delete_job(namespace, name)
        return result

    def run_one_off(self, body: dict, *, what: str, on_log: Callable[[str], None] | None = None) -> dict:
        """Run the one-off Job ``body`` (see :func:`one_off_job`) to its end and return its pod.

        A Job of that name left by an earlier try is replaced when it finished and re-attached
        to while it runs. ``on_log`` gets each new line of the pod's log while it runs. Raises
        BackendError naming the pod, its phase and reason and the last lines of its log when the
        Job fails (ComponentRefusedError when the container exited with REFUSED_EXIT)."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        container = body["spec"]["template"]["spec"]["containers"][0]["name"]
        selector = f"{ONE_OFF_LABEL}={meta['labels'][ONE_OFF_LABEL]}"
        self._start_one_off(body, selector, what)
        log.info("running %s on the cluster as Job %s in namespace %s", what, name, namespace)
        follower = _LogFollower(on_log) if on_log else None
        job, state = self._wait_one_off(namespace, name, selector, container, follower)
        pod = next(iter(latest_pods(self.calls._list("pods", namespace, selector)).values()), None)
        if follower is not None and pod is not None:  # the lines written since the last poll
            follower.feed(self.calls._read_log(namespace, name_of(pod), container, PROGRESS_TAIL_LINES))
        if state == "Complete":
            if pod is None:
                raise BackendError(f"{what} Job {name} completed, but its pod, which holds the result, is gone "
                                   "(deleted outside airflow-tf); run the task again")
            return pod
        text = self.calls._read_log(namespace, name_of(pod), container, ONE_OFF_LOG_TAIL_LINES) if pod else ""
        raise _one_off_failure(what, name, job, pod, text)

    def one_off_result(self, pod: dict, container: str) -> dict[str, Any]:
        """The JSON object a one-off Job's container wrote to its termination message, or, when
        that was too small to hold it, the last line of its log (after RESULT_MARKER)."""
        try:
            return _component_result(pod, container)
        except _ResultTooLarge as too_large:
            namespace = pod["metadata"].get("namespace") or self.calls.namespace
            last = self.calls._read_log(namespace, name_of(pod), container, 1).strip()
            try:
                result = json.loads(last.removeprefix(RESULT_MARKER))
            except json.JSONDecodeError:
                raise BackendError(f"{too_large}, which is not JSON either: {last[:200]!r}") from None
            if not isinstance(result, dict):
                raise BackendError(f"{too_large}, which is not a JSON object: {last[:200]!r}") from None
            return result

    def delete_job(self, namespace: str, name: str) -> bool:
        """Delete a Job and its pods; False when it was gone already."""
        return self.calls._delete("jobs", namespace, name)

    def _start_one_off(self, body: dict, selector: str, what: str) -> None:
        """Create the one-off Job, replacing a finished one of its name and re-attaching to a
        running one (started by an earlier try)."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        for old in self.calls._list("jobs", namespace, selector):
            if _job_finished(old):
                self.calls._delete("jobs", namespace, name_of(old))
        deadline = time.monotonic() + 60
        while self.calls._create(body) is None:  # the old Job is still being deleted, or a running one
            # Not being deleted: started by an earlier try (it may have finished since we listed).
            if [j for j in self.calls._list("jobs", namespace, selector) if not j["metadata"].get("deletionTimestamp")]:
                log.info("re-attaching to %s Job %s started by an earlier try", what, name)
                return
            if time.monotonic() > deadline:
                raise BackendError(f"could not create Job {name} in namespace {namespace}: "
                                   "a Job of that name is still being deleted")
            time.sleep(min(self.poll_interval, 1.0))

    def _wait_one_off(self, namespace: str, name: str, selector: str, container: str,
                      follower: _LogFollower | None) -> tuple[dict, str]:
        """The one-off Job once it finished, and how (``Complete`` or why it failed). Checked
        after 1 s, then twice as long each time up to ``poll_interval``: an evaluation or export
        of a few seconds ends its task within seconds, a long prepare part costs few calls."""
        delay = min(1.0, self.poll_interval)
        while True:
            jobs = [j for j in self.calls._list("jobs", namespace, selector) if name_of(j) == name]
            if not jobs:
                raise BackendError(f"Job {name} in namespace {namespace} disappeared before it finished "
                                   "(deleted outside airflow-tf)")
            state = _job_finished(jobs[0])
            if state:
                return jobs[0], state
            pod = next(iter(latest_pods(self.calls._list("pods", namespace, selector)).values()), None)
            if pod is not None:
                phase = (pod.get("status") or {}).get("phase") or "Pending"
                if phase == "Pending" and _task_status(pod, now(), {}, name, 0).phase == Phase.FAILED:
                    return jobs[0], "Failed"  # waiting cannot help (an image that cannot be pulled, a missing Secret)
                if follower is not None and phase in STARTED_PHASES:
                    follower.feed(self.calls._read_log(namespace, name_of(pod), container, PROGRESS_TAIL_LINES))
            time.sleep(delay)
            delay = min(delay * 2, self.poll_interval)


def _job_finished(job: dict) -> str | None:
    """'Complete' or 'Failed' once the Job finished, else None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return cond["type"]
    return None


def _job_condition_text(job: dict) -> str:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            return f"{cond.get('reason')}: {cond.get('message') or ''}".rstrip(": ")
    return "no pod ran"


class _ResultTooLarge(BackendError):
    """A component's result was cut short by the termination message's size limit."""


def _component_result(pod: dict, component: str) -> dict[str, Any]:
    """The result a one-off component's container wrote to its termination message (the kubelet
    copies it into the pod's status); BackendError naming the pod when it is missing, cut
    short or not a JSON object."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    status = next((c for c in statuses if c.get("name") == component), statuses[0] if statuses else {})
    message = ((status.get("state") or {}).get("terminated") or {}).get("message") or ""
    where = f"{component} pod {name_of(pod)} (namespace {pod['metadata'].get('namespace')})"
    if not message.strip():
        raise BackendError(f"{where} succeeded without writing its result to its termination message "
                           f"({TERMINATION_MESSAGE_PATH}); the training image's airflow-tf may be older than "
                           "this one: build it from the same version")
    try:
        result = json.loads(message)
    except json.JSONDecodeError as e:
        if len(message.encode()) >= TERMINATION_MESSAGE_MAX_BYTES:
            raise _ResultTooLarge(f"{where}: its result is larger than a termination message holds "
                                  f"({TERMINATION_MESSAGE_MAX_BYTES} bytes; the kubelet kept the end only); the "
                                  "whole result is the last line of the pod's log") from None
        raise BackendError(f"{where}: its termination message is not JSON ({e}): {message[:200]!r}") from None
    if not isinstance(result, dict):
        raise BackendError(f"{where}: its termination message is not a JSON object: {message[:200]!r}")
    return result


def one_off_job(name: str, namespace: str, *, container: str, template: dict, command: list[str],
                timeout: float, ttl: int | None, labels: dict[str, str]) -> dict:
    """A Job running ``command`` once in ``template`` (a Job's pod template: its image, volumes,
    service account and security), as container ``container``: no TF_CONFIG, no port, no
    retry. The container's result goes to its termination message (on failure, the end of
    its log does). The Job and its pod carry ``labels`` and ONE_OFF_LABEL (the Job's name)."""
    spec = json.loads(json.dumps(template["spec"]))
    spec.pop("subdomain", None)
    main = dict(spec["containers"][0])
    main.update(name=container, command=command, terminationMessagePath=TERMINATION_MESSAGE_PATH,
                terminationMessagePolicy="FallbackToLogsOnError",
                env=[e for e in main.get("env") or [] if e.get("name") not in ("TF_CONFIG",)])
    main.pop("ports", None)
    spec["containers"] = [main, *spec["containers"][1:]]
    meta = template.get("metadata") or {}
    labels = {**labels, ONE_OFF_LABEL: name}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0, "completions": 1, "parallelism": 1,
            "activeDeadlineSeconds": max(1, math.ceil(timeout)),
            **({"ttlSecondsAfterFinished": ttl} if ttl is not None else {}),
            "template": {"metadata": {"labels": labels, "annotations": meta.get("annotations") or {}},
                         "spec": spec},
        },
    }


class _LogFollower:
    """Hands each new line of a log, read as a tail again and again, to ``emit`` once."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self.seen: list[str] = []

    def feed(self, tail: str) -> None:
        lines = tail.splitlines()
        # Where the lines seen last overlap the start of this tail; what follows is new.
        for start in range(len(lines), -1, -1):
            if start <= len(self.seen) and lines[:start] == self.seen[len(self.seen) - start:]:
                break
        for line in lines[start:]:
            self.emit(line)
        self.seen = (self.seen + lines[start:])[-PROGRESS_TAIL_LINES * 4:]


def _one_off_failure(what: str, name: str, job: dict, pod: dict | None, log_tail: str) -> BackendError:
    """The error of a one-off Job that failed: its pod, phase and reason (or the Job's condition)
    and the last lines of its log; ComponentRefusedError when the container exited with REFUSED_EXIT."""
    if pod is None:
        return BackendError(f"{what} Job {name} failed (pod none: {_job_condition_text(job)}); "
                            f"last lines of its log:\n{log_tail.rstrip() or '(empty)'}")
    task = _task_status(pod, now(), {}, name, 0)
    detail = task.reason or (f"exit code {task.exit_code}" if task.exit_code is not None else None)
    detail = detail.removeprefix(f"pod {name_of(pod)}: ") if detail else None
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    error = ComponentRefusedError if task.exit_code == REFUSED_EXIT else BackendError
    return error(f"{what} Job {name} failed (pod {name_of(pod)}: {detail or _job_condition_text(job)}, phase {phase}); "
                 f"last lines of its log:\n{log_tail.rstrip() or '(empty)'}")
