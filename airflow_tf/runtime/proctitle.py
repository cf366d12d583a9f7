"""A task names itself: its process title (``ps``, ``top -c``, ``/proc/<pid>/cmdline``) and its
name (``comm``: ``top``, ``ps -e``) say which task of which group and run it is.

The title is written over the process's own command line, in place: the kernel shows that
memory as ``/proc/<pid>/cmdline``. The environment that follows it in memory is left as it is,
so ``/proc/<pid>/environ`` stays readable (a library may also keep pointers into it), and a
title longer than the command line it replaces is cut at that length. A task the fork server
forked replaces the server's command line, which the supervisor makes long enough for it."""

from __future__ import annotations

import ctypes
import os

from airflow_tf.cluster.names import GROUP_ENV, RUN_ENV, process_title

PR_SET_NAME = 15
NAME_MAX = 15
"""Bytes of a process's name (``comm``) the kernel keeps."""
ARG_START_FIELD = 48
"""Field of ``/proc/self/stat`` that holds ``arg_start`` (``arg_end`` follows), as proc(5) numbers them."""

_libc = ctypes.CDLL(None, use_errno=True)


def command_line_area() -> tuple[int, int]:
    """Start and end address of this process's command line (what ``/proc/self/cmdline`` reads)."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # What follows the name starts at the third field, the state.
    return int(fields[ARG_START_FIELD - 3]), int(fields[ARG_START_FIELD - 2])


def set_process_title(title: str, name: str) -> str | None:
    """Show ``title`` as this process's command line and ``name`` as its name; returns the title
    as shown (cut to the length of the command line it replaces), or None where the command line
    is not where ``/proc`` says (a sandboxed kernel): then only the name is set."""
    _libc.prctl(PR_SET_NAME, name.encode()[:NAME_MAX], 0, 0, 0)
    try:
        start, end = command_line_area()
        with open("/proc/self/cmdline", "rb") as f:
            current = f.read()
    except (OSError, IndexError, ValueError):
        return None
    room = end - start
    # Written only over memory that holds the command line the kernel reports, NUL-padded to
    # its end: the kernel then reads the title alone, not on into the environment.
    if start <= 0 or room <= 1 or ctypes.string_at(start, room) != current:
        return None
    shown = title.encode()[:room - 1]
    ctypes.memmove(start, shown.ljust(room, b"\0"), room)
    return shown.decode(errors="replace")


def name_task_process(role: str, index: int) -> str | None:
    """Title this task after its group and run when a backend named them in its environment
    (the local backend does); None, untouched, otherwise."""
    group = os.environ.get(GROUP_ENV)
    if not group:
        return None
    task = f"{role}-{index}"
    return set_process_title(process_title(task, group, os.environ.get(RUN_ENV, "")), task)
