"""Real nodes (``up --nodes N``): per node a containerd in a network namespace of its own and a kubelet
with its own identity, the cluster DNS, the storage folder as PersistentVolumes, the plane's DIR/env;
and one node's life after ``up``: stopped as a lost machine goes, started again, its pod network cut
and joined."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from airflow_tf.plane_env import write_plane_env

from .api import api_get, api_send
from .build import build_runtime
from .host import (
    CNI_BIN,
    HOST_DIRS,
    RUNC,
    Node,
    RealNodes,
    host_subnet,
    shared_host_state,
    in_netns,
    kill_cgroup_root,
    make_cgroup_root,
    make_network,
    node_packages,
)
from .images import PAUSE_IMAGE, image_archive, pause_archive, training_image
from .process import comm, free_port, log, ours, sign, start, stop, wait_for

STORAGE_CLASS = "airflow-tf-storage"
# Where the manifests mount the data and runs claims (airflow-tf render --data-mount/--runs-mount).
STORAGE_VOLUMES = {"data": "/data", "runs": "/runs"}
# The whole storage folder, for Airflow tasks and pods that share it at one path (the DAGs'
# [airflow_tf] storage): a claim of it is mounted at the folder's own path.
STORAGE_ROOT_VOLUME = "airflow-tf-storage"
# The group the backend's pods run with by default (their fs_group, the training image's uid):
# the storage folder is theirs to write, and folders the Airflow side makes in it inherit it.
POD_GROUP = 1000


MAX_NODES = 50
COREDNS_USER = "system:airflow-tf-coredns"


COREFILE = """\
# The cluster DNS: names of Services and of pods with a hostname and subdomain, from the
# EndpointSlices the real controller writes. No other name is answered (nothing leaves the machine).
cluster.local:{port} {{
    bind {host}
    errors
    kubernetes cluster.local {{
        kubeconfig {kubeconfig} airflow-tf-kube
    }}
}}
"""


def start_dns(directory: Path, bin_dir: Path, host: str = "127.0.0.1", port: int | None = None,
              credentials: Path | None = None) -> str:
    """Start CoreDNS on ``host`` (an address the pods reach); returns its host:port."""
    port = port or free_port()
    corefile = directory / "run" / "Corefile"
    corefile.write_text(COREFILE.format(host=host, port=port,
                                        kubeconfig=credentials or directory / "run" / "node.kubeconfig"))
    start(directory, "coredns", [str(bin_dir / "coredns"), "-conf", str(corefile)])

    def answers() -> bool:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return True
        return False

    wait_for("coredns", answers, directory)
    return f"{host}:{port}"


def start_storage(directory: Path, server: str, pki: Path, admin: str, storage: Path | None) -> dict[str, str]:
    """Offer a storage folder to the pods as hostPath PersistentVolumes (the nodes run on this
    host): data/ and runs/ for claims the manifests mount at /data and /runs, and the whole folder
    for DAGs whose tasks share it with the pods at its own path. Returns what DIR/env says of it."""
    storage = (storage or directory / "storage").resolve()
    # Claims of the whole folder are mounted at its own path, which the pods' non-root user walks.
    closed = [str(parent) for parent in storage.parents if parent.exists() and not parent.stat().st_mode & 0o001]
    if closed:
        log(f"warning: the storage folder {storage} is below {closed[0]}, which other users cannot enter: "
            f"pods (uid {POD_GROUP}) that mount {STORAGE_ROOT_VOLUME} will not reach it; choose one elsewhere "
            f"with --storage, e.g. under /tmp")
    # Set-group-id: what is made below belongs to the pods' group too. data/ and runs/ are
    # also for pods that run as a non-root user of their choice.
    for folder, mode in ((storage, 0o2775), *((storage / name, 0o2777) for name in STORAGE_VOLUMES)):
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, -1, POD_GROUP)
        folder.chmod(mode)
    for name, path in [*((name, storage / name) for name in STORAGE_VOLUMES), ("storage", storage)]:
        api_send(server, pki / "ca.crt", admin, "/api/v1/persistentvolumes", {
            "metadata": {"name": f"airflow-tf-{name}", "labels": {"airflow-tf/storage": name}},
            "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                     "storageClassName": STORAGE_CLASS, "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": str(path), "type": "Directory"}}})
    return {"AIRFLOW_TF_KUBE_STORAGE": str(storage), "AIRFLOW_TF_KUBE_STORAGE_CLASS": STORAGE_CLASS,
            "AIRFLOW_TF_KUBE_STORAGE_VOLUME": STORAGE_ROOT_VOLUME,
            **{key: value for name, mount in STORAGE_VOLUMES.items() for key, value in (
                (f"AIRFLOW_TF_KUBE_{name.upper()}_VOLUME", f"airflow-tf-{name}"),
                (f"AIRFLOW_TF_KUBE_{name.upper()}_MOUNT", mount))}}


def node_certificates(pki: Path, name: str, address: str) -> None:
    """The node's client certificate (its identity for the Node authorizer) and its kubelet's serving one."""
    for kind, subject, usage, names in (
        ("client", f"/O=system:nodes/CN=system:node:{name}", "clientAuth", None),
        ("serving", f"/CN=system:node:{name}", "serverAuth", f"IP:{address},DNS:{name}"),
    ):
        sign(pki, f"{name}-{kind}", subject, usage, names)


CONTAINERD_CONFIG = """\
version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt"]

[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"

[plugins.'io.containerd.cri.v1.runtime']
  # root here lacks CAP_SYS_RESOURCE: a sandbox may not lower its OOM score below containerd's.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{state}/runc"
        SystemdCgroup = false

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{pause}"

[plugins.'io.containerd.grpc.v1.cri']
  # In the node's network namespace, on its address there, which the kubelet (host side) reaches.
  stream_server_address = "{stream_address}"
  stream_server_port = "0"
"""


def start_nodes(directory: Path, bin_dir: Path, server: str, pki: Path, admin: str, count: int,
                storage: Path | None = None) -> tuple[RealNodes, str]:
    """Start ``count`` real nodes: per node a containerd and a kubelet with an identity of its own,
    CNI bridge networking, the training image loaded; CoreDNS as the cluster DNS on a host address
    the pods reach; the storage folder as PersistentVolumes. What they change on the host is
    written to plane.json first, for `down`."""
    node_packages()
    runtime = build_runtime()
    archives = [pause_archive(runtime), image_archive("training")]
    tag = secrets.token_hex(3)
    octet = host_subnet()
    dns_address = f"10.199.{octet}.254"
    names = [f"node-{i}" for i in range(1, count + 1)]
    info: RealNodes = {
        "tag": tag, "bridge": f"aftf{tag}", "dns": dns_address,
        # A cgroup root per node: a kubelet kills what runs in pod cgroups it does not know of.
        # address: the kubelet's (host side, the Node's InternalIP); netns_address: the node's end of
        # its veth in its network namespace, where its containerd, CNI bridge and pods live.
        "nodes": {name: {"address": f"10.199.{octet}.{i}", "netns_address": f"10.199.{octet}.{100 + i}",
                         "pod_subnet": f"10.{200 + i}.{octet}.0/24", "cgroup_root": f"aftf-{tag}-{name}",
                         "netns": f"aftf{tag}-{name}", "veth": f"aftf{tag}v{i}",
                         "cni_bridge": f"aftf{tag}c{i}", "dir": str(directory / "nodes" / name)}
                  for i, name in enumerate(names, 1)},
        # Bridged traffic between the nodes passes the host's iptables (br_netfilter, bridge-nf-call-iptables):
        # accepted by a rule of this plane's own, in case the host's FORWARD policy drops (Docker's does).
        "forward_rule": ["FORWARD", "-i", f"aftf{tag}", "-o", f"aftf{tag}", "-m", "comment", "--comment",
                         f"aftf{tag} nodes", "-j", "ACCEPT"],
        "made": [path for path in HOST_DIRS if not Path(path).exists()],
    }
    plane = json.loads((directory / "plane.json").read_text())
    (directory / "plane.json").write_text(json.dumps({**plane, "real_nodes": info}, indent=2) + "\n")
    shared_host_state(directory, joining=True)
    for path in HOST_DIRS[:2]:
        Path(path).mkdir(parents=True, exist_ok=True)
    for node in info["nodes"].values():
        make_cgroup_root(node["cgroup_root"])
    make_network(info)
    # The cluster DNS reads Services and EndpointSlices with an identity of its own (up's tokens.csv).
    api_send(server, pki / "ca.crt", admin, "/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "metadata": {"name": "airflow-tf:coredns"}, "rules": [
            {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]})
    api_send(server, pki / "ca.crt", admin, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": "airflow-tf:coredns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "airflow-tf:coredns"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": COREDNS_USER}]})
    start_dns(directory, bin_dir, dns_address, 53, directory / "run" / "coredns.kubeconfig")
    for name, node in info["nodes"].items():
        prepare_real_node(directory, bin_dir, runtime, server, pki, name, node, info)
    # The images imported once, into the first node; the others start from copies of its containerd root.
    first, *others = info["nodes"].values()
    import_images(directory, runtime, names[0], first, archives)
    started = time.monotonic()
    for node in others:
        copy_images(first, node)
    if others:
        log(f"copied the images of {names[0]} to {', '.join(names[1:])} in {time.monotonic() - started:.1f} s")
    for name, node in info["nodes"].items():
        start_node(directory, name, node)

    def ready() -> bool:
        return all(any(c["type"] == "Ready" and c["status"] == "True" for c in (
            (api_get(server, pki / "ca.crt", admin, f"/api/v1/nodes/{name}") or {}).get("status") or {}).get(
                "conditions") or []) for name in names)

    volumes = start_storage(directory, server, pki, admin, storage)
    wait_for(f"nodes {', '.join(names)} Ready", ready, directory)
    settings = {"KUBECONFIG": str(directory / "kubeconfig"), "AIRFLOW_TF_KUBE_NODES": ",".join(names),
                "AIRFLOW_TF_KUBE_IMAGE": training_image(), "AIRFLOW_TF_KUBE_POD_GROUP": str(POD_GROUP), **volumes}
    write_plane_env(directory / "env", settings)
    return info, volumes["AIRFLOW_TF_KUBE_STORAGE"]


def import_images(directory: Path, runtime: Path, name: str, node: Node, archives: list[Path]) -> None:
    """Load the images into the node's containerd, started for it and stopped again."""
    start_containerd(directory, name, node)
    socket_path = Path(node["dir"]) / "state" / "containerd.sock"
    ctr = [str(runtime / "ctr"), "--address", str(socket_path), "-n", "k8s.io"]
    for archive in archives:
        started = time.monotonic()
        subprocess.run([*ctr, "images", "import", str(archive)], check=True, stdout=subprocess.DEVNULL)
        log(f"{name}: imported {archive.name} in {time.monotonic() - started:.0f} s")
    pid_file = directory / "run" / f"containerd-{name}.pid"
    stop(f"containerd-{name}", int(pid_file.read_text()))
    pid_file.unlink()


# The containerd root's bolt databases, written in place: each node gets a copy of its own.
BOLT_DATABASES = ("io.containerd.metadata.v1.bolt/meta.db", "io.containerd.snapshotter.v1.overlayfs/metadata.db")


def copy_images(source: Node, target: Node) -> None:
    """Give ``target`` node the images of ``source`` (whose containerd is stopped) without importing
    them again: the content blobs and the layers' snapshots, which containerd never changes once
    committed (a container's writes go to an upper layer of its own), hard-linked; the bolt
    databases copied."""
    source_root, target_root = Path(source["dir"]) / "containerd", Path(target["dir"]) / "containerd"
    target_root.rmdir()
    subprocess.run(["cp", "-a", "--link", str(source_root), str(target_root)], check=True)
    for database in BOLT_DATABASES:
        copy = target_root / database
        copy.unlink()
        shutil.copy2(source_root / database, copy)


def start_containerd(directory: Path, name: str, node: Node) -> None:
    commands = json.loads((Path(node["dir"]) / "commands.json").read_text())
    socket_path = Path(node["dir"]) / "state" / "containerd.sock"
    socket_path.unlink(missing_ok=True)  # a killed containerd's
    start(directory, f"containerd-{name}", commands["containerd"], commands["containerd_env"])
    wait_for(f"containerd of {name}", socket_path.exists, directory)


def start_node(directory: Path, name: str, node: Node) -> None:
    """Start the node's containerd and kubelet as commands.json (written by `up`) says."""
    start_containerd(directory, name, node)
    start(directory, f"kubelet-{name}", json.loads((Path(node["dir"]) / "commands.json").read_text())["kubelet"])


def prepare_real_node(directory: Path, bin_dir: Path, runtime: Path, server: str, pki: Path, name: str, node: Node,
                      info: RealNodes) -> None:
    """The node's configuration, identity and directories, and commands.json: how to start it."""
    node_dir = Path(node["dir"])
    for sub in ("containerd", "state", "cni", "ipam", "kubelet", "pods-logs"):
        (node_dir / sub).mkdir(parents=True)
    socket_path = node_dir / "state" / "containerd.sock"
    (node_dir / "containerd.toml").write_text(CONTAINERD_CONFIG.format(
        root=node_dir / "containerd", state=node_dir / "state", socket=socket_path, cni_bin=CNI_BIN,
        cni_conf=node_dir / "cni", runc=RUNC, pause=PAUSE_IMAGE, stream_address=node["netns_address"]))
    (node_dir / "cni" / "10-airflow-tf.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": f"aftf{info['tag']}-{name}", "plugins": [{
            "type": "bridge", "bridge": node["cni_bridge"], "isGateway": True, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "dataDir": str(node_dir / "ipam"), "ranges": [[{"subnet": node["pod_subnet"]}]],
                     "routes": [{"dst": "0.0.0.0/0"}]}}]}, indent=2) + "\n")
    # What `node start` runs again (the same configuration and state).
    commands = {"containerd": [*in_netns(node["netns"]), str(runtime / "containerd"),
                               "--config", str(node_dir / "containerd.toml")],
                "containerd_env": {"PATH": f"{runtime}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
                "kubelet": [str(bin_dir / "kubelet"), f"--config={node_dir / 'kubelet.json'}",
                            f"--kubeconfig={node_dir / 'kubeconfig'}", f"--root-dir={node_dir / 'kubelet'}",
                            f"--node-ip={node['address']}", f"--hostname-override={name}", "--v=1"]}
    (node_dir / "commands.json").write_text(json.dumps(commands, indent=2) + "\n")
    node_certificates(pki, name, node["address"])
    client = node_dir / "kubeconfig"
    client.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "node",
        "clusters": [{"name": "plane", "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")}}],
        "users": [{"name": name, "user": {"client-certificate": str(pki / f"{name}-client.crt"),
                                          "client-key": str(pki / f"{name}-client.key")}}],
        "contexts": [{"name": "node", "context": {"cluster": "plane", "user": name}}]}, indent=2) + "\n")
    client.chmod(0o600)
    percent = {"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%", "imagefs.available": "1%"}
    (node_dir / "kubelet.json").write_text(json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": node["address"], "port": free_port(), "readOnlyPort": 0, "healthzPort": 0,
        "tlsCertFile": str(pki / f"{name}-serving.crt"), "tlsPrivateKeyFile": str(pki / f"{name}-serving.key"),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(pki / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{socket_path}",
        # cgroup v1 here, with no systemd: a cgroup root of the node's own, made by `up`.
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{node['cgroup_root']}",
        "makeIPTablesUtilChains": False, "failSwapOn": False,
        "clusterDNS": [info["dns"]], "clusterDomain": "cluster.local", "resolvConf": "",
        "podLogsDir": str(node_dir / "pods-logs"), "evictionHard": percent,
        # The training image is loaded, never pulled: it is not to be collected.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "rotateCertificates": False, "serializeImagePulls": False, "registerNode": True,
        # The lease renewed every 5 s, well within the plane's --node-monitor-grace-period (20 s).
        "nodeLeaseDurationSeconds": 20,
    }, indent=2) + "\n")


def node_of(directory: Path, name: str) -> tuple[Path, RealNodes, Node]:
    """The plane directory (resolved), its real nodes' record and the node ``name``'s, or a clear error."""
    directory = directory.resolve()
    try:
        plane = json.loads((directory / "plane.json").read_text())
    except (OSError, ValueError):
        raise SystemExit(f"kube: {directory} holds no running plane (no readable plane.json); "
                         "start one with `up DIR --nodes N`") from None
    real = plane.get("real_nodes")
    if not real:
        raise SystemExit(f"kube: the plane in {directory} has no real nodes (it was started without --nodes)")
    if name not in real["nodes"]:
        raise SystemExit(f"kube: the plane in {directory} has no node {name!r}; its nodes: {', '.join(real['nodes'])}")
    return directory, real, real["nodes"][name]


def node_running(directory: Path, name: str) -> bool:
    return not (directory / "run" / f"{name}.stopped").exists()


def node_stop(directory: Path, name: str) -> None:
    """Take the node away as a lost machine goes: its kubelet, containerd, shims and every process of
    its containers (its cgroup root) killed at once, nothing deleted through the API; the Node is left
    for the control plane to judge (NotReady after --node-monitor-grace-period)."""
    directory, _, node = node_of(directory, name)
    if not node_running(directory, name):
        raise SystemExit(f"kube: node {name} of the plane in {directory} is already stopped; `node start` it")
    socket_path = f"{node['dir']}/state/"
    for component in (f"kubelet-{name}", f"containerd-{name}"):
        pid_file = directory / "run" / f"{component}.pid"
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            if ours(pid, directory):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        # Gone, not failed: `wait_for` of later commands must not take it for a component that exited.
        pid_file.unlink(missing_ok=True)
    for proc in Path("/proc").iterdir():  # the runc shims name the node's socket
        if proc.name.isdigit() and comm(proc).startswith("containerd") and ours(int(proc.name), Path(socket_path)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
    kill_cgroup_root(node["cgroup_root"])
    (directory / "run" / f"{name}.stopped").write_text(f"{time.time()}\n")
    log(f"{name}: stopped (kubelet, containerd, shims and containers killed)")


def node_start(directory: Path, name: str) -> None:
    """Start the stopped node's containerd and kubelet again, as `up` ran them (same configuration,
    state and images), and wait for the Node to be Ready."""
    directory, _, node = node_of(directory, name)
    if node_running(directory, name):
        raise SystemExit(f"kube: node {name} of the plane in {directory} is running; `node stop` it first")
    make_cgroup_root(node["cgroup_root"])
    start_node(directory, name, node)
    (directory / "run" / f"{name}.stopped").unlink()
    plane = json.loads((directory / "plane.json").read_text())
    ca, admin = directory / "pki" / "ca.crt", json.loads((directory / "kubeconfig").read_text())["users"][0]["user"]["token"]

    def ready() -> bool:
        node_object = api_get(plane["server"], ca, admin, f"/api/v1/nodes/{name}") or {}
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in (node_object.get("status") or {}).get("conditions") or [])

    started = time.monotonic()
    wait_for(f"node {name} Ready", ready, directory)
    log(f"{name}: started, Ready after {time.monotonic() - started:.1f} s")


def cut_rules(node: Node) -> list[list[str]]:
    """The iptables rules, in the node's network namespace, that drop what is forwarded to or from its pods
    from or to anywhere else (other nodes, the host); its pods still reach each other."""
    subnet = node["pod_subnet"]
    return [["FORWARD", "-s", subnet, "!", "-d", subnet, "-m", "comment", "--comment", "airflow-tf cut", "-j", "DROP"],
            ["FORWARD", "-d", subnet, "!", "-s", subnet, "-m", "comment", "--comment", "airflow-tf cut", "-j", "DROP"]]


def node_cut(directory: Path, name: str, join: bool = False) -> None:
    """Cut the node's pod network from the other nodes and the host (its kubelet, on the host side,
    keeps reporting Ready), or with ``join`` remove exactly those rules again."""
    directory, _, node = node_of(directory, name)
    iptables = [*in_netns(node["netns"]), "iptables", "-w"]
    present = [subprocess.run([*iptables, "-C", *rule], capture_output=True).returncode == 0 for rule in cut_rules(node)]
    if join:
        if not any(present):
            raise SystemExit(f"kube: the pod network of node {name} of the plane in {directory} is not cut")
        for rule, there in zip(cut_rules(node), present):
            if there:
                subprocess.run([*iptables, "-D", *rule], check=True)
        log(f"{name}: pod network joined again")
        return
    if any(present):
        raise SystemExit(f"kube: the pod network of node {name} of the plane in {directory} is already cut; "
                         "`node join` it")
    for rule in cut_rules(node):
        subprocess.run([*iptables, "-I", *rule], check=True)
    log(f"{name}: pod network cut ({node['pod_subnet']} from the other nodes and the host)")
