"""What a node agent's pods leave on this machine (processes, network namespaces, mounts), for
the tests that start a plane with a node and check that ``scripts/kube down`` removes it all."""

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


def node_prefix(directory: Path) -> str:
    """The prefix of the network namespaces the plane's node makes (random per plane)."""
    return json.loads((directory / "plane.json").read_text())["node"]["netns_prefix"]


def namespaces(prefix: str) -> list[str]:
    """The named network namespaces of one plane's node (others' planes may run beside it)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return sorted(name for line in listing.splitlines() if line.strip() and (name := line.split()[0]).startswith(prefix))


def mounts(*markers: str) -> list[str]:
    """This machine's mount points whose path holds one of ``markers`` (a plane's directory, its
    node's namespace prefix, a mount path its pods use)."""
    points = (line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    return sorted(point for point in points if any(marker in point for marker in markers))


def plane_env(directory: Path) -> dict[str, str]:
    """What ``scripts/kube up DIR --node`` wrote to ``DIR/env``."""
    return dict(line.split("=", 1) for line in (directory / "env").read_text().splitlines())


def up_with_node(directory: Path, storage: Path | None = None, kueue: bool = False) -> None:
    """A plane with its node (and Kueue and JobSet), owned by this test process (its reaper
    downs it if the test dies)."""
    subprocess.run([sys.executable, str(KUBE_SCRIPT), "up", str(directory), "--node", "--owner-pid", str(os.getpid()),
                    *(["--storage", str(storage)] if storage else []), *(["--kueue"] if kueue else [])],
                   check=True, stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def shared_storage() -> Iterator[Path]:
    """A storage folder that the pods' non-root user can reach at its own path (pytest's
    temporary folders are private to root), removed afterwards."""
    storage = Path(tempfile.mkdtemp(prefix="airflow-tf-node-storage-"))
    storage.chmod(0o755)
    try:
        yield storage
    finally:
        shutil.rmtree(storage, ignore_errors=True)


def down(directory: Path) -> None:
    subprocess.run([sys.executable, str(KUBE_SCRIPT), "down", str(directory)], check=True)
