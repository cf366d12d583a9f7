"""The plane's processes: each component started in a session of its own with its pid in DIR/run,
waited for, recognised (by DIR in its command line) and stopped; the messages on stderr."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STOP_GRACE_SECONDS = 10
READY_TIMEOUT_SECONDS = 120


def log(message: str) -> None:
    print(f"kube: {message}", file=sys.stderr, flush=True)


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def sign(pki: Path, name: str, subject: str, usage: str, alt_names: str | None = None, into: Path | None = None) -> None:
    """``name.key`` and ``name.crt`` in ``into`` (default ``pki``): a new key and its certificate
    for ``subject``, signed by the plane's CA in ``pki`` for ``usage`` (extendedKeyUsage) and
    ``alt_names`` (subjectAltName)."""
    into = into or pki
    extensions = into / f"{name}.ext"
    extensions.write_text(f"extendedKeyUsage={usage}\n" + (f"subjectAltName={alt_names}\n" if alt_names else ""))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", subject, cwd=into)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
            "-CAcreateserial", "-days", "30", "-out", f"{name}.crt", "-extfile", extensions.name, cwd=into)
    (into / f"{name}.csr").unlink()
    extensions.unlink()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(directory: Path, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
    """Start one component in a session of its own, its output in DIR/logs/NAME.log."""
    logs = directory / "logs"
    with open(logs / f"{name}.log", "ab") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, cwd=directory,
                                   env=None if env is None else {**os.environ, **env})
    (directory / "run" / f"{name}.pid").write_text(f"{process.pid}\n")


def wait_for(what: str, check: Callable[[], object], directory: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while not check():
        for pid_file in (directory / "run").glob("*.pid"):
            if not alive(int(pid_file.read_text())):
                raise SystemExit(f"kube: {pid_file.stem} exited while waiting for {what}; "
                                 f"see {directory / 'logs' / (pid_file.stem + '.log')}")
        if time.monotonic() > deadline:
            raise SystemExit(f"kube: {what} not ready after {READY_TIMEOUT_SECONDS} s; see {directory / 'logs'}")
        time.sleep(0.2)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours has exited
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def ours(pid: int, directory: Path) -> bool:
    """Whether pid still runs a component of this plane (and not a process that reused the pid)."""
    try:
        return str(directory) in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False


def stop(name: str, pid: int) -> None:
    """SIGTERM to the component's process group, then SIGKILL if it is still there after the bound."""
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        log(f"{name} (pid {pid}) did not stop within {STOP_GRACE_SECONDS} s of SIGTERM; killing it")
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(pid, signal.SIGKILL)


def zombie(proc: Path) -> bool:
    """Whether the process has exited and waits for its parent to reap it (or is gone)."""
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def comm(proc: Path) -> str:
    try:
        return (proc / "comm").read_text().strip()
    except OSError:
        return ""
