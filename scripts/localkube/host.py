"""What real nodes change on the host, and its undoing: the kubelets' sysctls (recorded, put back by
the last plane down), the plane's bridge, the nodes' network namespaces, veths, routes and iptables
rule, their cgroup roots, mounts and the host paths the kubelet and containerd use."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import NotRequired, TypedDict

from .process import comm, log, ours, zombie


class Node(TypedDict):
    """One real node as plane.json records it (``up`` writes it, every later command reads it)."""

    address: str
    netns_address: str
    pod_subnet: str
    cgroup_root: str
    netns: str
    veth: str
    cni_bridge: str
    dir: str


class RealNodes(TypedDict):
    """plane.json's ``real_nodes``: what the nodes made on the host, for ``down``."""

    tag: str
    bridge: str
    dns: str
    nodes: dict[str, Node]
    forward_rule: NotRequired[list[str]]  # absent in planes started before the rule
    made: list[str]
    sysctls: NotRequired[dict[str, str]]  # planes started before the shared record kept their own


# What the kubelet changes on the host at start, put back by `down`. The host's ip_forward is not
# changed: each node forwards in its own network namespace.
NODE_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
# Paths the kubelet and containerd use whatever they are told: made by `up` if missing, their
# entries of this plane removed by `down`, and the directories too if `up` made them and they are empty.
HOST_DIRS = ("/var/log/containers", "/var/lib/kubelet/device-plugins", "/var/lib/kubelet", "/run/containerd",
             "/var/lib/cni", "/opt/containerd")
CNI_BIN = Path("/usr/lib/cni")
RUNC = Path("/usr/sbin/runc")


def node_packages() -> None:
    """Debian's runc and CNI plugins, installed when missing. Planes starting side by side take
    turns (one apt-get at a time: a second fails on dpkg's lock rather than waiting)."""
    def missing() -> list[str]:
        return [package for package, path in (("runc", RUNC), ("containernetworking-plugins", CNI_BIN / "bridge"))
                if not path.exists()]

    if not missing():
        return
    HOST_RECORD.parent.mkdir(parents=True, exist_ok=True)
    with open(HOST_RECORD.with_name("apt.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if packages := missing():
            log(f"installing {' '.join(packages)} (apt-get)")
            # Another apt-get of this machine's (not a plane's) is waited for, up to 10 minutes.
            subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", *packages], check=True,
                           stdout=subprocess.DEVNULL)


def sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name


# The host as it was before the first plane with real nodes (its sysctls, the paths missing), and
# the planes with real nodes running now: the last one down puts it back (planes may run side by side).
HOST_RECORD = Path("/run/airflow-tf-kube/host.json")
EARLIER_RECORD = HOST_RECORD.with_name("sysctls.json")
"""HOST_RECORD as a plane started by an earlier version of this script named it: taken over, so
that its down still puts the host back."""


def shared_host_state(directory: Path, joining: bool) -> None:
    """Count the plane in ``directory`` in (``joining``) or out of the shared record of the host;
    the first one in records its sysctls and which of HOST_DIRS are missing, the last one out
    restores the sysctls and removes those paths whole (what containerd's shims left there too).
    Planes whose directory has lost its plane.json (killed without `down`) no longer count."""
    HOST_RECORD.parent.mkdir(parents=True, exist_ok=True)
    with open(HOST_RECORD.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if EARLIER_RECORD.exists() and not HOST_RECORD.exists():
            EARLIER_RECORD.replace(HOST_RECORD)
        try:
            record = json.loads(HOST_RECORD.read_text())
        except (OSError, ValueError):
            record = {"values": {}, "planes": []}
        planes = [plane for plane in record["planes"] if plane != str(directory) and Path(plane, "plane.json").exists()]
        if joining:
            if not planes:
                record["values"] = {name: sysctl_path(name).read_text().strip() for name in NODE_SYSCTLS}
                record["missing"] = [path for path in HOST_DIRS if not Path(path).exists()]
            _write_record({**record, "planes": [*planes, str(directory)]})
            return
        if planes:
            _write_record({**record, "planes": planes})
            return
        for name, value in record["values"].items():
            with contextlib.suppress(OSError):
                if sysctl_path(name).read_text().strip() != value:
                    sysctl_path(name).write_text(value + "\n")
        if not other_node_processes(directory):
            for path in record.get("missing", []):
                shutil.rmtree(path, ignore_errors=True)
        HOST_RECORD.unlink(missing_ok=True)


def _write_record(record: dict) -> None:
    """Replace HOST_RECORD whole (a plane killed mid-write leaves the old record, never half of one)."""
    partial = HOST_RECORD.with_suffix(".json.tmp")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(HOST_RECORD)


def host_subnet() -> int:
    """A third octet R free on this host: node addresses 10.199.R.i, pod subnets 10.(200+i).R.0/24."""
    taken = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    for _ in range(100):
        octet = secrets.randbelow(254) + 1
        if not re.search(rf"\b10\.(199|2\d\d)\.{octet}\.", taken):
            return octet
    raise SystemExit("kube: no free 10.199.R.0/24 for the nodes' addresses on this host")


def cgroup_hierarchies(unified: bool = False) -> list[Path]:
    """The cgroup v1 hierarchies the kubelet uses, and with ``unified`` cgroup v2's beside them,
    where runc makes the containers' cgroups too."""
    return sorted(p for p in Path("/sys/fs/cgroup").iterdir() if p.is_dir() and not p.is_symlink()
                  and (unified or p.name != "unified"))


def make_cgroup_root(name: str) -> None:
    for hierarchy in cgroup_hierarchies():
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":  # a new cpuset has no CPUs nor memory nodes until given its parent's
            for key in ("cpuset.cpus", "cpuset.mems"):
                (path / key).write_text((hierarchy / key).read_text())


def kill_cgroup_root(name: str) -> None:
    """SIGKILL every process in the cgroup root ``name`` (a pod's processes outlive the kubelet)."""
    for _ in range(50):
        pids = {int(pid) for hierarchy in cgroup_hierarchies(unified=True) if (hierarchy / name).is_dir()
                for tasks in (hierarchy / name).rglob("cgroup.procs") for pid in tasks.read_text().split()}
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_cgroup_root(name: str) -> None:
    """Kill what runs in the cgroup root ``name``, then remove it."""
    kill_cgroup_root(name)
    for hierarchy in cgroup_hierarchies(unified=True):
        root = hierarchy / name
        if root.is_dir():
            for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    path.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()


def make_network(info: RealNodes) -> None:
    """The plane's host bridge, carrying the kubelets' addresses (the kubelet refuses a loopback one)
    and the cluster DNS's, and per node a network namespace joined to it by a veth pair. A node
    forwards between its pods and the bridge in its own namespace (the host's ip_forward is left as
    it is), and routes to the other nodes' pod subnets through their namespaces; the host routes to
    every pod subnet likewise. No route leads off the machine: a namespace's default route ends at
    the host, which does not forward, and nothing is masqueraded."""
    bridge, nodes = info["bridge"], info["nodes"]
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
    # The DNS address holds the bridge's /24 (its link route); the kubelets' are /32 beside it.
    subprocess.run(["ip", "addr", "add", f"{info['dns']}/24", "dev", bridge], check=True)
    for node in nodes.values():
        subprocess.run(["ip", "addr", "add", f"{node['address']}/32", "dev", bridge], check=True)
    subprocess.run(["ip", "link", "set", bridge, "up"], check=True)
    subprocess.run(["iptables", "-w", "-I", *info["forward_rule"]], check=True)
    for node in nodes.values():
        netns, veth = node["netns"], node["veth"]
        subprocess.run(["ip", "netns", "add", netns], check=True)
        subprocess.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns], check=True)
        subprocess.run(["ip", "link", "set", veth, "master", bridge, "up"], check=True)
        inside = ["ip", "-n", netns]
        subprocess.run([*inside, "link", "set", "lo", "up"], check=True)
        subprocess.run([*inside, "addr", "add", f"{node['netns_address']}/24", "dev", "eth0"], check=True)
        subprocess.run([*inside, "link", "set", "eth0", "up"], check=True)
        subprocess.run([*inside, "route", "add", "default", "via", info["dns"]], check=True)
        for other in nodes.values():
            if other is not node:
                subprocess.run([*inside, "route", "add", other["pod_subnet"], "via", other["netns_address"]], check=True)
        # /proc/sys/net is the opening process's namespace's.
        subprocess.run([*in_netns(netns), "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"], check=True)
        subprocess.run(["ip", "route", "add", node["pod_subnet"], "via", node["netns_address"], "dev", bridge],
                       check=True)


def in_netns(netns: str) -> list[str]:
    """A command's prefix that runs it in the network namespace ``netns`` only (``ip netns exec``
    would also give it a mount namespace of its own, hiding the mounts containerd makes for pods)."""
    return ["nsenter", f"--net=/run/netns/{netns}", "--"]


def remove_real_nodes(directory: Path, info: RealNodes) -> None:
    """Everything real nodes changed on the host that their stopped processes left: pods'
    processes, mounts below DIR, the cgroup root, links, host paths' entries, sysctls."""
    for proc in Path("/proc").iterdir():  # the runc shims, in sessions of their own, name the node's socket
        if proc.name.isdigit() and comm(proc).startswith("containerd") and ours(int(proc.name), directory):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
    for node in info["nodes"].values():
        remove_cgroup_root(node["cgroup_root"])
    unmount_below(directory)
    # A namespace's links (veth, CNI bridge, pods' veths) and the routes through them go with it.
    for node in info["nodes"].values():
        subprocess.run(["ip", "netns", "del", node["netns"]], check=False, stderr=subprocess.DEVNULL)
    for link in [info["bridge"], *(node["veth"] for node in info["nodes"].values())]:
        subprocess.run(["ip", "link", "del", link], check=False, stderr=subprocess.DEVNULL)
    if "forward_rule" in info:
        subprocess.run(["iptables", "-w", "-D", *info["forward_rule"]], check=False, stderr=subprocess.DEVNULL)
    shared_host_state(directory, joining=False)
    for name, value in info.get("sysctls", {}).items():  # a plane started before the shared record
        with contextlib.suppress(OSError):
            if sysctl_path(name).read_text().strip() != value:
                sysctl_path(name).write_text(value + "\n")
    remove_host_entries(directory, info["made"], info["tag"])


def unmount_below(directory: Path) -> None:
    """Every mount point at or below ``directory``: the deepest first, again until none is left
    (mounts below mounts)."""
    for _ in range(3):
        points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        mine = sorted({p for p in points if p == str(directory) or p.startswith(f"{directory}/")},
                      key=lambda p: -len(p))
        for point in mine:
            subprocess.run(["umount", "-l", point], check=False, stderr=subprocess.DEVNULL)


def other_node_processes(directory: Path) -> bool:
    """Whether a kubelet or containerd of another plane runs (this plane's own may still be listed:
    killed a moment ago, not yet reaped on a busy machine)."""
    return any(comm(p) in ("kubelet", "containerd") and not ours(int(p.name), directory) and not zombie(p)
               for p in Path("/proc").iterdir() if p.name.isdigit())


CNI_RESULTS = Path("/var/lib/cni/results")
"""Where the CNI library caches each pod's result, under its network's name (a node's network is
``aftf<tag>-<node>``): a pod killed with its node (`node stop`) is never torn down through CNI."""


def remove_cni_results(tag: str) -> None:
    """The cached CNI results of the plane ``tag``'s networks; other planes' stay."""
    if CNI_RESULTS.is_dir():
        for entry in CNI_RESULTS.glob(f"aftf{tag}-*"):
            entry.unlink(missing_ok=True)


SHIM_SOCKETS = Path("/run/containerd/s")
"""Where containerd's shims put their sockets whatever containerd's own state directory is."""


def remove_dead_shim_sockets() -> None:
    """The shims' sockets no process listens on any more (their shims were killed with a node).
    Asked by connecting: /proc/net/unix lists only this network namespace's, and a node's shims
    listen in the node's."""
    if not SHIM_SOCKETS.is_dir():
        return
    for path in SHIM_SOCKETS.iterdir():
        if not path.is_socket():
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
            except ConnectionRefusedError:
                path.unlink(missing_ok=True)
            except OSError:
                pass  # not ours to judge


def remove_host_entries(directory: Path, made: list[str], tag: str) -> None:
    """The container log links into ``directory``, the CNI results of the plane ``tag``'s pods, and
    the host paths ``up`` made: removed whole when no other kubelet or containerd (another plane's)
    may use them, else only if empty."""
    logs = Path("/var/log/containers")
    if logs.is_dir():
        for entry in logs.iterdir():
            if entry.is_symlink() and os.readlink(entry).startswith(f"{directory}/"):
                entry.unlink()
    others = other_node_processes(directory)
    remove_dead_shim_sockets()
    remove_cni_results(tag)
    for path in made:
        if others:
            with contextlib.suppress(OSError):
                Path(path).rmdir()
        else:
            shutil.rmtree(path, ignore_errors=True)
