"""The kubelet of one Node of the private plane, played by the test, as Kubernetes' own
integration tests do: no container runs, the test says what each pod's containers did.

:class:`Kubelet` registers a Ready Node (InternalIP 127.0.0.1, renewing its Lease so the node
lifecycle controller leaves it untainted), serves the kubelet's log endpoint over TLS (only to
the API server, which proxies ``pods/log`` to it), and removes the pods marked for deletion once
their containers stopped, as a kubelet does. Everything else is the real controllers' and
scheduler's: which pods exist, on which node, when a Job is done.

Tests drive a pod through :meth:`run`, :meth:`succeed`, :meth:`fail`, :meth:`oom_kill`,
:meth:`evict`, :meth:`waiting` and :meth:`terminating`, which write its status through the
``pods/status`` subresource as the kubelet would; :meth:`set_log` is what its container wrote.
A terminated container's ``message`` is what it wrote to its termination-log file, of which the
kubelet keeps the last 4096 bytes, else, with ``terminationMessagePolicy: FallbackToLogsOnError``
and a failure, the end of its log (at most 80 lines, 2048 bytes).
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from .plane import Plane, wait_for

NODE = "airflow-tf-test-node"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
TERMINATION_MESSAGE_MAX_BYTES = 4096  # the kubelet's MaxContainerTerminationMessageLength
FALLBACK_LOG_LINES, FALLBACK_LOG_BYTES = 80, 2048  # the kubelet's FallbackToLogsOnError tail
LEASE_SECONDS = 40
RETRY_SECONDS = 0.2


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kubelet:
    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        self._logs: dict[tuple[str, str, str], str] = {}  # (namespace, pod, container): its output
        self._lingering: set[tuple[str, str]] = set()  # pods a test keeps Terminating
        self._stop = threading.Event()
        self._watch: Any = None  # the pods' current watch (kubernetes.watch.Watch)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*plane.info["kubelet_serving"])
        # Only the API server (its kubelet client certificate, from the plane's CA) reads logs.
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(plane.info["ca"])
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._threads = [threading.Thread(target=self._server.serve_forever, daemon=True),
                         threading.Thread(target=self._keep_node, daemon=True)]

    # -- the node ------------------------------------------------------------------------------
    def start(self) -> Kubelet:
        port = self._server.server_address[1]
        node = {
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE, "kubernetes.io/os": "linux"}},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": NODE}],
                "capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                "allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
                "conditions": [self._ready()],
                "nodeInfo": {"kubeletVersion": self.plane.info.get("version", ""), "operatingSystem": "linux",
                             "architecture": "amd64", "containerRuntimeVersion": "none://test",
                             "kernelVersion": "", "osImage": "", "kubeProxyVersion": "", "machineID": "",
                             "systemUUID": "", "bootID": ""}},
        }
        self.plane.core.create_node(node)
        self.plane.core.patch_node_status(NODE, {"status": node["status"]})
        self._renew_lease()
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:  # the API server would wait for an open watch when it stops
            self._watch.stop()
        self._server.shutdown()
        self._server.server_close()

    @staticmethod
    def _ready() -> dict:
        return {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "played by the test",
                "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}

    def _renew_lease(self) -> None:
        from kubernetes.client.exceptions import ApiException

        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease = {"metadata": {"name": NODE}, "spec": {"holderIdentity": NODE, "leaseDurationSeconds": LEASE_SECONDS,
                                                        "renewTime": now}}
        from kubernetes import client

        coordination = client.CoordinationV1Api(self.plane.api)
        try:
            coordination.patch_namespaced_lease(NODE, "kube-node-lease", lease)
        except ApiException as e:
            if e.status != 404:
                raise
            coordination.create_namespaced_lease("kube-node-lease", lease)

    def _keep_node(self) -> None:
        """Renew the node's lease, and remove pods marked for deletion, as the kubelet does: it
        watches its pods. Each watch lasts until the next renewal is due; a watch that fails or
        expires (410 Gone) starts again from a fresh listing."""
        from kubernetes import watch

        renewed, resource_version = time.monotonic(), None
        while not self._stop.is_set():
            try:
                if time.monotonic() - renewed > LEASE_SECONDS / 4:
                    self._renew_lease()
                    renewed = time.monotonic()
                if resource_version is None:
                    resource_version = self._remove_deleted_pods()
                self._watch = watch.Watch()
                for event in self._watch.stream(
                        self.plane.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={NODE}",
                        resource_version=resource_version, timeout_seconds=int(LEASE_SECONDS / 4)):
                    pod = event["raw_object"]
                    resource_version = pod["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._remove_if_deleted(pod)
                    if self._stop.is_set():
                        break
            except Exception:  # noqa: BLE001 - an API server restarting, an expired watch: list again
                resource_version = None
                self._stop.wait(RETRY_SECONDS)

    def _remove_deleted_pods(self) -> str:
        """Remove this node's pods marked for deletion; the listing's resource version, to watch from."""
        listing = json.loads(self.plane.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={NODE}", _preload_content=False).data)
        for pod in listing["items"]:
            self._remove_if_deleted(pod)
        return listing["metadata"]["resourceVersion"]

    def _remove_if_deleted(self, pod: dict) -> None:
        from kubernetes import client

        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if not meta.get("deletionTimestamp") or (namespace, name) in self._lingering:
            return
        if pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            # The containers get SIGTERM and exit; the kubelet reports that, then removes the pod.
            self._ignore_missing(lambda: self._terminate(namespace, name, "Failed", 143, "Error", None))
        self._ignore_missing(lambda: self.plane.core.delete_namespaced_pod(
            name, namespace, body=client.V1DeleteOptions(grace_period_seconds=0,
                                                         preconditions={"uid": meta["uid"]})))

    @staticmethod
    def _ignore_missing(call) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            call()
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    # -- pods ----------------------------------------------------------------------------------
    def pod(self, namespace: str, job: str, index: int, timeout: float = 30.0, other_than: str | None = None) -> str:
        """The name of the newest pod the Job controller made for ``index`` of ``job`` (and, with
        ``other_than``, not that one), once it is on this node."""

        def newest():
            pods = [p for p in self.plane.core.list_namespaced_pod(
                namespace, label_selector=f"batch.kubernetes.io/job-name={job},{INDEX_LABEL}={index}").items
                if p.spec.node_name == NODE and p.metadata.name != other_than and p.metadata.deletion_timestamp is None]
            return max(pods, key=lambda p: p.metadata.creation_timestamp).metadata.name if pods else None

        return wait_for(newest, timeout, f"a pod of Job {job} index {index} on node {NODE}")

    def set_log(self, namespace: str, pod: str, text: str, container: str | None = None) -> None:
        self._logs[(namespace, pod, container or self._container_name(namespace, pod))] = text

    def _container_name(self, namespace: str, pod: str) -> str:
        return self.plane.core.read_namespaced_pod(pod, namespace).spec.containers[0].name

    def set_status(self, namespace: str, name: str, change) -> dict:
        """Apply ``change(status, pod)`` to the pod's status and write it back, as the kubelet
        does (again on a conflict with a controller's write)."""
        from kubernetes.client.exceptions import ApiException

        api = self.plane.api
        while True:
            pod = api.sanitize_for_serialization(self.plane.core.read_namespaced_pod(name, namespace))
            status = pod.setdefault("status", {})
            change(status, pod)
            try:
                written = self.plane.core.replace_namespaced_pod_status(name, namespace, pod)
            except ApiException as e:
                if e.status == 409:
                    continue
                raise
            return api.sanitize_for_serialization(written)

    @staticmethod
    def _container_status(pod: dict, state: dict, ready: bool = False) -> list[dict]:
        containers = pod["spec"]["containers"]
        restarts = {c["name"]: c.get("restartCount", 0) for c in (pod.get("status") or {}).get("containerStatuses") or []}
        return [{"name": c["name"], "image": c["image"], "imageID": "", "ready": ready, "started": ready,
                 "restartCount": restarts.get(c["name"], 0), "state": state} for c in containers]

    def run(self, namespace: str, name: str) -> None:
        def change(status: dict, pod: dict) -> None:
            status.update(phase="Running", hostIP="127.0.0.1", podIP="10.244.0.10", startTime=status.get("startTime") or _now(),
                          containerStatuses=self._container_status(pod, {"running": {"startedAt": _now()}}, True))
            conditions = [c for c in status.get("conditions") or [] if c["type"] not in ("Ready", "ContainersReady")]
            status["conditions"] = conditions + [
                {"type": kind, "status": "True", "lastTransitionTime": _now()} for kind in ("Ready", "ContainersReady")]

        self.set_status(namespace, name, change)

    def _terminate(self, namespace: str, name: str, phase: str, exit_code: int, container_reason: str,
                   termination_message: str | None, **pod_fields: Any) -> None:
        extra_conditions = pod_fields.pop("extra_conditions", [])

        def change(status: dict, pod: dict) -> None:
            container = pod["spec"]["containers"][0]
            terminated: dict[str, Any] = {"exitCode": exit_code, "reason": container_reason, "finishedAt": _now(),
                                          "startedAt": status.get("startTime") or _now()}
            if termination_message:
                terminated["message"] = termination_message.encode()[-TERMINATION_MESSAGE_MAX_BYTES:].decode(
                    errors="ignore")
            elif exit_code and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                text = self._logs.get((namespace, name, container["name"]), "")
                tail = "\n".join(text.splitlines()[-FALLBACK_LOG_LINES:])
                if tail:
                    terminated["message"] = tail.encode()[-FALLBACK_LOG_BYTES:].decode(errors="ignore")
            status.update(phase=phase, hostIP="127.0.0.1", startTime=status.get("startTime") or _now(),
                          containerStatuses=self._container_status(pod, {"terminated": terminated}), **pod_fields)
            status["conditions"] = [c for c in status.get("conditions") or []
                                    if c["type"] not in ("Ready", "ContainersReady")] + [
                {"type": kind, "status": "False", "reason": "PodCompleted" if phase == "Succeeded" else "PodFailed",
                 "lastTransitionTime": _now()} for kind in ("Ready", "ContainersReady")] + extra_conditions

        self.set_status(namespace, name, change)

    def succeed(self, namespace: str, name: str, termination_message: str | None = None) -> None:
        """The container exited 0, having written ``termination_message`` to its termination-log file."""
        self._terminate(namespace, name, "Succeeded", 0, "Completed", termination_message)

    def fail(self, namespace: str, name: str, exit_code: int = 1, reason: str = "Error",
             termination_message: str | None = None) -> None:
        self._terminate(namespace, name, "Failed", exit_code, reason, termination_message)

    def oom_kill(self, namespace: str, name: str) -> None:
        self._terminate(namespace, name, "Failed", 137, "OOMKilled", None)

    def evict(self, namespace: str, name: str, message: str) -> None:
        """The kubelet's eviction: the pod fails with a DisruptionTarget condition."""
        disruption = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                      "message": message, "lastTransitionTime": _now()}
        self._terminate(namespace, name, "Failed", 137, "Error", None, reason="Evicted", message=message,
                        extra_conditions=[disruption])

    def terminating(self, namespace: str, name: str) -> None:
        """A pod deleted gracefully, its container stopped by SIGTERM, that this kubelet has not
        removed yet (it stays Terminating until the test ends)."""
        from kubernetes import client

        self._lingering.add((namespace, name))
        self.plane.core.delete_namespaced_pod(name, namespace, body=client.V1DeleteOptions(grace_period_seconds=30))
        self._terminate(namespace, name, "Failed", 143, "Error", None)

    def release(self, namespace: str) -> None:
        """Remove, as any other, the pods of ``namespace`` a test kept Terminating."""
        kept = {(ns, name) for ns, name in self._lingering if ns == namespace}
        self._lingering -= kept
        if kept:
            self._remove_deleted_pods()  # no event will tell the watch that they may go now

    def waiting(self, namespace: str, name: str, reason: str, message: str) -> None:
        def change(status: dict, pod: dict) -> None:
            status.update(phase="Pending", hostIP="127.0.0.1",
                          containerStatuses=self._container_status(pod, {"waiting": {"reason": reason,
                                                                                     "message": message}}))

        self.set_status(namespace, name, change)

    # -- the log endpoint ------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        kubelet = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep pytest's output clean
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                parts = [unquote(p) for p in url.path.strip("/").split("/")]
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self._send(404, f"this kubelet serves /containerLogs only, not {url.path}")
                    return
                _, namespace, pod, container = parts
                text = kubelet._logs.get((namespace, pod, container))
                if text is None:
                    self._send(400, f'container "{container}" in pod "{pod}" is waiting to start: ContainerCreating')
                    return
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                lines = text.splitlines(keepends=True)
                if "tailLines" in query:
                    tail = int(query["tailLines"])
                    lines = lines[-tail:] if tail else []
                self._send(200, "".join(lines))

            def _send(self, code: int, text: str) -> None:
                data = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
