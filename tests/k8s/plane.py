"""The Kubernetes control plane the Kubernetes tests run against, and one test's view of it.

``scripts/kube up --nodes 1`` starts a private plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, built from kube/go.mod) and a real node (kubelet,
containerd, the training image loaded) once per test session; ``AIRFLOW_TF_TEST_KUBECONFIG``
names an existing cluster instead (an admin kubeconfig), where the tests that read the private
plane's audit log or etcd skip. Each test gets a namespace of its own, a service account bound only to the shipped
``airflow_tf/rbac/role.yaml``, and a kubeconfig holding that account's token: the backend runs
with it, so the real authorizer decides what it may do.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from airflow_tf.backends.kubernetes import access
from airflow_tf.backends.kubernetes.access import team_namespace

ROOT = Path(__file__).resolve().parents[2]
KUBE_SCRIPT = ROOT / "scripts" / "kube"
ROLE_FILE = access.ROLE_FILE
CLUSTER_ENV = "AIRFLOW_TF_TEST_KUBECONFIG"
BACKEND_ACCOUNT = access.ACCOUNT
TOKEN_SECONDS = 3600
VOLUME_CLASS = "airflow-tf-test"
VOLUME_NAMESPACE_LABEL = "airflow-tf-test/namespace"  # on the volumes a test's claims are bound to
# The kubelets' (put back by the last plane down). Not IPv4 forwarding: the nodes' network
# namespaces have their own, and podman's netavark (the compose test) may turn the host's on meanwhile.
SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops")
HOST_PATHS = ("/var/lib/kubelet", "/var/log/containers", "/run/containerd", "/var/lib/cni", "/opt/containerd")


def host_state(directory: Path) -> dict:
    """What a plane in ``directory`` with real nodes may change on this machine."""
    real: dict = {}
    if (directory / "plane.json").exists():
        real = json.loads((directory / "plane.json").read_text()).get("real_nodes") or {}
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    processes = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and str(directory) in cmdline and int(proc.name) != os.getpid():
            processes.append(cmdline)
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return {
        "sysctls": {name: subprocess.run(["sysctl", "-n", name], capture_output=True, text=True).stdout.strip()
                    for name in SYSCTLS},
        "aftf links": sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines()
                             if line.split(":")[1].strip().startswith("aftf")),
        "processes": processes,
        "mounts": [m for m in mounts if m.startswith(str(directory)) or "kubelet" in m or "containerd" in m],
        "cgroups": sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/aftf-*")),
        "host paths": {path: sorted(os.listdir(path)) if os.path.isdir(path) else None for path in HOST_PATHS},
        # Other programs (podman's netavark) may change theirs meanwhile: only Kubernetes' and the nodes' count.
        "iptables": [rule for rule in subprocess.run(["iptables-save"], capture_output=True, text=True).stdout.splitlines()
                     if "KUBE" in rule or "aftf" in rule or "10.199." in rule or "CNI" in rule],
        "nodes": sorted(real.get("nodes") or {}),
        "tag": real.get("tag", ""),
    }


def other_nodes_run() -> bool:
    """Whether a kubelet or containerd runs on this machine (another plane's, once ours is down)."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().strip() in ("kubelet", "containerd"):
                return True
        except OSError:
            continue
    return False


REMOVAL_BOUND = 120.0
"""Seconds to wait for a deleted group's objects to be gone: its pods take the garbage
collector's turn, the kubelet's SIGTERM and next sync, and the Job controller's release of its
finalizer, each of which waits its turn on a node the rest of the suite keeps loaded (30 s was
seen too short there)."""


def wait_for(predicate, timeout: float = 30.0, what: str = "condition", interval: float = 0.1):
    """The predicate's first truthy value, or AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Call:
    """One request of the backend's service account, from the API server's audit log."""

    verb: str
    resource: str
    """``pods``, ``pods/log``, ``jobs`` ..."""
    api_group: str
    namespace: str
    name: str | None
    query: dict[str, str]
    time: float
    """When the API server received it (seconds since the epoch)."""
    code: int | None = None
    """The HTTP status of its answer; None until answered (a watch, while it runs)."""


class Plane:
    """A control plane: the private one of ``scripts/kube up`` (``directory`` set), or a cluster."""

    def __init__(self, admin_kubeconfig: Path, directory: Path | None = None) -> None:
        from kubernetes import client, config

        self.admin_kubeconfig = admin_kubeconfig
        self.directory = directory
        self.info = json.loads((directory / "plane.json").read_text()) if directory else {}
        self.api = config.new_client_from_config(config_file=str(admin_kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)
        self.networking = client.NetworkingV1Api(self.api)
        self.server = self.api.configuration.host

    @property
    def private(self) -> bool:
        """Whether this is the session's own plane (its audit log and etcd are the tests' to read)."""
        return self.directory is not None

    @classmethod
    def start(cls, directory: Path, *options: str) -> Plane:
        """``scripts/kube up DIR`` with ``options`` (``--nodes 1`` ...), owned by this process."""
        subprocess.run([sys.executable, str(KUBE_SCRIPT), "up", str(directory), *options,
                        "--owner-pid", str(os.getpid())], check=True, stdout=subprocess.DEVNULL)
        return cls(directory / "kubeconfig", directory)

    def stop(self) -> None:
        if self.directory is not None:
            subprocess.run([sys.executable, str(KUBE_SCRIPT), "down", str(self.directory)], check=True)

    def start_kueue(self) -> None:
        """Add Kueue and the JobSet controller to this private plane, once (``scripts/kube kueue``)."""
        assert self.directory is not None
        if not json.loads((self.directory / "plane.json").read_text()).get("kueue"):
            subprocess.run([sys.executable, str(KUBE_SCRIPT), "kueue", str(self.directory)], check=True,
                           stdout=subprocess.DEVNULL)

    def has_kueue(self) -> bool:
        """Whether the cluster serves the JobSet and Kueue Workload resources."""
        from kubernetes import client

        names = {crd.metadata.name for crd in client.ApiextensionsV1Api(self.api).list_custom_resource_definition().items}
        return {"jobsets.jobset.x-k8s.io", "workloads.kueue.x-k8s.io"} <= names

    def keep_logs(self, destination: Path) -> Path | None:
        """Copy the plane's logs (components and audit) to ``destination``; None on a cluster."""
        if self.directory is None:
            return None
        shutil.copytree(self.directory / "logs", destination, dirs_exist_ok=True)
        audit = self.directory / "audit.log"
        if audit.exists():
            shutil.copy(audit, destination / "audit.log")
        return destination

    # -- etcd ---------------------------------------------------------------------------------
    def _etcd(self, path: str, body: dict) -> dict:
        context = ssl.create_default_context(cafile=self.info["ca"])
        context.load_cert_chain(*self.info["etcd_client"])
        request = urllib.request.Request(self.info["etcd"] + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return json.loads(response.read())

    def compact_etcd(self) -> int:
        """Compact etcd up to its current revision, as the API server does every few minutes:
        every older resource version is gone. Returns that revision."""
        revision = int(self._etcd("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
        self._etcd("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    # -- the audit log ------------------------------------------------------------------------
    def calls(self, namespace: str, user: str) -> list[Call]:
        """Every request ``user`` made in ``namespace``, in order."""
        path = Path(self.info["audit_log"])
        calls: dict[str, Call] = {}  # by audit id: the request's events, received then answered
        for line in path.read_text().splitlines() if path.exists() else []:
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            if event["user"]["username"] != user or ref.get("namespace") != namespace:
                continue
            if event["stage"] == "ResponseComplete" and event["auditID"] in calls:
                calls[event["auditID"]].code = (event.get("responseStatus") or {}).get("code")
                continue
            resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            query = {k: v[-1] for k, v in parse_qs(urlsplit(event["requestURI"]).query).items()}
            received = dt.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            calls[event["auditID"]] = Call(event["verb"], resource, ref.get("apiGroup", ""), namespace,
                                           ref.get("name"), query, received.timestamp())
        return list(calls.values())

    # -- namespaces ---------------------------------------------------------------------------
    def new_namespace(self, prefix: str, directory: Path) -> TestNamespace:
        """A fresh team namespace as ``airflow-tf render --rbac`` makes it (Pod Security Admission
        ``restricted`` enforced, the backend's service account bound only to role.yaml), and a
        kubeconfig for that account written into ``directory``."""
        name = f"{prefix[:40].rstrip('-')}-{uuid.uuid4().hex[:6]}"
        self.apply(team_namespace(name))
        # Pods can only be made once the namespace's default service account exists.
        wait_for(lambda: _exists(lambda: self.core.read_namespaced_service_account("default", name)), 30,
                 f"the default service account of namespace {name}")
        kubeconfig = directory / "kubeconfig"
        _write_kubeconfig(kubeconfig, self.api.configuration, self.token(name, BACKEND_ACCOUNT), name)
        return TestNamespace(self, name, kubeconfig)

    def apply(self, objects: list[dict]) -> None:
        """Create what ``airflow-tf render --rbac`` prints, as ``kubectl apply -f -`` would."""
        create = {"Namespace": lambda o: self.core.create_namespace(o),
                  "ServiceAccount": lambda o: self.core.create_namespaced_service_account(o["metadata"]["namespace"], o),
                  "Role": lambda o: self.rbac.create_namespaced_role(o["metadata"]["namespace"], o),
                  "RoleBinding": lambda o: self.rbac.create_namespaced_role_binding(o["metadata"]["namespace"], o)}
        for obj in objects:
            create[obj["kind"]](obj)

    def token(self, namespace: str, account: str) -> str:
        """A token of service account ``account`` of ``namespace``."""
        return self.core.create_namespaced_service_account_token(account, namespace, {
            "spec": {"expirationSeconds": TOKEN_SECONDS}}).status.token

    def delete_namespace(self, name: str) -> None:
        """Delete a test's namespace; the namespace controller removes what is left in it."""
        with _ignore_missing():
            self.core.delete_namespace(name)
        self.core.delete_collection_persistent_volume(label_selector=f"{VOLUME_NAMESPACE_LABEL}={name}")


class TestNamespace:
    """One test's namespace, what is in it, and what the backend asked of the API server."""

    __test__ = False  # not a test class, for pytest

    def __init__(self, plane: Plane, name: str, kubeconfig: Path) -> None:
        self.plane, self.ns, self.kubeconfig = plane, name, kubeconfig
        self.user = f"system:serviceaccount:{name}:{BACKEND_ACCOUNT}"

    def objects(self, resource: str, selector: str | None = None, namespace: str | None = None) -> list[dict]:
        """The objects of ``resource`` (jobs, pods, services, networkpolicies), by name; pods
        marked for deletion are there until their containers stopped and the kubelet removed them."""
        namespace = namespace or self.ns
        lister = {"jobs": self.plane.batch.list_namespaced_job, "pods": self.plane.core.list_namespaced_pod,
                  "services": self.plane.core.list_namespaced_service,
                  "networkpolicies": self.plane.networking.list_namespaced_network_policy}[resource]
        items = lister(namespace, label_selector=selector or "").items
        plain = [self.plane.api.sanitize_for_serialization(item) for item in items]
        return sorted(plain, key=lambda o: o["metadata"]["name"])

    def get(self, resource: str, name: str) -> dict | None:
        return next((o for o in self.objects(resource) if o["metadata"]["name"] == name), None)

    def remove(self, resource: str, name: str, propagation: str = "Background") -> None:
        """Delete an object behind the backend's back, as ``kubectl delete`` does."""
        from kubernetes import client

        delete = {"jobs": self.plane.batch.delete_namespaced_job, "pods": self.plane.core.delete_namespaced_pod,
                  "services": self.plane.core.delete_namespaced_service}[resource]
        delete(name, self.ns, body=client.V1DeleteOptions(propagation_policy=propagation))

    def admit(self, job: str) -> None:
        """Unsuspend a Job, as Kueue does when its queue admits it."""
        self.plane.batch.patch_namespaced_job(job, self.ns, {"spec": {"suspend": False}})

    def calls(self, verb: str | None = None, resource: str | None = None, since: float = 0.0) -> list[Call]:
        """The backend's requests in this namespace, from the audit log (the private plane only)."""
        import pytest

        if not self.plane.private:
            pytest.skip("the backend's requests are read from the private plane's audit log")
        return [c for c in self.plane.calls(self.ns, self.user)
                if (verb is None or c.verb == verb) and (resource is None or c.resource == resource)
                and c.time >= since]

    def volume_claim(self, claim: str, path: Path) -> None:
        """A PersistentVolumeClaim ``claim``, bound to a volume of its own, so that the scheduler
        places the pods that mount it: the host folder ``path`` (the node's containerd would
        make a missing one, so every claim names a folder of the test's own)."""
        from kubernetes.client.exceptions import ApiException

        volume = f"{self.ns}-{claim}"
        try:
            self.plane.core.create_persistent_volume({
                "metadata": {"name": volume, "labels": {VOLUME_NAMESPACE_LABEL: self.ns}},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                         "storageClassName": VOLUME_CLASS,
                         "hostPath": {"path": str(path)},
                         "claimRef": {"namespace": self.ns, "name": claim}}})
        except ApiException as e:
            if e.status != 409:
                raise
            return
        self.plane.core.create_namespaced_persistent_volume_claim(self.ns, {
            "metadata": {"name": claim},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": VOLUME_CLASS, "volumeName": volume,
                     "resources": {"requests": {"storage": "1Gi"}}}})
        wait_for(lambda: self.plane.core.read_namespaced_persistent_volume_claim(claim, self.ns).status.phase
                 == "Bound", 30, f"the persistent volume controller to bind claim {claim}")

    def gone(self, resource: str, selector: str | None = None) -> bool:
        """Whether nothing of ``resource`` is left (pods the kubelet has yet to remove count)."""
        return not self.objects(resource, selector)


def _exists(read) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        read()
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


class _ignore_missing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, traceback) -> bool:
        from kubernetes.client.exceptions import ApiException

        return isinstance(value, ApiException) and value.status == 404


def _write_kubeconfig(path: Path, configuration: Any, token: str, namespace: str) -> None:
    cluster: dict[str, Any] = {"server": configuration.host}
    if configuration.ssl_ca_cert:
        cluster["certificate-authority-data"] = base64.b64encode(Path(configuration.ssl_ca_cert).read_bytes()).decode()
    elif not configuration.verify_ssl:
        cluster["insecure-skip-tls-verify"] = True
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "backend",
        "clusters": [{"name": "plane", "cluster": cluster}],
        "users": [{"name": BACKEND_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "backend", "context": {"cluster": "plane", "user": BACKEND_ACCOUNT,
                                                      "namespace": namespace}}]}))
    path.chmod(0o600)
