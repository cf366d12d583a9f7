"""The control plane: its CA and credentials, etcd, the API server, the controller manager and the
scheduler started (``up``, with the real nodes and Kueue when asked), and everything of it stopped
and removed (``down``, also run by the reaper when the plane's owner dies)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from .api import api_get
from .build import JOBSET, KUEUE, build, kubernetes_version
from .host import remove_real_nodes
from .images import training_image
from .kueue import start_kueue
from .nodes import COREDNS_USER, STORAGE_CLASS, STORAGE_ROOT_VOLUME, start_nodes
from .process import ROOT, alive, free_port, log, openssl, ours, sign, start, stop, wait_for

# The test (or user) that owns the plane: when it dies without `down`, the reaper runs it.
REAPER = "reaper"
ENTRY = ROOT / "scripts" / "kube"
"""The command the reaper runs (``scripts/kube _reap``)."""


def make_pki(pki: Path) -> None:
    """A CA of the plane's own, and from it every serving and client certificate it needs."""
    pki.mkdir(mode=0o700)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "30", "-subj", "/CN=airflow-tf-kube-ca", cwd=pki)
    for name, subject, usage, names in (
        ("apiserver", "/CN=kube-apiserver", "serverAuth",
         "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"),
        ("etcd", "/CN=etcd", "serverAuth,clientAuth", "IP:127.0.0.1,DNS:localhost"),
        ("apiserver-etcd-client", "/CN=kube-apiserver-etcd-client", "clientAuth", None),
        ("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", "clientAuth", None),
    ):
        sign(pki, name, subject, usage, names)
    openssl("genrsa", "-out", "service-account.key", "2048", cwd=pki)
    openssl("rsa", "-in", "service-account.key", "-pubout", "-out", "service-account.pub", cwd=pki)


def kubeconfig(path: Path, server: str, ca: Path, user: str, token: str) -> None:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "airflow-tf-kube",
        "clusters": [{"name": "airflow-tf-kube", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "airflow-tf-kube", "context": {"cluster": "airflow-tf-kube", "user": user}}],
    }
    path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML: any kubeconfig reader takes it
    path.chmod(0o600)


AUDIT_POLICY = """\
# Service accounts' requests, when received and when answered: the tests read which calls a
# backend made and what came of them (tests/k8s/plane.py). The control plane's own traffic
# is not recorded.
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["ResponseStarted"]
rules:
  - level: None
    userGroups: ["system:serviceaccounts:kube-system"]
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
"""


def up(directory: Path, owner_pid: int | None, with_kueue: bool = False, storage: Path | None = None,
       nodes: int = 0) -> None:
    directory = directory.resolve()
    bin_dir = build()
    started = time.monotonic()
    for sub in ("logs", "run", "etcd"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    (directory / "etcd").chmod(0o700)
    pki = directory / "pki"
    make_pki(pki)
    etcd_port, etcd_peer_port, api_port = free_port(), free_port(), free_port()
    server = f"https://127.0.0.1:{api_port}"
    tokens = {user: secrets.token_urlsafe(32) for user in ("admin", "controller-manager", "scheduler", "coredns")}
    (pki / "tokens.csv").write_text(
        f'{tokens["admin"]},admin,admin,system:masters\n'
        f'{tokens["controller-manager"]},system:kube-controller-manager,system:kube-controller-manager\n'
        f'{tokens["scheduler"]},system:kube-scheduler,system:kube-scheduler\n'
        # The cluster DNS of real nodes: it reads Services and EndpointSlices (ClusterRole airflow-tf:coredns).
        f'{tokens["coredns"]},{COREDNS_USER},{COREDNS_USER}\n')
    (pki / "tokens.csv").chmod(0o600)
    kubeconfig(directory / "kubeconfig", server, pki / "ca.crt", "admin", tokens["admin"])
    for user in ("controller-manager", "scheduler", "coredns"):
        kubeconfig(directory / "run" / f"{user}.kubeconfig", server, pki / "ca.crt", user, tokens[user])
    (directory / "audit-policy.yaml").write_text(AUDIT_POLICY)
    (directory / "plane.json").write_text(json.dumps({
        "server": server, "etcd": f"https://127.0.0.1:{etcd_port}", "audit_log": str(directory / "audit.log"),
        "ca": str(pki / "ca.crt"), "etcd_client": [str(pki / "etcd.crt"), str(pki / "etcd.key")],
        "version": kubernetes_version()}, indent=2) + "\n")

    if owner_pid is not None:
        start(directory, REAPER, [sys.executable, str(ENTRY), "_reap", str(directory),
                                  str(owner_pid)])
    etcd_url, peer_url = f"https://127.0.0.1:{etcd_port}", f"https://127.0.0.1:{etcd_peer_port}"
    start(directory, "etcd", [
        str(bin_dir / "etcd"), "--name=plane", f"--data-dir={directory / 'etcd'}",
        f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=plane={peer_url}", "--initial-cluster-state=new",
        f"--cert-file={pki / 'etcd.crt'}", f"--key-file={pki / 'etcd.key'}",
        f"--trusted-ca-file={pki / 'ca.crt'}", "--client-cert-auth",
        f"--peer-cert-file={pki / 'etcd.crt'}", f"--peer-key-file={pki / 'etcd.key'}",
        f"--peer-trusted-ca-file={pki / 'ca.crt'}", "--peer-client-cert-auth",
        "--log-level=warn"])
    start(directory, "kube-apiserver", [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers={etcd_url}", f"--etcd-cafile={pki / 'ca.crt'}",
        f"--etcd-certfile={pki / 'apiserver-etcd-client.crt'}", f"--etcd-keyfile={pki / 'apiserver-etcd-client.key'}",
        "--bind-address=127.0.0.1", f"--secure-port={api_port}",
        # On loopback the default endpoint reconciler refuses the advertise address.
        "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={pki / 'tokens.csv'}",
        "--authorization-mode=Node,RBAC",
        # Real nodes may change only their own Node and pods.
        "--enable-admission-plugins=NodeRestriction",
        f"--service-account-key-file={pki / 'service-account.pub'}",
        f"--service-account-signing-key-file={pki / 'service-account.key'}",
        f"--service-account-issuer={server}", "--service-cluster-ip-range=10.96.0.0/24",
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        # Watches read etcd itself, so a compacted resource version expires them at once
        # (with the watch cache, only once the cache's own window moved past it).
        "--watch-cache=false",
        f"--audit-policy-file={directory / 'audit-policy.yaml'}", f"--audit-log-path={directory / 'audit.log'}",
        "--audit-log-format=json", "--audit-log-maxbackup=0",
        "--v=1"])
    admin = tokens["admin"]
    wait_for("kube-apiserver /readyz",
             lambda: (api_get(server, pki / "ca.crt", admin, "/readyz") or {}).get("text") == "ok", directory)
    api_ready = time.monotonic() - started
    # One replica of each, so nothing to elect. With leader election on, a replica whose lease
    # renewal stalls (the API server answering in minutes on a loaded machine) exits, and the plane
    # is left without its controllers or scheduler; the renewals also cost an idle plane CPU.
    no_election = ["--leader-elect=false"]
    start(directory, "kube-controller-manager", [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={directory / 'run' / 'controller-manager.kubeconfig'}",
        "--bind-address=127.0.0.1", "--secure-port=0",
        # nodeipam hands out pod CIDRs to nodes, which needs a cluster CIDR this plane does not have.
        "--controllers=*,-nodeipam", "--use-service-account-credentials", *no_election,
        # A node whose kubelet stopped reporting is NotReady after 20 s (Kubernetes' default: 50 s), so
        # tests of lost nodes (`node stop`) wait less; checked every 5 s (the default), and the kubelets
        # renew their lease every 5 s (nodeLeaseDurationSeconds 20).
        "--node-monitor-grace-period=20s", "--node-monitor-period=5s",
        f"--service-account-private-key-file={pki / 'service-account.key'}", f"--root-ca-file={pki / 'ca.crt'}",
        "--v=1"])
    start(directory, "kube-scheduler", [
        str(bin_dir / "kube-scheduler"), f"--kubeconfig={directory / 'run' / 'scheduler.kubeconfig'}",
        "--bind-address=127.0.0.1", "--secure-port=0", *no_election, "--v=1"])

    # Pods can only be created once the namespace's default service account exists (made by the
    # controller manager: its sign of life; a scheduler not yet watching leaves pods Pending a moment).
    wait_for("the default service account",
             lambda: api_get(server, pki / "ca.crt", admin, "/api/v1/namespaces/default/serviceaccounts/default"),
             directory)
    real, storage_folder = start_nodes(directory, bin_dir, server, pki, admin, nodes, storage) if nodes else (None, "")
    if with_kueue:
        start_kueue(directory)
    log(f"Kubernetes {kubernetes_version()} up in {time.monotonic() - started:.1f} s "
        f"(API server ready after {api_ready:.1f} s) at {server}" + (f", with {nodes} node(s)" if real else "")
        + (", with Kueue and JobSet" if with_kueue else ""))
    if real:
        print(f"""\
# The plane runs until `{sys.argv[0]} down {directory}`; logs in {directory / 'logs'}.
# Nodes {', '.join(real['nodes'])}: kubelet and containerd each, pods on CNI bridges, the training
# image {training_image()} loaded; the cluster DNS answers at {real['dns']}.
# Storage {storage_folder}: PersistentVolumes airflow-tf-data and airflow-tf-runs (storage class
# {STORAGE_CLASS}), for claims the manifests mount at /data and /runs, and {STORAGE_ROOT_VOLUME}, the
# whole folder, for DAGs whose tasks share it with the pods. All of it is in {directory / 'env'}.
export KUBECONFIG={directory / 'kubeconfig'}""")
        return
    print(f"""\
# The plane runs until `{sys.argv[0]} down {directory}`; logs in {directory / 'logs'}.
# It has no node: pods stay Pending. Use it with:
export KUBECONFIG={directory / 'kubeconfig'}""")


def down(directory: Path) -> None:
    directory = directory.resolve()
    if not (directory / "plane.json").exists() and not (directory / "run").exists():
        if directory.exists():
            raise SystemExit(f"kube: {directory} is not a plane's directory (no plane.json); left as it is")
        return
    pids = {}
    for pid_file in sorted((directory / "run").glob("*.pid")):
        pid = int(pid_file.read_text())
        if pid != os.getpid() and ours(pid, directory):
            pids[pid_file.stem] = pid
    # One at a time, clients before servers: the API server stops quickly while etcd still answers.
    order = [KUEUE, JOBSET, "coredns", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd", REAPER]
    for name in sorted(pids, key=lambda n: order.index(n) if n in order else -1):
        stop(name, pids[name])
    with contextlib.suppress(OSError, ValueError):
        real = json.loads((directory / "plane.json").read_text()).get("real_nodes")
        if real:
            remove_real_nodes(directory, real)
    # The nodes' directories (their containerd roots: nearly all of DIR's files) side by side, then the rest.
    started = time.monotonic()
    remove_trees(sorted((directory / "nodes").glob("*")))
    remove_trees([directory])
    log(f"removed {directory} in {time.monotonic() - started:.1f} s")


def remove_trees(paths: list[Path]) -> None:
    """Remove the trees at ``paths`` side by side, with ``rm -rf``: a node's containerd root holds
    its images' layers unpacked (some 50,000 files, hard-linked between the nodes), which three rm
    side by side remove in about two thirds of shutil.rmtree's time one after the other. Each
    removal stays on its tree's file system: what is still mounted below it (a mount
    ``unmount_below`` could not take off) is left as it is, never emptied."""
    removals = [subprocess.Popen(["rm", "-rf", "--one-file-system", "--", str(path)])
                for path in paths if os.path.lexists(path)]
    for removal in removals:
        removal.wait()


def reap(directory: Path, owner_pid: int) -> None:
    """Run `down` once the owner is gone, so a killed test run leaves no plane behind."""
    while alive(owner_pid) and (directory / "plane.json").exists():
        time.sleep(1)
    if (directory / "plane.json").exists():
        down(directory)
