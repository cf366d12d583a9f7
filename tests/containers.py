"""Containers for the tests: the images scripts/images builds here, run by Podman from the same
store (no Docker engine on this machine). Every container a test starts carries a label of its
own, so that a test removes and checks only what it started."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.machinery
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
IMAGES_SCRIPT = ROOT / "scripts" / "images"
TEST_LABEL = "org.airflow-tf.test"


def _load_images_script():
    """scripts/images as a module: its Dockerfile reading (instructions, from_image, copied) and
    the lock's pins are the tests' too."""
    loader = importlib.machinery.SourceFileLoader("images_script", str(IMAGES_SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    sys.modules[loader.name] = module  # its dataclasses look their module up there
    loader.exec_module(module)
    return module


images_script = _load_images_script()


@functools.cache
def store_env() -> dict[str, str]:
    """The environment under which podman sees the images (``scripts/images env``)."""
    out = subprocess.run([str(IMAGES_SCRIPT), "env"], check=True, capture_output=True, text=True).stdout
    return {name: shlex.split(value)[0] for name, value in
            (line.removeprefix("export ").split("=", 1) for line in out.splitlines())}


def built(*names: str) -> dict[str, str]:
    """The full names of the images ``names``, built first where the store has no current build
    (./scripts/test builds them all before the suite, so this is a check of seconds)."""
    result = subprocess.run([str(IMAGES_SCRIPT), "build", *names], capture_output=True, text=True)
    assert result.returncode == 0, f"scripts/images build {' '.join(names)} failed:\n{result.stderr[-3000:]}"
    refs = {}
    for name in names:
        refs[name] = subprocess.run([str(IMAGES_SCRIPT), "ref", name], check=True, capture_output=True,
                                    text=True).stdout.strip()
    return refs


def podman(*args: str, check: bool = True, timeout: float = 300, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], env={**os.environ, **store_env(), **(env or {})},
                            capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


def new_label() -> str:
    """A value of TEST_LABEL that no other test uses."""
    return uuid.uuid4().hex[:12]


def remove_labelled(label: str) -> None:
    """Remove every container the test labelled ``label`` started, running or not."""
    # --depend: a container that shares another's network goes with that one.
    for container in podman("ps", "--all", "--quiet", "--filter", f"label={TEST_LABEL}={label}").stdout.split():
        podman("rm", "--force", "--depend", "--ignore", "--time", "0", container)



HOST_NETWORK_RECORD = "host-network.json"  # in the store's folder: what the host had before netavark
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
IPTABLES_TABLES = ("filter", "nat")


def store_dir() -> Path:
    return Path(store_env()["CONTAINERS_CONF"]).parent


def project_networks() -> list[str]:
    """The store's networks that compose projects made (Podman's own `podman` exists from the start)."""
    return [n for n in podman("network", "ls", "--format", "{{.Name}}").stdout.split() if n != "podman"]


def iptables_rules(table: str) -> list[str]:
    return subprocess.run(["iptables", "-t", table, "-S"], check=True, capture_output=True, text=True).stdout.splitlines()


class HostNetwork:
    """What Podman's network stack (netavark) changes on the host for a bridge network and does not
    put back when the last one goes: IPv4 forwarding turned on, its iptables chains (NETAVARK*) and
    the jumps to them. Use as a context manager around a compose project's life. The host as the
    first project found it is recorded in the store's folder with the processes using it, and put
    back by the last of them, so that runs side by side do not cut each other's network (a record
    left by a run that died keeps the state from before it)."""

    restored = False  # whether this run was the last and put the host back

    def __enter__(self) -> HostNetwork:
        with self._record() as record:
            if not record:
                record.update(ip_forward=IP_FORWARD.read_text().strip(),
                              **{t: iptables_rules(t) for t in IPTABLES_TABLES})
            record["holders"] = [*record.get("holders", []), os.getpid()]
        return self

    def __exit__(self, *exc_info: object) -> None:
        with self._record() as record:
            record["holders"] = [p for p in record.get("holders", []) if p != os.getpid() and psutil.pid_exists(p)]
            if record["holders"] or project_networks():
                return  # another run still uses the network stack: the last one restores
            for table in IPTABLES_TABLES:
                added = [r for r in iptables_rules(table) if r not in record[table] and "NETAVARK" in r.upper()]
                for rule in added:  # the rules (jumps included) first, then the emptied chains
                    if rule.startswith("-A "):
                        subprocess.run(["iptables", "-t", table, "-D", *shlex.split(rule)[1:]], check=True)
                for rule in added:
                    if rule.startswith("-N "):
                        subprocess.run(["iptables", "-t", table, "-X", rule.split()[1]], check=True)
            IP_FORWARD.write_text(record["ip_forward"] + "\n")
            record.clear()
            self.restored = True

    @staticmethod
    @contextlib.contextmanager
    def _record():
        """The record, read and written back (removed once empty) under a lock of its own."""
        path = store_dir() / HOST_NETWORK_RECORD
        with open(path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            record = json.loads(path.read_text()) if path.exists() else {}
            yield record
            if record:
                path.write_text(json.dumps(record))
            else:
                path.unlink(missing_ok=True)
