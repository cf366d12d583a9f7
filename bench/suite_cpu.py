"""CPU seconds by kind of process while a command runs (e.g. the test suite): what the time of a
CPU-bound run is spent on.

``.venv/bin/python bench/suite_cpu.py [--interval 1] [--out FILE] -- COMMAND [ARGS...]``

Every ``--interval`` seconds it reads each process's CPU time from ``/proc`` and charges what it
used since the last read to the process's kind (its command line, and for a TensorFlow task its
role from ``TF_CONFIG``), read again each time: a process that execs another program is charged
as the new one from then on. A process that exits between two reads loses at most one interval
of CPU, so the table is a lower bound per kind; its total is compared with the whole machine's.
Reading other processes' environments needs root (or the same user).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")

KINDS = [  # (kind, pattern of the command line); the first match wins
    # A real node's own processes: the binaries themselves, not a path that holds their names.
    ("real node", r"/(kubelet|containerd|containerd-shim-runc-v2|pause)(\s|$)"),
    ("health question", r"-m airflow_tf\.runtime\.health\b"),
    # A local group's task titles itself "airflow-tf worker-0 group=... run=..." (runtime/proctitle.py).
    ("tensorflow task", r"-m airflow_tf\.runtime(\.forkserver)?(\s|$)|^airflow-tf [a-z]+-\d+ group="),
    ("export's load check", r"-m airflow_tf\.serving\.loading\b"),
    ("evaluate/export pod", r"-m airflow_tf\.serving(\s|$)"),
    ("postgres", r"^postgres|/postgres\b"),
    ("chromium", r"chrom"),
    ("kubernetes plane", r"kube-apiserver|/etcd\b|kube-controller|kube-scheduler|coredns|/kueue\b|jobset|"
                         r"scripts/kube\b"),
    ("airflow dags test", r"airflow\S* dags test"),
    ("airflow scheduler", r"airflow\S* scheduler"),
    ("airflow api-server", r"airflow\S* api[-_]server|uvicorn|gunicorn"),
    ("airflow dag-processor", r"airflow\S* dag-processor"),
    ("airflow triggerer", r"airflow\S* triggerer"),
    ("airflow task", r"airflow\S* (tasks?|worker) "),
    ("airflow-tf CLI", r"/airflow-tf\s"),
    ("pytest", r"-m pytest\b|bin/pytest\b|pytest-xdist|execnet"),
    ("pip", r"-m pip\b|/pip3?\s"),  # before Airflow: an install names the [airflow] extra
    ("airflow (other)", r"\bairflow\b"),
    ("go build", r"\bgo\b|/compile\b|/link\b|/asm\b"),
    ("python (other)", r"python"),
]
PATTERNS = [(kind, re.compile(pattern)) for kind, pattern in KINDS]


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def cpu_ticks(pid: str) -> int | None:
    stat = _read(Path("/proc", pid, "stat"))
    if stat is None:
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (the fields after the command's name)


def _command(args: list[str]) -> str:
    """What a process runs, in a few words: ``airflow db migrate``, ``python -m pytest``, ``python -c
    'from airflow...'`` (paths shortened to their last part)."""
    words = [os.path.basename(arg) if "/" in arg and " " not in arg else arg.split("\n")[0][:40]
             for arg in args[:4]]
    return " ".join(words)[:80]


def _role(pid: str, command_line: str) -> str:
    """A task's role: from its ``TF_CONFIG``, or for a task its group's fork server forked (whose
    environment in ``/proc`` is the server's) from its name, ``worker-1``; the server itself is
    ``fork server``; a task that titled itself, from its title."""
    titled = re.match(r"airflow-tf ([a-z]+)-\d+ group=", command_line)
    if titled:
        return titled.group(1)
    role = re.search(rb'"type":\s*"(\w+)"', _read(Path("/proc", pid, "environ")) or b"")
    if role:
        return role.group(1).decode()
    if "airflow_tf.runtime.forkserver" not in command_line:
        return "?"
    name = (_read(Path("/proc", pid, "comm")) or b"").decode().strip()
    return name.rsplit("-", 1)[0] if "-" in name else "fork server"


def _kind(pid: str) -> tuple[str, str] | None:
    """The kind of process ``pid`` is, and its command in a few words."""
    cmdline = _read(Path("/proc", pid, "cmdline"))
    if not cmdline:
        return None  # a kernel thread, or gone
    args = cmdline.rstrip(b"\0").decode(errors="replace").split("\0")
    text, command = " ".join(args), _command(args)
    for kind, pattern in PATTERNS:
        if pattern.search(text):
            if kind == "tensorflow task":
                return f"tensorflow task ({_role(pid, text)})", command
            return kind, command
    return "other: " + os.path.basename((text.split() or ["?"])[0])[:30], command


def _machine_busy_ticks() -> int:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(v) for v in fields[:3]) + sum(int(v) for v in fields[5:8])  # all but idle and iowait


class Usage:
    """The CPU seconds each kind of process used while a command ran, and how many processes."""

    def __init__(self) -> None:
        self.commands: Counter[tuple[str, str]] = Counter()  # (kind, command in a few words) -> CPU seconds
        self.processes: dict[str, set[str]] = {}  # kind -> the pids charged to it
        self.machine_cpu = 0.0  # what the whole machine used meanwhile
        self.wall = 0.0
        self.returncode = 0

    @property
    def cpu(self) -> Counter[str]:
        """Kind -> CPU seconds."""
        by_kind: Counter[str] = Counter()
        for (kind, _), seconds in self.commands.items():
            by_kind[kind] += seconds
        return by_kind


def measure(command: list[str], interval: float = 1.0, **popen) -> Usage:
    """Run ``command`` (``popen``: Popen's arguments) and charge its run's CPU by kind of process."""
    usage = Usage()
    seen: dict[str, tuple[tuple[str, str], int]] = {}  # pid -> ((kind, command), ticks at the last read)
    me = str(os.getpid())

    def read_all(charge: bool) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == me:
                continue
            ticks = cpu_ticks(pid)
            if ticks is None:
                continue
            # Read each time: a forked process (a pod's sandbox, a task runner) becomes what it
            # execs, and its CPU from then on is charged to that.
            found = _kind(pid) or (seen[pid][0] if pid in seen else None)
            if found is None:
                continue
            # One started during the run is charged all its CPU; one already running, from now.
            before = seen[pid][1] if pid in seen else (0 if charge else ticks)
            if charge:
                usage.commands[found] += (ticks - before) / TICKS
                usage.processes.setdefault(found[0], set()).add(pid)
            seen[pid] = (found, ticks)

    read_all(charge=False)
    machine_start, start = _machine_busy_ticks(), time.monotonic()
    child = subprocess.Popen(command, **popen)
    while True:
        finished = child.poll() is not None
        read_all(charge=True)
        if finished:
            break
        time.sleep(interval)
    usage.wall = time.monotonic() - start
    usage.machine_cpu = (_machine_busy_ticks() - machine_start) / TICKS
    usage.returncode = child.returncode
    return usage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between reads (default 1)")
    parser.add_argument("--out", help="also write the table as JSON here")
    parser.add_argument("--commands", type=int, default=15, metavar="N",
                        help="also list the N commands that used the most CPU (default 15)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.interval <= 0 or args.commands < 0:
        parser.error("give a positive --interval, --commands of 0 or more, and a command after --")
    usage = measure(command, args.interval)
    machine = usage.machine_cpu
    rows = [(kind, seconds) for kind, seconds in usage.cpu.most_common() if seconds > 0]
    counts = {kind: len(usage.processes.get(kind, ())) for kind, _ in rows}
    print(f"\n{'kind of process':34} {'CPU s':>9} {'share':>6} {'processes':>9}", file=sys.stderr)
    for kind, seconds in rows:
        print(f"{kind:34} {seconds:9.0f} {seconds / machine:6.1%} {counts[kind]:9}", file=sys.stderr)
    print(f"{'charged in all':34} {sum(s for _, s in rows):9.0f}\n{'the machine was busy':34} {machine:9.0f} "
          f"over {usage.wall:.0f} s wall on {os.cpu_count()} cores ({machine / usage.wall / (os.cpu_count() or 1):.0%})",
          file=sys.stderr)
    commands = [(kind, what, seconds) for (kind, what), seconds in usage.commands.most_common(args.commands)
                if seconds > 0]
    if commands:
        print(f"\n{'kind of process':34} {'CPU s':>9}  command", file=sys.stderr)
        for kind, what, seconds in commands:
            print(f"{kind:34} {seconds:9.0f}  {what}", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps({"wall_s": usage.wall, "machine_busy_cpu_s": machine,
                                              "by_kind_cpu_s": dict(rows), "processes_by_kind": counts,
                                              "top_commands": [{"kind": k, "command": c, "cpu_s": s}
                                                               for k, c, s in commands],
                                              "command": command}, indent=1))
    return usage.returncode


if __name__ == "__main__":
    sys.exit(main())
