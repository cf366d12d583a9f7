"""A private network namespace for a local group: loopback only, so its unauthenticated TensorFlow
gRPC ports are reachable from nowhere else; and the warning when the system refuses one."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct

CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

_libc = ctypes.CDLL(None, use_errno=True)


def isolate_network() -> str | None:
    """Move this single-threaded process (and every child it starts later) into a new network
    namespace with only loopback, up. As root a network namespace suffices; otherwise a user
    namespace owning it maps this user to itself. Returns None, or why it was refused."""
    unshare = _libc.unshare
    refused = []
    if os.geteuid() == 0:
        if unshare(CLONE_NEWNET) == 0:
            _loopback_up()
            return None
        refused.append(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno() or errno.EPERM)}")
    uid, gid = os.geteuid(), os.getegid()
    if unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        refused.append(f"unshare(CLONE_NEWUSER|CLONE_NEWNET): {os.strerror(ctypes.get_errno() or errno.EPERM)}")
        return "; ".join(refused)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    _loopback_up()
    return None


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def isolation_warning(group: str, refused: str) -> str:
    return (
        f"training group {group!r} is NOT network-isolated: this system refused a private network namespace "
        f"({refused}). Its TensorFlow gRPC ports listen on every interface without authentication, so anyone "
        "who can reach this machine can run operations in its tasks (read and write their files, read their "
        "environment). Remedy: allow user namespaces (sysctl user.max_user_namespaces > 0, "
        "kernel.unprivileged_userns_clone=1) or give the launcher CAP_SYS_ADMIN; until then firewall this "
        "machine's ports, or set isolate_network=False to accept the risk explicitly."
    )
