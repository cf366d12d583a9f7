"""A small Kubernetes API server for tests, over real HTTP on 127.0.0.1, with the Job
controller and the garbage collector the backend relies on.

The Kubernetes tests run on a real control plane (tests/k8s/conftest.py); this emulator
is kept for what that plane cannot show: an API server failing one chosen request (HTTP 500
to a watch, :meth:`fail_next`), in test_kubernetes_watch_errors.py. There the real
``kubernetes`` / ``kubernetes_asyncio`` clients, reached through the cncf-kubernetes provider's
hooks with a kubeconfig written by the test, send real requests here. It implements only what the backend uses:

- jobs (batch/v1), pods, services (core/v1) and networkpolicies (networking.k8s.io/v1):
  create, get, list (label selectors), delete (``preconditions.uid``, ``propagationPolicy``),
  pod logs (``tailLines``);
- the Job controller for Indexed Jobs, as documented in
  https://kubernetes.io/docs/concepts/workloads/controllers/job/ : one pod per index
  (hostname ``<job>-<index>``, ``JOB_COMPLETION_INDEX``, the ``batch.kubernetes.io/job-completion-index``
  label), a failed pod replaced until its index spent ``backoffLimitPerIndex``, then the
  index failed and, past ``maxFailedIndexes``, the Job (reason ``MaxFailedIndexesExceeded``);
  ``podFailurePolicy`` rules in order (``Ignore`` for a matching pod condition such as
  ``DisruptionTarget``: replaced, not counted; ``FailJob`` on matching exit codes of the
  named container: the Job fails at once, reason ``PodFailurePolicy``, its running pods are
  deleted); ``successPolicy`` (``succeededIndexes``); ``activeDeadlineSeconds`` counted from
  ``startTime`` (reason ``DeadlineExceeded``, running pods deleted); ``suspend`` (no pods
  until admitted); ``ttlSecondsAfterFinished`` (the TTL controller deletes a finished Job
  with background propagation);
- garbage collection (https://kubernetes.io/docs/concepts/architecture/garbage-collection/):
  deleting an owner with propagation ``Background``/``Foreground`` deletes its dependents;
  ``Orphan`` (the default when a *Job* is deleted through the API without a policy) leaves
  them without the owner; an object whose owners are all gone is deleted;
- events (core/v1): list with field selectors;
- pod watches (``watch=true``) that replay from a ``resourceVersion``, honour
  ``timeoutSeconds`` and answer a too-old version with a 410 ERROR event.

Every request is recorded with the RBAC verb it needs (:meth:`calls`). Tests drive pods through
:meth:`run` and :meth:`succeed`, which change the status the way the kubelet would and emit
MODIFIED watch events; :meth:`pod` names the current pod of a Job's index.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

_CORE = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<resource>[a-z]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?)?$")
_GROUPED = re.compile(
    r"^/apis/(?P<group>[^/]+)/v1/namespaces/(?P<ns>[^/]+)/(?P<resource>[a-z]+)(?:/(?P<name>[^/]+))?$"
)
_KINDS = {"pods": ("v1", "Pod"), "services": ("v1", "Service"), "events": ("v1", "Event"),
          "networkpolicies": ("networking.k8s.io/v1", "NetworkPolicy"), "jobs": ("batch/v1", "Job")}
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
TERMINATION_MESSAGE_MAX_BYTES = 4096  # the kubelet's MaxContainerTerminationMessageLength


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stamp(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def _iso(seconds_ago: float) -> str:
    t = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds_ago)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _matches_labels(obj: dict, selector: str | None) -> bool:
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _matches_fields(obj: dict, selector: str | None) -> bool:
    for term in filter(None, (selector or "").split(",")):
        path, _, value = term.partition("=")
        node: Any = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if str(node) != value:
            return False
    return True


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    verb: str
    """The RBAC verb this request needs: get, list, watch, create, delete, ..."""
    resource: str
    """The RBAC resource: ``pods``, ``pods/log``, ``services``, ``networkpolicies`` ..."""
    api_group: str
    namespace: str
    name: str | None
    time: float = field(default_factory=time.monotonic)


class KubeEmulator:
    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._objects: dict[tuple[str, str, str], dict] = {}
        self._history: list[tuple[int, str, str, dict]] = []  # (rv, resource, type, object)
        self._rv = 100
        self._compacted = 0
        self._logs: dict[tuple[str, str], str] = {}
        self.requests: list[Request] = []
        self._failures: dict[str, int] = {}
        self._stopping = False
        self._offset = dt.timedelta()  # the controllers' clock: now + offset (see advance)
        self._counted: set[str] = set()  # uids of failed pods the Job controller has handled
        self._index_failures: dict[tuple[str, int], int] = {}  # (job uid, index): failures counted
        self._seq: dict[str, int] = {}  # uid: creation order
        self.created_by_controller: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "KubeEmulator":
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "emulator-token"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester",
                                                          "namespace": namespace}}],
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # -- inspection -----------------------------------------------------------------------
    def get(self, resource: str, namespace: str, name: str) -> dict | None:
        with self._lock:
            obj = self._objects.get((resource, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def calls(self, verb: str | None = None, resource: str | None = None, since: float = 0.0) -> list[Request]:
        return [r for r in list(self.requests)
                if (verb is None or r.verb == verb) and (resource is None or r.resource == resource) and r.time >= since]

    def fail_next(self, verb: str, count: int = 1) -> None:
        """Answer the next ``count`` requests of ``verb`` (list, watch, ...) with HTTP 500,
        as an API server that is restarting does."""
        with self._lock:
            self._failures[verb] = self._failures.get(verb, 0) + count

    # -- what the kubelet and the scheduler would do --------------------------------------
    def set_pod_status(self, namespace: str, name: str, status: dict) -> None:
        with self._lock:
            obj = self._objects[("pods", namespace, name)]
            obj["status"] = status
            self._record("pods", "MODIFIED", obj)
            self.reconcile()

    def pod(self, namespace: str, job: str, index: int) -> str:
        """The name of the newest pod the Job controller made for ``index`` of ``job``."""
        with self._lock:
            pods = [o for (r, ns, _), o in self._objects.items() if r == "pods" and ns == namespace
                    and (o["metadata"].get("labels") or {}).get("batch.kubernetes.io/job-name") == job
                    and o["metadata"]["labels"].get(INDEX_LABEL) == str(index)]
            if not pods:
                raise KeyError(f"no pod of Job {job} index {index}")
            return max(pods, key=lambda o: self._seq[o["metadata"]["uid"]])["metadata"]["name"]

    # -- the Job controller, the TTL controller and the garbage collector -----------------
    def _clock(self) -> dt.datetime:
        return dt.datetime.now(dt.timezone.utc) + self._offset

    def reconcile(self) -> None:
        """One pass of the controllers over every Job, then garbage collection."""
        with self._lock:
            for key in [k for k in self._objects if k[0] == "jobs"]:
                if key in self._objects:
                    self._reconcile_job(self._objects[key])
            self._collect_garbage()

    def _job_pods(self, job: dict) -> list[dict]:
        uid = job["metadata"]["uid"]
        return [o for (r, ns, _), o in self._objects.items() if r == "pods" and ns == job["metadata"]["namespace"]
                and any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences") or [])]

    def _reconcile_job(self, job: dict) -> None:
        spec, status, ns = job["spec"], job.setdefault("status", {}), job["metadata"]["namespace"]
        conditions = status.setdefault("conditions", [])
        finished = next((c for c in conditions if c["type"] in ("Complete", "Failed")), None)
        now = self._clock()
        if finished:
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and now >= _parse(finished["lastTransitionTime"]) + dt.timedelta(seconds=ttl):
                self._delete_object("jobs", ns, job["metadata"]["name"], "Background")
            return
        if spec.get("suspend"):
            return
        before = json.dumps(status, sort_keys=True)
        status.setdefault("startTime", _stamp(now))
        deadline = spec.get("activeDeadlineSeconds")
        if deadline and now >= _parse(status["startTime"]) + dt.timedelta(seconds=deadline):
            self._finish(job, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
            return
        completions = spec.get("completions", 1)
        indexed = spec.get("completionMode") == "Indexed"
        pods = self._job_pods(job)
        by_index: dict[int, list[dict]] = {}
        for pod in pods:
            by_index.setdefault(int(pod["metadata"]["labels"].get(INDEX_LABEL, "0")), []).append(pod)
        failed_indexes = set(_indexes(status.get("failedIndexes")))
        completed = set(_indexes(status.get("completedIndexes")))
        per_index_limit = spec.get("backoffLimitPerIndex")
        for index in range(completions if indexed else 1):
            if index in completed or index in failed_indexes:
                continue
            attempts = sorted(by_index.get(index, []), key=lambda o: self._seq[o["metadata"]["uid"]])
            if any(p["status"].get("phase") == "Succeeded" for p in attempts):
                completed.add(index)
                continue
            if attempts and attempts[-1]["status"].get("phase") != "Failed":
                continue  # running or pending
            if attempts and attempts[-1]["metadata"]["uid"] not in self._counted:
                pod = attempts[-1]
                self._counted.add(pod["metadata"]["uid"])
                action, message = self._failure_action(spec, pod, index)
                if action == "FailJob":
                    self._finish(job, "Failed", "PodFailurePolicy", message)
                    return
                if action in ("Count", "FailIndex"):
                    status["failed"] = status.get("failed", 0) + 1
                    key = (job["metadata"]["uid"], index)
                    self._index_failures[key] = self._index_failures.get(key, 0) + 1
                    limit = per_index_limit if per_index_limit is not None else spec.get("backoffLimit", 6)
                    if action == "FailIndex" or self._index_failures[key] > limit:
                        failed_indexes.add(index)
                        continue
            self._create_pod(job, index)
        status["completedIndexes"] = _ranges(completed)
        status["failedIndexes"] = _ranges(failed_indexes)
        status["succeeded"] = len(completed)
        status["active"] = sum(1 for p in pods if p["status"].get("phase") in ("Pending", "Running"))
        if failed_indexes and len(failed_indexes) > spec.get("maxFailedIndexes", completions):
            self._finish(job, "Failed", "MaxFailedIndexesExceeded", "Job has exceeded the specified maximal number "
                         "of failed indexes")
            return
        rules = (spec.get("successPolicy") or {}).get("rules") or []
        if any(_indexes(r.get("succeededIndexes")) <= completed for r in rules if r.get("succeededIndexes")):
            self._finish(job, "Complete", "SuccessPolicy", "Matched rules at index 0")
        elif len(completed) == completions:
            self._finish(job, "Complete", "CompletionsReached", "Reached expected number of succeeded pods")
        elif failed_indexes and len(completed) + len(failed_indexes) == completions:
            self._finish(job, "Failed", "FailedIndexes", "Job has failed indexes")
        elif json.dumps(status, sort_keys=True) != before:
            self._record("jobs", "MODIFIED", job)

    @staticmethod
    def _failure_action(spec: dict, pod: dict, index: int) -> tuple[str, str]:
        """The first podFailurePolicy rule matching a failed pod (Count when none does)."""
        terminated = [(c["name"], c["state"]["terminated"]["exitCode"])
                      for c in pod["status"].get("containerStatuses") or [] if (c.get("state") or {}).get("terminated")]
        conditions = {(c["type"], c.get("status")) for c in pod["status"].get("conditions") or []}
        for rule in (spec.get("podFailurePolicy") or {}).get("rules") or []:
            if any((c["type"], c.get("status", "True")) in conditions for c in rule.get("onPodConditions") or []):
                return rule["action"], f"Pod {pod['metadata']['name']} has condition matching {rule['action']} rule"
            codes = rule.get("onExitCodes")
            if codes:
                for name, code in terminated:
                    if codes.get("containerName") not in (None, name) or code == 0:
                        continue
                    if (code in codes["values"]) == (codes["operator"] == "In"):
                        return rule["action"], (f"Container {name} for pod {pod['metadata']['namespace']}/"
                                                f"{pod['metadata']['name']} failed with exit code {code} matching "
                                                f"{rule['action']} rule at index {index}")
        return "Count", ""

    def _finish(self, job: dict, kind: str, reason: str, message: str) -> None:
        stamp = _stamp(self._clock())
        for pod in self._job_pods(job):  # a finished Job's controller deletes its running pods
            if pod["status"].get("phase") in ("Pending", "Running"):
                self._delete_object("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], "Background")
        extra = [{"type": "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget", "status": "True",
                  "reason": reason, "message": message, "lastTransitionTime": stamp}]
        job["status"]["conditions"] = extra + [{"type": kind, "status": "True", "reason": reason, "message": message,
                                                "lastTransitionTime": stamp}]
        job["status"]["active"] = 0
        job["status"]["completionTime" if kind == "Complete" else "failedTime"] = stamp
        self._record("jobs", "MODIFIED", job)

    def _create_pod(self, job: dict, index: int) -> None:
        meta, template = job["metadata"], copy.deepcopy(job["spec"]["template"])
        name = f"{meta['name']}-{index}-{uuid.uuid4().hex[:5]}"
        pod_meta = template.get("metadata") or {}
        labels = {**(pod_meta.get("labels") or {}), "batch.kubernetes.io/job-name": meta["name"],
                  "batch.kubernetes.io/controller-uid": meta["uid"], INDEX_LABEL: str(index)}
        spec = template["spec"]
        if job["spec"].get("completionMode") == "Indexed":
            spec["hostname"] = f"{meta['name']}-{index}"
            for container in spec.get("containers", []) + spec.get("initContainers", []):
                container["env"] = (container.get("env") or []) + [{"name": "JOB_COMPLETION_INDEX", "value": str(index)}]
        pod = {"metadata": {"name": name, "labels": labels,
                            "annotations": {**(pod_meta.get("annotations") or {}), INDEX_LABEL: str(index)},
                            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
               "spec": spec}
        self._store("pods", meta["namespace"], pod)
        self.created_by_controller.append(name)

    def _delete_object(self, resource: str, namespace: str, name: str, propagation: str | None) -> dict:
        obj = self._objects.pop((resource, namespace, name))
        obj["metadata"]["deletionTimestamp"] = _now()
        self._record(resource, "DELETED", obj)
        # A Job deleted through the API without a policy orphans its pods (batch/v1's
        # legacy default); everything else defaults to background deletion.
        propagation = propagation or ("Orphan" if resource == "jobs" else "Background")
        uid = obj["metadata"]["uid"]
        for key, dependent in list(self._objects.items()):
            refs = dependent["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == uid for r in refs):
                if propagation == "Orphan":
                    dependent["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid] or None
                    if dependent["metadata"]["ownerReferences"] is None:
                        del dependent["metadata"]["ownerReferences"]
                elif key in self._objects:
                    self._delete_object(key[0], key[1], key[2], "Background")
        return obj

    def _collect_garbage(self) -> None:
        """Delete every object whose owners are all gone (e.g. owned by a uid that no longer exists)."""
        uids = {o["metadata"]["uid"] for o in self._objects.values()}
        for key, obj in list(self._objects.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if refs and key in self._objects and not any(r.get("uid") in uids for r in refs):
                self._delete_object(*key, "Background")

    def _container(self, namespace: str, name: str, state: dict, ready: bool = False) -> dict:
        pod = self._objects[("pods", namespace, name)]
        container = pod["spec"]["containers"][0]
        return {"name": container["name"], "image": container["image"], "imageID": "", "ready": ready,
                "restartCount": 0, "state": state}

    def run(self, namespace: str, name: str) -> None:
        with self._lock:
            c = self._container(namespace, name, {"running": {"startedAt": _now()}}, ready=True)
            self.set_pod_status(namespace, name, {"phase": "Running", "containerStatuses": [c], "podIP": "10.0.0.9"})

    def _terminate(self, namespace: str, name: str, phase: str, exit_code: int, reason: str,
                   termination_message: str | None = None, **pod_fields: Any) -> None:
        with self._lock:
            terminated = {"exitCode": exit_code, "reason": reason, "startedAt": _iso(5), "finishedAt": _now()}
            container = self._objects[("pods", namespace, name)]["spec"]["containers"][0]
            if termination_message:
                # What the container wrote to its terminationMessagePath: the kubelet keeps at
                # most the last 4096 bytes of the file.
                terminated["message"] = termination_message.encode()[-TERMINATION_MESSAGE_MAX_BYTES:].decode(
                    errors="ignore")
            elif exit_code and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                # The kubelet's rule: a failed container without a termination-log file gets
                # the end of its log (at most 80 lines, 2048 bytes) as its message.
                tail = "\n".join(self._logs.get((namespace, name), "").splitlines()[-80:])
                if tail:
                    terminated["message"] = tail.encode()[-2048:].decode(errors="ignore")
            c = self._container(namespace, name, {"terminated": terminated})
            self.set_pod_status(namespace, name, {"phase": phase, "containerStatuses": [c], **pod_fields})

    def succeed(self, namespace: str, name: str, termination_message: str | None = None) -> None:
        """The container exited 0, having written ``termination_message`` to its termination-log file."""
        self._terminate(namespace, name, "Succeeded", 0, "Completed", termination_message)

    # -- storage --------------------------------------------------------------------------
    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _record(self, resource: str, type_: str, obj: dict) -> None:
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._history.append((self._rv, resource, type_, copy.deepcopy(obj)))
        self._lock.notify_all()

    def _store(self, resource: str, namespace: str, obj: dict) -> dict:
        api_version, kind = _KINDS[resource]
        obj.setdefault("apiVersion", api_version)
        obj.setdefault("kind", kind)
        meta = obj.setdefault("metadata", {})
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now())
        if resource == "pods":
            obj["status"] = {"phase": "Pending"}
        if resource == "jobs":
            obj["status"] = {}
        self._objects[(resource, namespace, meta["name"])] = obj
        self._record(resource, "ADDED", obj)
        self._seq[meta["uid"]] = self._rv
        return obj

    # -- HTTP -----------------------------------------------------------------------------
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                emulator._serve(self, "GET")

            def do_POST(self) -> None:
                emulator._serve(self, "POST")

            def do_DELETE(self) -> None:
                emulator._serve(self, "DELETE")

            def do_PUT(self) -> None:
                emulator._serve(self, "PUT")

            def do_PATCH(self) -> None:
                emulator._serve(self, "PATCH")

        return Handler

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    @staticmethod
    def _status(code: int, reason: str, message: str) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code}

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(handler.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length) or b"null") if length else None
        match = _CORE.match(url.path) or _GROUPED.match(url.path)
        if not match or match["resource"] not in _KINDS:
            self._send(handler, 404, self._status(404, "NotFound", f"the emulator does not serve {url.path}"))
            return
        ns, resource, name = match["ns"], match["resource"], match["name"]
        sub = match.groupdict().get("sub")
        group = match.groupdict().get("group") or ""
        watching = query.get("watch", "").lower() in ("true", "1")
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method) or (
            ("get" if method == "GET" else "delete") if name
            else ("watch" if watching else "list") if method == "GET" else "deletecollection")
        self.requests.append(Request(method, url.path, query, verb, f"{resource}/{sub}" if sub else resource,
                                     group, ns, name))
        with self._lock:
            failing = self._failures.get(verb, 0) > 0
            if failing:
                self._failures[verb] -= 1
        if failing:
            self._send(handler, 500, self._status(500, "InternalError", f"{verb} failed (injected by the test)"))
            return
        if watching:
            self._watch(handler, resource, ns, query)
            return
        with self._lock:
            self.reconcile()  # the controllers act on time passing, seen at each request
            code, reply, content_type = self._handle(method, resource, ns, name, sub, query, body)
        self._send(handler, code, reply, content_type)

    def _handle(self, method: str, resource: str, ns: str, name: str | None, sub: str | None,
                query: dict[str, str], body: Any) -> tuple[int, Any, str]:
        key = (resource, ns, name or "")
        json_type = "application/json"
        if method == "POST" and not name:
            new_name = body["metadata"]["name"]
            if (resource, ns, new_name) in self._objects:
                return 409, self._status(409, "AlreadyExists", f'{resource} "{new_name}" already exists'), json_type
            created = self._store(resource, ns, copy.deepcopy(body))
            self.reconcile()
            return 201, created, json_type
        if method == "GET" and not name:
            api_version, kind = _KINDS[resource]
            items = [o for (r, n, _), o in sorted(self._objects.items())
                     if r == resource and n == ns and _matches_labels(o, query.get("labelSelector"))
                     and _matches_fields(o, query.get("fieldSelector"))]
            return 200, {"apiVersion": api_version, "kind": f"{kind}List",
                         "metadata": {"resourceVersion": str(self._rv)}, "items": items}, json_type
        obj = self._objects.get(key)
        if obj is None:
            return 404, self._status(404, "NotFound", f'{resource} "{name}" not found'), json_type
        if method == "GET" and sub == "log":
            text = self._logs.get((ns, name))
            if text is None and obj["status"].get("phase") == "Pending":
                return 400, self._status(400, "BadRequest",
                                         f'container "{obj["spec"]["containers"][0]["name"]}" in pod "{name}" '
                                         "is waiting to start: ContainerCreating"), json_type
            lines = (text or "").splitlines(keepends=True)
            if "tailLines" in query:
                lines = lines[-int(query["tailLines"]):] if int(query["tailLines"]) else []
            return 200, "".join(lines), "text/plain"
        if method == "GET":
            return 200, obj, json_type
        if method == "DELETE":
            uid = ((body or {}).get("preconditions") or {}).get("uid")
            if uid and uid != obj["metadata"]["uid"]:
                return 409, self._status(409, "Conflict", f"Precondition failed: UID in precondition: {uid}, "
                                         f"UID in object meta: {obj['metadata']['uid']}"), json_type
            deleted = self._delete_object(resource, ns, name, (body or {}).get("propagationPolicy"))
            return 200, deleted, json_type
        return 405, self._status(405, "MethodNotAllowed", f"{method} is not served by the emulator"), json_type

    def _watch(self, handler: BaseHTTPRequestHandler, resource: str, ns: str, query: dict[str, str]) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def send(event: dict) -> None:
            data = (json.dumps(event) + "\n").encode()
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.flush()

        selector = query.get("labelSelector")
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        since = int(query.get("resourceVersion") or 0)
        try:
            with self._lock:
                if since and since < self._compacted:
                    send({"type": "ERROR", "object": self._status(410, "Expired", f"too old resource version: {since}")})
                    pending: list[dict] = []
                    deadline = 0.0
                elif not since:  # no version: the current state first, as ADDED events
                    pending = [{"type": "ADDED", "object": copy.deepcopy(o)} for (r, n, _), o in sorted(self._objects.items())
                               if r == resource and n == ns and _matches_labels(o, selector)]
                    since = self._rv
                else:
                    pending = []
            while True:
                for event in pending:
                    send(event)
                with self._lock:
                    remaining = deadline - time.monotonic()
                    if self._stopping or remaining <= 0:
                        break
                    if not any(rv > since for rv, *_ in self._history):
                        self._lock.wait(remaining)
                    pending = []
                    for rv, r, type_, obj in self._history:
                        if rv > since and r == resource and obj["metadata"]["namespace"] == ns \
                                and _matches_labels(obj, selector):
                            pending.append({"type": type_, "object": copy.deepcopy(obj)})
                    since = max([since] + [rv for rv, *_ in self._history])
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (cancelled watch)


def _indexes(text: str | None) -> set[int]:
    result: set[int] = set()
    for part in filter(None, (text or "").split(",")):
        low, _, high = part.partition("-")
        result.update(range(int(low), int(high or low) + 1))
    return result


def _ranges(indexes: set[int]) -> str:
    """``{0, 1, 2, 5}`` as ``"0-2,5"``: how a Job's status writes index sets."""
    parts, ordered = [], sorted(indexes)
    while ordered:
        low = high = ordered.pop(0)
        while ordered and ordered[0] == high + 1:
            high = ordered.pop(0)
        parts.append(str(low) if low == high else f"{low}-{high}")
    return ",".join(parts)
