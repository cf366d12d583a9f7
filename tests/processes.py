"""Counting the processes of local training groups, for the tests' no-orphan checks."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path


def _group_environments(state_dir: Path) -> dict[int, dict[str, str]]:
    """The environments of the live processes started for groups in ``state_dir`` (supervisors
    and tasks; the local backend gives them ``AIRFLOW_TF_STATE_DIR`` in their environment).
    A process that exits while it is being read is left out."""
    marker = str(Path(state_dir).resolve())
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = environ_of(int(entry))
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if environ.get("AIRFLOW_TF_STATE_DIR") == marker and state not in ("Z", "X"):
            found[int(entry)] = environ
    return found


def group_processes_of(state_dir: Path) -> list[int]:
    """Pids of live processes started for groups in ``state_dir``."""
    return list(_group_environments(state_dir))


def titled_processes(run: Path) -> dict[int, str]:
    """pid -> title of the live group tasks whose title names ``run``, or a run directory under
    it, as their run; found as a cleanup script would, by the first string of ``/proc/<pid>/cmdline``
    (``airflow-tf worker-0 group=<group> run=<run>``)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read().split(b"\0", 1)[0].decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        named = title.partition(" run=")[2] if title.startswith("airflow-tf ") else ""
        if named and (named == str(run) or named.startswith(f"{run}/")) and state not in ("Z", "X"):
            found[int(entry)] = title
    return found


def task_pid(state_dir: Path, task: str) -> int:
    """The pid of the group task named ``task`` (``name-ps-0``), which must be running, as its
    group's state file says (a forked trainer's ``/proc`` environment is its fork server's)."""
    import json

    (pid,) = [entry["pid"] for path in Path(state_dir).glob("*/state.json")
              for name, entry in json.loads(path.read_text())["processes"].items() if name == task]
    return pid


def kill_leftovers(state_dir: Path, grace: float = 3.0) -> list[int]:
    """Pids still running after ``grace`` seconds (a supervisor may take a moment to exit
    after teardown); they are killed so one failing test does not leak into the next."""
    deadline = time.monotonic() + grace
    while (left := group_processes_of(state_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def environ_of(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with (``/proc/<pid>/environ``)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [item.decode("utf-8", "replace").partition("=") for item in f.read().split(b"\0") if item]
    return {key: value for key, _, value in pairs}


def external_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (None when it has none)."""
    import fcntl
    import socket
    import struct

    SIOCGIFADDR = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            address = socket.inet_ntoa(raw[20:24])
            if not address.startswith("127."):
                return address
    return None


def can_connect(host: str, port: int, timeout: float = 2.0) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _tc(supervisor: int, *args: str) -> None:
    """``tc`` inside a local group's private network namespace (its supervisor's)."""
    subprocess.run(["nsenter", "-t", str(supervisor), "-n", "tc", *args], check=True, capture_output=True)


def cut_port(supervisor: int, port: int) -> None:
    """Cut the task listening on ``port`` off from its group: every packet to or from that port,
    on the group's loopback, goes through a class of 8 bit/s with a one-packet queue (this kernel
    has neither a tc drop action nor iptables), which holds them as a cut cable would. Root only."""
    _tc(supervisor, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "20", "r2q", "1")
    _tc(supervisor, "class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate", "8bit", "ceil",
        "8bit", "burst", "1b", "cburst", "1b")
    _tc(supervisor, "class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb", "rate", "10gbit")
    _tc(supervisor, "qdisc", "add", "dev", "lo", "parent", "1:10", "pfifo", "limit", "1")
    for way in ("dport", "sport"):
        _tc(supervisor, "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match",
            "ip", way, str(port), "0xffff", "flowid", "1:10")


def restore_network(supervisor: int) -> None:
    """Undo :func:`cut_port` (the namespace, and any cut, also ends with the group)."""
    _tc(supervisor, "qdisc", "del", "dev", "lo", "root")


def can_cut() -> bool:
    """Whether this machine can cut a task off (:func:`cut_port`): root, ``nsenter`` and ``tc``."""
    return os.geteuid() == 0 and all(shutil.which(tool) for tool in ("nsenter", "tc"))
