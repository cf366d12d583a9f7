"""The node agent (kube/node, ``airflow-tf-node``) on a plane of its own: ``scripts/kube up --node``.

Its pods run as real local processes: a Job succeeds or is failed by the real Job controller on
its process's exit code, its output is read through the API server, pods reach each other by IP,
and ``scripts/kube down`` leaves no process, mount or network namespace behind.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest
from .host import down, mounts, namespaces, node_prefix, plane_env, processes, up_with_node
from k8s.plane import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="the node agent makes namespaces (root)")]


def _job(name: str, image: str, command: list[str], **pod: object) -> dict:
    container = {"name": "main", "image": image, "command": command,
                 "terminationMessagePolicy": "FallbackToLogsOnError"}
    container.update(pod.pop("container", {}))
    return {"metadata": {"name": name}, "spec": {"backoffLimit": 0, "template": {"spec": {
        "restartPolicy": "Never", "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 5,
        "containers": [container], **pod}}}}


def _log(core, pod: str, namespace: str) -> str:
    """The pod's log through the API server (which asks the node's kubelet API for it)."""
    return core.read_namespaced_pod_log(pod, namespace, _preload_content=False).data.decode()


def _condition(job, kind: str) -> bool:
    return any(c.type == kind and c.status == "True" for c in job.status.conditions or [])


def test_node_runs_pods_as_processes_and_leaves_nothing_after_down(tmp_path):
    from kubernetes import client, config

    marker = f"aftf-node-test-{uuid.uuid4().hex[:8]}"
    # Mount points missing on the host, of this test's own (another plane's pods may run beside it).
    data, runs = Path(f"/{marker}-data"), Path(f"/{marker}-runs")
    directory = tmp_path / "plane"
    up_with_node(directory)
    prefix = node_prefix(directory)
    try:
        env = plane_env(directory)
        image, storage = env["AIRFLOW_TF_KUBE_IMAGE"], Path(env["AIRFLOW_TF_KUBE_STORAGE"])
        api = config.new_client_from_config(config_file=str(directory / "kubeconfig"))
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        ns = "node-test"
        core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda: core.list_namespaced_service_account(ns).items, 30, "the default service account")
        (storage / "data" / "hello.txt").write_text("hello from the storage folder\n")
        # A claim the real PV controller binds to the plane's hostPath volume of the storage folder.
        core.create_namespaced_persistent_volume_claim(ns, {"metadata": {"name": "data"}, "spec": {
            "accessModes": ["ReadWriteMany"], "storageClassName": env["AIRFLOW_TF_KUBE_STORAGE_CLASS"],
            "selector": {"matchLabels": {"airflow-tf/storage": "data"}}, "resources": {"requests": {"storage": "1Gi"}}}})
        wait_for(lambda: core.read_namespaced_persistent_volume_claim("data", ns).status.phase == "Bound", 30,
                 "the claim bound")

        # The training image is this interpreter's environment: `python` is its python, for the
        # non-root user the manifests run as too.
        batch.create_namespaced_job(ns, _job("ok", image, [
            "python", "-c", "import os, sys; print('prefix', sys.prefix, 'uid', os.getuid()); "
            f"print(open('{data}/hello.txt').read())", marker],
            securityContext={"runAsNonRoot": True, "runAsUser": 1000},
            volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            container={"volumeMounts": [{"name": "data", "mountPath": str(data), "readOnly": True}]}))
        # A non-root user, its env from the downward API, a termination message, exit code 3.
        batch.create_namespaced_job(ns, _job("fails", image, [
            "/bin/sh", "-c", 'echo "uid $(id -u) pod $POD $INDEX_OF"; echo why > /dev/termination-log; '
                          f'echo written > {runs}/by-1000; exit 3', marker],
            securityContext={"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000},
            volumes=[{"name": "runs", "hostPath": {"path": str(storage / "runs")}}],
            container={"volumeMounts": [{"name": "runs", "mountPath": str(runs)}],
                       "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                               {"name": "INDEX_OF", "value": "of $(POD)"}],
                       "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}))
        # A server pod, and a client Job reaching it by the IP the node gave it, and by the name the
        # cluster DNS answers from the EndpointSlice of its headless Service (as TF_CONFIG names tasks).
        core.create_namespaced_service(ns, {"metadata": {"name": "g1"}, "spec": {
            "clusterIP": "None", "selector": {"app": "g1"}, "publishNotReadyAddresses": True,
            "ports": [{"name": "http", "port": 8080}]}})
        core.create_namespaced_pod(ns, {"metadata": {"name": "server", "labels": {"app": "g1"}}, "spec": {
            "hostname": "srv", "subdomain": "g1",
            "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": image, "command": [
                "python", "-c", "import http.server as h; h.HTTPServer(('', 8080), h.SimpleHTTPRequestHandler)"
                ".serve_forever()", marker]}]}})
        server = wait_for(lambda: (lambda p: p if p.status.pod_ip and p.status.phase == "Running" else None)(
            core.read_namespaced_pod("server", ns)), 60, "the server pod running with an IP")
        assert server.status.pod_ip.startswith("10.244.0."), server.status.pod_ip
        batch.create_namespaced_job(ns, _job("client", image, ["python", "-c", CLIENT, server.status.pod_ip, marker]))
        # An image the node has no environment for: refused as a pull error is.
        core.create_namespaced_pod(ns, {"metadata": {"name": "unknown-image"}, "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": "registry.example.com/nope:1", "command": ["true"]}]}})

        def pod_of(job: str):
            return core.list_namespaced_pod(ns, label_selector=f"batch.kubernetes.io/job-name={job}").items[0]

        jobs = {name: wait_for(lambda n=name: (lambda j: j if _condition(j, "Complete") or _condition(j, "Failed")
                                                else None)(batch.read_namespaced_job(n, ns)), 240, f"Job {name} done")
                for name in ("ok", "fails", "client")}
        assert _condition(jobs["ok"], "Complete"), _log(core, pod_of("ok").metadata.name, ns)
        assert _condition(jobs["client"], "Complete"), _log(core, pod_of("client").metadata.name, ns)
        assert _condition(jobs["fails"], "Failed")

        failed = pod_of("fails")
        terminated = failed.status.container_statuses[0].state.terminated
        assert (terminated.exit_code, terminated.reason, terminated.message) == (3, "Error", "why\n")
        assert failed.status.phase == "Failed"
        assert (storage / "runs" / "by-1000").stat().st_uid == 1000
        # Logs through the API server, which asks the node's kubelet API.
        assert _log(core, failed.metadata.name, ns) == \
            f"uid 1000 pod {failed.metadata.name} of {failed.metadata.name}\n"
        ok_log = _log(core, pod_of("ok").metadata.name, ns)
        assert f"prefix {sys.prefix} uid 1000" in ok_log and "hello from the storage folder" in ok_log
        assert _log(core, pod_of("client").metadata.name, ns).split() == [
            "200", server.status.pod_ip, "200"], _log(core, pod_of("client").metadata.name, ns)

        waiting = wait_for(lambda: (lambda s: s[0].state.waiting if s and s[0].state.waiting
                                    and s[0].state.waiting.reason == "ErrImagePull" else None)(
            core.read_namespaced_pod("unknown-image", ns).status.container_statuses), 30, "ErrImagePull")
        assert "registry.example.com/nope:1" in waiting.message
        wait_for(lambda: any(e.type == "Warning" and "ErrImagePull" in e.message for e in core.list_namespaced_event(
            ns, field_selector="involvedObject.name=unknown-image").items), 30, "the ErrImagePull event")

        # The server's process runs until the pod is deleted: SIGTERM, and then the node removes it.
        assert processes(marker)
        core.delete_namespaced_pod("server", ns)
        wait_for(lambda: not [p for p in core.list_namespaced_pod(ns).items if p.metadata.name == "server"], 30,
                 "the server pod removed by the node")
        assert namespaces(prefix)  # the bridge's, at least
    finally:
        down(directory)
    assert not processes(marker)
    assert not processes(str(directory))
    assert namespaces(prefix) == []
    assert mounts(prefix, str(directory)) == []
    # The mount points the node made on the host for the volumes are gone.
    assert (data.exists(), runs.exists()) == (False, False)


# Fetches from the server by IP, resolves its DNS name (waiting for the EndpointSlice), fetches by name.
# A pod is Running once its process starts, before the server listens: each step retries for a minute
# (a loaded machine can take seconds to start Python); the last error fails the Job with its traceback.
CLIENT = """
import socket, sys, time, urllib.request as u
def retry(step):
    deadline = time.monotonic() + 60
    while True:
        try:
            return step()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
name = "srv.g1.node-test.svc.cluster.local"
print(retry(lambda: u.urlopen(f"http://{sys.argv[1]}:8080/", timeout=5).status))
print(retry(lambda: socket.gethostbyname(name)))
print(retry(lambda: u.urlopen(f"http://{name}:8080/", timeout=5).status))
"""


def _pod(name: str, image: str, command: list[str], **spec: object) -> dict:
    container = {"name": "main", "image": image, "command": command}
    container.update(spec.pop("container", {}))
    return {"metadata": {"name": name}, "spec": {"automountServiceAccountToken": False, "containers": [container],
                                                 **spec}}


def test_node_probes_restarts_and_grace_periods(tmp_path):
    from kubernetes import client, config

    marker = f"aftf-node-test-{uuid.uuid4().hex[:8]}"
    scratch = Path(f"/{marker}-scratch")  # a mount point missing on the host, of this test's own
    directory = tmp_path / "plane"
    up_with_node(directory)
    prefix = node_prefix(directory)
    try:
        image = plane_env(directory)["AIRFLOW_TF_KUBE_IMAGE"]
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(directory / "kubeconfig")))
        ns = "default"
        failing = {"exec": {"command": ["/bin/sh", "-c", "exit 1"]}, "periodSeconds": 1, "failureThreshold": 2}
        sleeper = ["/bin/sh", "-c", "while :; do sleep 1; done", marker]  # the shell stays, the marker in its argv
        # A liveness probe that fails: the container is stopped (SIGTERM), and restarted (OnFailure)...
        core.create_namespaced_pod(ns, _pod("restarted", image, sleeper, restartPolicy="OnFailure",
                                            terminationGracePeriodSeconds=2, container={"livenessProbe": failing}))
        # ... or, under Never, the pod fails.
        core.create_namespaced_pod(ns, _pod("failed", image, sleeper, restartPolicy="Never",
                                            terminationGracePeriodSeconds=2, container={"livenessProbe": failing}))
        # A startup probe that outlasts its timeout fails too.
        slow = {"exec": {"command": ["/bin/sh", "-c", "sleep 30"]}, "timeoutSeconds": 1, "failureThreshold": 1}
        core.create_namespaced_pod(ns, _pod("slow-start", image, sleeper, restartPolicy="Never",
                                            terminationGracePeriodSeconds=2, container={"startupProbe": slow}))
        # A process that ignores SIGTERM is killed once the grace period is over.
        core.create_namespaced_pod(ns, _pod("stubborn", image, ["/bin/sh", "-c", "trap '' TERM; while :; do sleep 1; done",
                                                                marker],
                                            restartPolicy="Never", terminationGracePeriodSeconds=3))

        def status(name: str):
            return core.read_namespaced_pod(name, ns).status

        restarted = wait_for(lambda: (lambda s: s if s.container_statuses and s.container_statuses[0].restart_count >= 1
                                      else None)(status("restarted")), 60, "a restart after the liveness probe failed")
        last = restarted.container_statuses[0].last_state.terminated
        assert (last.exit_code, last.reason) == (143, "Error")  # stopped by SIGTERM
        for name in ("failed", "slow-start"):
            failed = wait_for(lambda n=name: (lambda s: s if s.phase == "Failed" else None)(status(n)), 60,
                              f"pod {name} failed")
            terminated = failed.container_statuses[0].state.terminated
            assert (terminated.exit_code, terminated.reason) == (143, "Error"), name
        wait_for(lambda: any(e.reason == "Unhealthy" and "Liveness" in e.message for e in core.list_namespaced_event(
            ns, field_selector="involvedObject.name=failed").items), 30, "the Unhealthy event")

        wait_for(lambda: status("stubborn").phase == "Running", 30, "pod stubborn running")
        started = time.monotonic()
        core.delete_namespaced_pod("stubborn", ns)
        wait_for(lambda: not [p for p in core.list_namespaced_pod(ns).items if p.metadata.name == "stubborn"], 30,
                 "pod stubborn removed")
        assert 3 <= time.monotonic() - started < 15  # SIGKILL after the grace period, not before
        assert not [p for p in processes(marker) if "trap" in p]

        # A node agent killed outright leaves its network namespaces and mount points: down removes them.
        orphan = f"{marker}-orphan"
        core.create_namespaced_pod(ns, _pod("orphan", image, [*sleeper[:-1], orphan], securityContext={"runAsUser": 1000},
                                            volumes=[{"name": "v", "emptyDir": {}}],
                                            container={"volumeMounts": [{"name": "v", "mountPath": str(scratch)}]}))
        wait_for(lambda: processes(orphan), 30, "pod orphan's process")
        os.kill(int((directory / "run" / "airflow-tf-node.pid").read_text()), signal.SIGKILL)
        time.sleep(1)
        # Its pods' processes die with it (the parent-death signal); its namespaces and mount points stay.
        assert scratch.exists() and namespaces(prefix)
    finally:
        down(directory)
    assert not processes(marker)
    assert (namespaces(prefix), mounts(prefix, str(directory)), scratch.exists()) == ([], [], False)
