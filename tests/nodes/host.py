"""A plane with real nodes (``scripts/kube up DIR --nodes N``) for the tests of this package, what
its nodes leave on this machine (processes, mounts, cgroups, links), and the node's own view of a
pod's container (its runtime, containerd, through ``ctr``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from airflow_tf.plane_env import read_plane_env

from k8s.plane import KUBE_SCRIPT


def processes(marker: str) -> list[str]:
    """This machine's processes whose command line holds ``marker`` (not this one)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def real_nodes(directory: Path) -> dict:
    """What ``up`` wrote of its real nodes (tag, addresses, cgroup roots, bridges) to plane.json."""
    return json.loads((directory / "plane.json").read_text())["real_nodes"]


def leftovers(directory: Path, nodes: dict) -> dict:
    """What the plane in ``directory`` with the real nodes ``nodes`` (:func:`real_nodes`, read while
    it ran) left on this machine: processes, mounts, cgroups, links, network namespaces, iptables
    rules, its directory. Other planes may run beside it: only this one's own are counted."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    # The nodes' CNI bridges live in their network namespaces, which go with them.
    ours = {nodes["bridge"], *(node.get("veth", node["cni_bridge"]) for node in nodes["nodes"].values())}
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
    iptables = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return {
        "processes": processes(str(directory)),
        "mounts": [point for point in points if point.startswith(str(directory))],
        "cgroups": sorted(str(p) for node in nodes["nodes"].values()
                          for p in Path("/sys/fs/cgroup").glob(f"*/{node['cgroup_root']}")),
        "links": sorted(name for line in links.splitlines()
                        if (name := line.split(":")[1].strip().split("@")[0]) in ours),
        "network namespaces": sorted(name for name in namespaces if name.startswith(f"aftf{nodes['tag']}-")),
        "iptables": [rule for rule in iptables.splitlines() if f"aftf{nodes['tag']}" in rule],
        "files": directory.exists(),
    }


NOTHING = {"processes": [], "mounts": [], "cgroups": [], "links": [], "network namespaces": [], "iptables": [],
           "files": False}


def plane_env(directory: Path) -> dict[str, str]:
    """What ``scripts/kube up DIR --nodes N`` wrote to ``DIR/env``."""
    return read_plane_env(directory / "env")


def up_with_nodes(directory: Path, storage: Path, kueue: bool = False, nodes: int = 1) -> None:
    """A plane with ``nodes`` real nodes offering ``storage`` to their pods (and Kueue and JobSet),
    owned by this test process (its reaper downs it if the test dies)."""
    subprocess.run([sys.executable, str(KUBE_SCRIPT), "up", str(directory), "--nodes", str(nodes), "--storage",
                    str(storage), "--owner-pid", str(os.getpid()), *(["--kueue"] if kueue else [])],
                   check=True, stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def shared_storage() -> Iterator[Path]:
    """A storage folder that the pods' non-root user can reach at its own path (pytest's
    temporary folders are private to root), removed afterwards."""
    storage = Path(tempfile.mkdtemp(prefix="airflow-tf-nodes-storage-"))
    storage.chmod(0o755)
    try:
        yield storage
    finally:
        shutil.rmtree(storage, ignore_errors=True)


def down(directory: Path) -> None:
    subprocess.run([sys.executable, str(KUBE_SCRIPT), "down", str(directory)], check=True)


def container_pid(directory: Path, node: str, container_id: str) -> int:
    """The host pid of a container's first process, as the node's containerd knows it
    (``ctr tasks ls``): the pod status's ``containerd://ID``."""
    runtime = subprocess.run([sys.executable, str(KUBE_SCRIPT), "build"], check=True, capture_output=True,
                             text=True).stdout.split()[1]
    socket = Path(real_nodes(directory)["nodes"][node]["dir"]) / "state" / "containerd.sock"
    listing = subprocess.run([f"{runtime}/ctr", "--address", str(socket), "-n", "k8s.io", "tasks", "ls"], check=True,
                             capture_output=True, text=True, timeout=60).stdout
    wanted = container_id.removeprefix("containerd://")
    for line in listing.splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == wanted:
            return int(pid)
    raise AssertionError(f"node {node}'s containerd runs no task {wanted}:\n{listing}")
