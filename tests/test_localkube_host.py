"""What `scripts/kube down` clears of the host that containerd's shims leave behind: a shim killed
with its node (`node stop`, a plane killed without `down`) leaves its socket in /run/containerd/s,
whatever containerd's own state directory was."""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from localkube import host  # noqa: E402  (the tooling is not an installed package)


def test_down_removes_the_sockets_of_killed_shims_and_keeps_those_still_listening(tmp_path, monkeypatch):
    monkeypatch.setattr(host, "SHIM_SOCKETS", tmp_path)
    dead, live = tmp_path / "dead", tmp_path / "live"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as killed:
        killed.bind(str(dead))  # bound, never listening: what a killed shim leaves
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(live))
    listening.listen()
    (tmp_path / "not-a-socket").write_text("")
    try:
        host.remove_dead_shim_sockets()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["live", "not-a-socket"]
    finally:
        listening.close()


def test_the_last_plane_down_removes_the_host_paths_missing_before_the_first_and_restores_its_sysctls(
        tmp_path, monkeypatch):
    made_by_planes, there_before = tmp_path / "run-containerd", tmp_path / "var-lib-kubelet"
    there_before.mkdir()
    sysctl = tmp_path / "overcommit"
    sysctl.write_text("0\n")
    monkeypatch.setattr(host, "HOST_RECORD", tmp_path / "record" / "host.json")
    monkeypatch.setattr(host, "EARLIER_RECORD", tmp_path / "record" / "sysctls.json")
    monkeypatch.setattr(host, "HOST_DIRS", (str(made_by_planes), str(there_before)))
    monkeypatch.setattr(host, "NODE_SYSCTLS", ("overcommit",))
    monkeypatch.setattr(host, "sysctl_path", lambda name: tmp_path / name)
    # The kubelets and containerds of the planes are not running here (this test starts none).
    monkeypatch.setattr(host, "other_node_processes", lambda directory: False)
    first, second = tmp_path / "first", tmp_path / "second"
    for plane in (first, second):
        plane.mkdir()
        (plane / "plane.json").write_text("{}")

    host.shared_host_state(first, joining=True)
    made_by_planes.joinpath("s").mkdir(parents=True)  # containerd makes it, its shims fill it
    sysctl.write_text("1\n")  # the kubelet's
    host.shared_host_state(second, joining=True)
    host.shared_host_state(first, joining=False)
    assert made_by_planes.exists() and sysctl.read_text() == "1\n", "the second plane still runs"
    host.shared_host_state(second, joining=False)
    assert not made_by_planes.exists()
    assert there_before.exists(), "a path the host had before stays"
    assert sysctl.read_text() == "0\n"


def test_a_plane_recorded_under_the_earlier_name_still_puts_the_host_back(tmp_path, monkeypatch):
    """A plane started before the record was renamed (sysctls.json) and taken down after."""
    sysctl = tmp_path / "overcommit"
    sysctl.write_text("1\n")
    (tmp_path / "record").mkdir()
    monkeypatch.setattr(host, "HOST_RECORD", tmp_path / "record" / "host.json")
    monkeypatch.setattr(host, "EARLIER_RECORD", tmp_path / "record" / "sysctls.json")
    monkeypatch.setattr(host, "sysctl_path", lambda name: tmp_path / name)
    monkeypatch.setattr(host, "other_node_processes", lambda directory: False)
    plane = tmp_path / "plane"
    host.EARLIER_RECORD.write_text(json.dumps({"values": {"overcommit": "0"}, "planes": [str(plane)], "missing": []}))
    host.shared_host_state(plane, joining=False)
    assert sysctl.read_text() == "0\n"
    assert not host.EARLIER_RECORD.exists() and not host.HOST_RECORD.exists()


def test_down_removes_the_cni_results_of_its_own_planes_pods_only(tmp_path, monkeypatch):
    """A pod killed with its node is never torn down through CNI: its cached result stays until `down`."""
    results = tmp_path / "results"
    results.mkdir()
    ours = [results / "aftf7-node-1-0123abcd-eth0", results / "aftf7-node-3-4567ef01-eth0"]
    others = [results / "aftf71-node-1-89abcdef-eth0", results / "cbr0-0123abcd-eth0"]
    for entry in ours + others:
        entry.write_text("{}")
    monkeypatch.setattr(host, "CNI_RESULTS", results)
    host.remove_cni_results("7")
    assert sorted(results.iterdir()) == sorted(others)


def test_planes_starting_side_by_side_install_the_node_packages_once_without_failing_on_dpkgs_lock(
        tmp_path, monkeypatch):
    # A stand-in apt-get (the real one would change the machine): like dpkg, it fails at once while
    # another install holds its lock, and it installs by making the files the check looks for.
    cni, runc, calls = tmp_path / "cni", tmp_path / "runc", tmp_path / "calls"
    fake = tmp_path / "bin" / "apt-get"
    fake.parent.mkdir()
    fake.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
mkdir {tmp_path}/dpkg-lock 2>/dev/null || {{ echo "E: Could not get lock" >&2; exit 100; }}
sleep 1; mkdir -p {cni}; touch {cni}/bridge {runc}
rmdir {tmp_path}/dpkg-lock
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(host, "CNI_BIN", cni)
    monkeypatch.setattr(host, "RUNC", runc)
    monkeypatch.setattr(host, "HOST_RECORD", tmp_path / "record" / "host.json")
    with concurrent.futures.ThreadPoolExecutor(2) as planes:
        for started in [planes.submit(host.node_packages) for _ in range(2)]:
            started.result()  # raises CalledProcessError if an install failed on the lock
    assert (cni / "bridge").exists() and runc.exists()
    assert calls.read_text().splitlines() == ["-o DPkg::Lock::Timeout=600 install -y runc containernetworking-plugins"]
