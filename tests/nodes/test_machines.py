"""The nodes of ``scripts/kube up --nodes 3`` as machines: all Ready, pods on different nodes reach
each other by IP and by DNS name, a node stopped the way a lost machine goes turns NotReady within
the plane's grace period with none of its processes left and comes back with ``node start``, and a
node whose pod network is cut keeps reporting Ready while its pods reach no other node's until
``node join``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from k8s.plane import KUBE_SCRIPT, wait_for

from .host import plane_env, processes, real_nodes

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="a kubelet and containerd run as root")]

GRACE_SECONDS = 20  # the plane's --node-monitor-grace-period
PORT = 8080
SERVE = f"import http.server as h; h.HTTPServer(('', {PORT}), h.SimpleHTTPRequestHandler).serve_forever()"
FETCH = ("import sys, urllib.request as u\n"
         "try:\n    u.urlopen(sys.argv[1], timeout=3); print('REACHED')\n"
         "except Exception as e:\n    print('UNREACHABLE', e)\n")


def _node(directory: Path, action: str, node: str) -> None:
    subprocess.run([sys.executable, str(KUBE_SCRIPT), "node", action, str(directory), node], check=True,
                   capture_output=True, timeout=180)


def _ready(core, node: str) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in core.read_node(node).status.conditions or [])


def _reaches(core, namespace: str, pod: str, url: str) -> bool:
    from kubernetes.stream import stream

    answer = stream(core.connect_get_namespaced_pod_exec, pod, namespace, command=["python", "-c", FETCH, url],
                    stdout=True, stderr=True, stdin=False, tty=False, _request_timeout=60)
    assert "REACHED" in answer or "UNREACHABLE" in answer, answer
    return "REACHED" in answer


def _node_processes(directory: Path, node: dict) -> list[str]:
    """The node's processes: its kubelet, containerd and shims (their command lines name its
    directory) and its containers' (in its cgroup root)."""
    in_cgroups = sorted({pid for procs in Path("/sys/fs/cgroup").glob(f"*/{node['cgroup_root']}/**/cgroup.procs")
                         for pid in procs.read_text().split()})
    return processes(f"{node['dir']}/") + in_cgroups


@pytest.mark.timeout(1800)  # the package's plane may start in it (the training image's import: minutes under load)
def test_three_nodes_reach_each_other_and_survive_a_stop_and_a_cut(nodes_plane):
    from kubernetes import client, config

    directory, _ = nodes_plane
    env, nodes = plane_env(directory), real_nodes(directory)["nodes"]
    core = client.CoreV1Api(config.new_client_from_config(config_file=env["KUBECONFIG"]))
    assert sorted(n.metadata.name for n in core.list_node().items if _ready(core, n.metadata.name)) == \
        ["node-1", "node-2", "node-3"]

    namespace = f"machines-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        core.create_namespaced_service(namespace, {"metadata": {"name": "peers"}, "spec": {
            "clusterIP": "None", "selector": {"app": "peer"}}})
        for pod, node in (("one", "node-1"), ("three", "node-3")):
            core.create_namespaced_pod(namespace, {"metadata": {"name": pod, "labels": {"app": "peer"}}, "spec": {
                "hostname": pod, "subdomain": "peers", "nodeName": node, "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "serve", "image": env["AIRFLOW_TF_KUBE_IMAGE"], "imagePullPolicy": "Never",
                                "command": ["python", "-c", SERVE],
                                "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1}}]}})

        def ready_ip(pod: str) -> str | None:
            status = core.read_namespaced_pod(pod, namespace).status
            return status.pod_ip if any(c.ready for c in status.container_statuses or []) else None

        one, three = (wait_for(lambda p=p: ready_ip(p), 120, f"pod {p} ready") for p in ("one", "three"))
        assert one.startswith(nodes["node-1"]["pod_subnet"].rsplit(".", 1)[0] + ".")
        assert three.startswith(nodes["node-3"]["pod_subnet"].rsplit(".", 1)[0] + ".")
        # Across nodes, by IP and by the pod's DNS name under its headless Service.
        assert _reaches(core, namespace, "one", f"http://{three}:{PORT}/")
        assert _reaches(core, namespace, "one", f"http://three.peers.{namespace}.svc.cluster.local:{PORT}/")
        assert _reaches(core, namespace, "three", f"http://one.peers:{PORT}/")

        # A lost machine: everything of node-2 killed at once; the control plane judges it NotReady.
        assert _node_processes(directory, nodes["node-2"]), "node-2 runs nothing to stop"
        stopped = time.monotonic()
        _node(directory, "stop", "node-2")
        assert _node_processes(directory, nodes["node-2"]) == []
        wait_for(lambda: not _ready(core, "node-2"), GRACE_SECONDS + 15, "node-2 NotReady", interval=1)
        not_ready_after = time.monotonic() - stopped
        assert not_ready_after > GRACE_SECONDS - 6, f"NotReady after {not_ready_after:.0f} s: before its grace period"
        _node(directory, "start", "node-2")  # waits for Ready itself
        assert _ready(core, "node-2")

        # node-3's pod network cut: its pod reaches no other node's, nor they it, while the kubelet
        # (host side) keeps the Node Ready past the grace period.
        _node(directory, "cut", "node-3")
        try:
            assert not _reaches(core, namespace, "three", f"http://{one}:{PORT}/")
            assert not _reaches(core, namespace, "one", f"http://{three}:{PORT}/")
            time.sleep(GRACE_SECONDS + 5)
            assert _ready(core, "node-3")
        finally:
            _node(directory, "join", "node-3")
        assert _reaches(core, namespace, "three", f"http://{one}:{PORT}/")
        assert _reaches(core, namespace, "one", f"http://{three}:{PORT}/")
    finally:
        core.delete_namespace(namespace)
        wait_for(lambda: not [n for n in core.list_namespace().items if n.metadata.name == namespace], 120,
                 f"namespace {namespace} deleted", interval=1)


def test_node_commands_name_the_plane_and_node_they_cannot_act_on(nodes_plane, tmp_path):
    directory, _ = nodes_plane

    def node(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(KUBE_SCRIPT), "node", *args], capture_output=True, text=True,
                              timeout=60)

    unknown = node("stop", str(directory), "node-9")
    assert unknown.returncode != 0 and f"the plane in {directory} has no node 'node-9'" in unknown.stderr
    assert "its nodes: node-1, node-2, node-3" in unknown.stderr
    nowhere = node("start", str(tmp_path / "none"), "node-1")
    assert nowhere.returncode != 0 and f"{tmp_path / 'none'} holds no running plane" in nowhere.stderr
    running = node("start", str(directory), "node-1")
    assert running.returncode != 0 and "node node-1 of the plane" in running.stderr and "is running" in running.stderr
    joined = node("join", str(directory), "node-1")
    assert joined.returncode != 0 and "the pod network of node node-1" in joined.stderr and "is not cut" in joined.stderr
