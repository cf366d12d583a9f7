"""A private Kubernetes control plane on loopback, built from the modules kube/go.mod pins.

    scripts/kube build          build etcd, kube-apiserver, kube-controller-manager,
                                kube-scheduler, the kubelet and CoreDNS, and containerd with its
                                runc shim (kube/containerd), once into a cache outside the repo;
                                prints their bin dirs
    scripts/kube build --kueue  ... and Kueue and the JobSet controller (kube/kueue, kube/jobset)
    scripts/kube up DIR         start a plane with its state, logs and kubeconfig in DIR
    scripts/kube up DIR --nodes N  ... and N real nodes (root): per node a containerd (kube/containerd)
                                and a kubelet, each node with its own identity (system:node:<name>),
                                pods on a CNI bridge, the training image loaded; CoreDNS as the
                                cluster DNS on a host address the pods reach; a storage folder
                                (--storage PATH, default DIR/storage) offered to the pods as
                                hostPath PersistentVolumes, writable by their group (1000)
    scripts/kube up DIR --node  deprecated: the same as --nodes 1 (it used to start a node agent
                                that ran pods as local processes)
    scripts/kube up DIR --kueue ... and Kueue and JobSet (their CRDs, and both controllers with
                                their webhooks not registered), for queued groups of workload="jobset"
    scripts/kube kueue DIR      add Kueue and JobSet to the plane running in DIR
    scripts/kube down DIR       stop every process of that plane and what its real nodes made
                                (their pods, mounts, cgroups, network namespaces, links, host paths'
                                entries; the host sysctls the kubelets change put back by the last
                                plane with nodes down, from the first one's record under /run), and
                                remove DIR
    scripts/kube node stop DIR NODE   take NODE away as a lost machine goes: its kubelet, containerd,
                                shims and containers SIGKILLed at once, nothing deleted through the
                                API (the Node goes NotReady after the plane's 20 s grace period)
    scripts/kube node start DIR NODE  start it again with the same configuration, state and images
    scripts/kube node cut DIR NODE    cut NODE's pod network from the other nodes and the host
                                (iptables in its network namespace); its kubelet keeps reporting Ready
    scripts/kube node join DIR NODE   remove exactly those rules

Each real node is a machine whose kubelet address and pod network are separable: its containerd
(hence the CNI bridge and its pods) runs in a network namespace of its own, joined to the plane's
host bridge by a veth pair, with its own ip_forward and routes to the other nodes' pod subnets;
its kubelet stays in the host's namespace (it reaches the API server on 127.0.0.1, and the API
server reaches it on its host-side address), so a test can cut a node's pod network while its
kubelet keeps reporting Ready. The host routes to each pod subnet; its own ip_forward is not changed.

Without --nodes the plane has no node: pods stay Pending. Only the standard library and the
openssl, ip, nsenter and iptables commands are used, so it runs before any environment exists.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .build import CONTROLLERS, build, build_controller, build_runtime
from .kueue import start_kueue
from .nodes import MAX_NODES, node_cut, node_start, node_stop
from .plane import down, reap, up
from .process import log


def check_up_arguments(args: argparse.Namespace) -> None:
    """``up``'s arguments checked before anything starts (``--node`` turned into ``--nodes 1``)."""
    if args.nodes is not None and not 1 <= args.nodes <= MAX_NODES:
        raise SystemExit(f"kube: --nodes {args.nodes}: give a number of nodes from 1 to {MAX_NODES}")
    if args.node:
        if args.nodes is not None:
            raise SystemExit("kube: --node is the old name of --nodes 1; give only --nodes N")
        log("warning: --node is deprecated and will be removed in the next release: it now starts one real "
            "node, as --nodes 1 does (the node agent that ran pods as local processes is retired); "
            "use --nodes 1")
        args.nodes = 1
    # The longest unix socket a node listens on: the kernel takes 107 bytes and a NUL.
    longest = args.dir.resolve() / "nodes" / f"node-{args.nodes or 1}" / "state" / "containerd.sock.ttrpc"
    if args.nodes and len(os.fsencode(longest)) > 107:
        raise SystemExit(f"kube: {args.dir} is too long a path for its nodes' sockets ({longest} would be "
                         f"{len(os.fsencode(longest))} bytes, a unix socket's path 107 at most): choose a shorter one")
    if args.storage is not None and not args.nodes:
        raise SystemExit("kube: --storage is the folder offered to the pods of real nodes: give it with --nodes N")
    if args.dir.exists() and any(args.dir.iterdir()):  # never another plane's, nor a user's files
        raise SystemExit(f"kube: {args.dir} is not empty; choose a new directory, or "
                         f"`scripts/kube down {args.dir}` if a plane runs there")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="build the pinned components once; print their bin dir")
    build_parser.add_argument("--kueue", action="store_true",
                              help="also build Kueue (kube/kueue) and the JobSet controller (kube/jobset); print their bin dirs")
    up_parser = commands.add_parser("up", help="start a plane in DIR")
    up_parser.add_argument("dir", type=Path)
    up_parser.add_argument("--node", action="store_true",
                           help="deprecated: the same as --nodes 1 (it started the node agent, now retired)")
    up_parser.add_argument("--nodes", type=int, metavar="N",
                           help=f"also start N real nodes (1 to {MAX_NODES}): kubelet, containerd, runc and CNI "
                                "bridge networking each, the training image loaded (root)")
    up_parser.add_argument("--storage", type=Path, metavar="PATH",
                           help="with --nodes: the storage folder offered to the pods as hostPath volumes "
                                "(default DIR/storage); one outside DIR outlives `down`")
    up_parser.add_argument("--kueue", action="store_true",
                           help="also install Kueue's and JobSet's CRDs and start both controllers "
                                "(their webhooks not registered)")
    up_parser.add_argument("--owner-pid", type=int,
                           help="stop the plane and remove DIR when this process exits (tests pass their own pid)")
    commands.add_parser("kueue", help="add Kueue and JobSet to the plane running in DIR").add_argument(
        "dir", type=Path)
    commands.add_parser("down", help="stop the plane in DIR and remove DIR").add_argument("dir", type=Path)
    node_parser = commands.add_parser("node", help="stop, start, cut or join one real node of the plane in DIR")
    node_parser.add_argument("action", choices=("stop", "start", "cut", "join"),
                             help="stop: killed as a lost machine goes; start: again as `up` ran it; cut: its pod "
                                  "network cut from the other nodes and the host (kubelet still Ready); join: uncut")
    node_parser.add_argument("dir", type=Path)
    node_parser.add_argument("node", help="the node's name, e.g. node-2")
    reap_parser = commands.add_parser("_reap")
    reap_parser.add_argument("dir", type=Path)
    reap_parser.add_argument("owner_pid", type=int)
    args = parser.parse_args()
    if args.command == "build":
        print(build())
        print(build_runtime())
        if args.kueue:
            for name in CONTROLLERS:
                print(build_controller(name))
    elif args.command == "up":
        check_up_arguments(args)
        try:
            up(args.dir, args.owner_pid, args.kueue, args.storage, args.nodes or 0)
        except BaseException:
            # A plane half up is no use to anyone: say why from its logs, then leave nothing behind.
            for component_log in sorted((args.dir / "logs").glob("*.log")):
                tail = component_log.read_text(errors="replace").splitlines()[-15:]
                log(f"the end of {component_log.name}:\n  " + "\n  ".join(tail))
            down(args.dir)
            raise
    elif args.command == "kueue":
        if not (args.dir / "plane.json").exists():
            raise SystemExit(f"kube: {args.dir} holds no running plane (no plane.json); start one with `up`")
        start_kueue(args.dir)
    elif args.command == "down":
        down(args.dir)
    elif args.command == "node":
        {"stop": node_stop, "start": node_start, "cut": node_cut,
         "join": lambda d, n: node_cut(d, n, join=True)}[args.action](args.dir, args.node)
    else:
        reap(args.dir, args.owner_pid)
