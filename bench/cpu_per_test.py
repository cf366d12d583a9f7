"""CPU seconds per test: which tests the suite's time goes to on a CPU-bound machine.

``.venv/bin/python bench/cpu_per_test.py [--out FILE] [--top 30] -- [PYTEST ARGS...]``

Runs pytest in this process's own control group, one test at a time (``-n 0``), and charges
each test everything the group used from its setup to its teardown: the test process and every
process it started, daemons included (an Airflow stack, a Kubernetes plane and its pods, a
training group's supervisor), which ``/proc`` accounting would lose once they leave the process
tree. Prints the tests and the test files that used the most CPU, and writes every test's CPU and
wall seconds to ``--out`` (JSON). A fixture shared by several tests is charged to the first one.
Needs root (it makes a control group, cgroup v2 or v1's ``cpuacct``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

USAGE_ENV = "AIRFLOW_TF_CPU_PER_TEST_USAGE"
"""The control group's file of CPU used, which the plugin in the pytest process reads."""
RECORDS_ENV = "AIRFLOW_TF_CPU_PER_TEST_RECORDS"
"""Where the plugin appends one JSON line per test."""
CGROUP_ROOT = Path("/sys/fs/cgroup")


def read_usage(path: str | Path) -> float:
    """CPU seconds a control group used: v2's ``cpu.stat`` (usage_usec) or v1's ``cpuacct.usage`` (ns)."""
    text = Path(path).read_text()
    if Path(path).name == "cpu.stat":
        return int(next(line.split()[1] for line in text.splitlines() if line.startswith("usage_usec"))) / 1e6
    return int(text) / 1e9


def make_group(name: str) -> tuple[Path, Path]:
    """A new control group; its directory and its file of CPU used."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():  # v2, unified
        group = CGROUP_ROOT / name
        usage = group / "cpu.stat"
    elif (CGROUP_ROOT / "cpuacct").is_dir():
        group = CGROUP_ROOT / "cpuacct" / name
        usage = group / "cpuacct.usage"
    else:
        raise SystemExit("cpu_per_test: no cgroup v2 and no v1 cpuacct controller under /sys/fs/cgroup")
    group.mkdir()
    return group, usage


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The plugin's half: the group's CPU before and after each test's setup, call and teardown."""
    usage = os.environ[USAGE_ENV]
    cpu, wall = read_usage(usage), time.monotonic()
    yield
    record = {"test": item.nodeid, "cpu_s": round(read_usage(usage) - cpu, 2),
              "wall_s": round(time.monotonic() - wall, 2)}
    with open(os.environ[RECORDS_ENV], "a", encoding="utf-8") as records:
        records.write(json.dumps(record) + "\n")


def report(records: list[dict], top: int) -> dict:
    by_file: Counter[str] = Counter()
    for record in records:
        by_file[record["test"].split("::")[0]] += record["cpu_s"]
    ranked = sorted(records, key=lambda r: -r["cpu_s"])
    total = sum(r["cpu_s"] for r in records)
    print(f"cpu_per_test: {len(records)} tests, {total:.0f} s of CPU in {sum(r['wall_s'] for r in records):.0f} s",
          file=sys.stderr)
    for record in ranked[:top]:
        print(f"  {record['cpu_s']:8.1f} s CPU {record['wall_s']:8.1f} s  {record['test']}", file=sys.stderr)
    print("cpu_per_test: by file", file=sys.stderr)
    for name, cpu in by_file.most_common(top):
        print(f"  {cpu:8.1f} s CPU  {name}", file=sys.stderr)
    return {"total_cpu_s": round(total, 1), "tests": ranked,
            "files": {name: round(cpu, 1) for name, cpu in by_file.most_common()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write every test's CPU and wall seconds here (JSON)")
    parser.add_argument("--top", type=int, default=30, help="tests and files to print (default 30)")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (tests to run, -m ...)")
    args = parser.parse_args(argv)
    if args.top < 0:
        parser.error(f"--top must be 0 or more, got {args.top}")
    if os.geteuid() != 0:
        parser.error("making a control group needs root")
    group, usage = make_group(f"airflow-tf-cpu-per-test-{os.getpid()}")
    home = group.parent / "cgroup.procs"  # where this process goes back to
    with tempfile.NamedTemporaryFile(prefix="cpu-per-test-", suffix=".jsonl", delete=False) as scratch:
        records_file = Path(scratch.name)
    try:
        (group / "cgroup.procs").write_text(str(os.getpid()))  # pytest, and all it starts, inherit it
        env = dict(os.environ, **{USAGE_ENV: str(usage), RECORDS_ENV: str(records_file)},
                   PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])))
        code = subprocess.call([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "cpu_per_test", "-n", "0",
                                *args.pytest_args], env=env)
        records = [json.loads(line) for line in records_file.read_text().splitlines() if line.strip()]
        result = report(records, args.top)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1) + "\n")
        return code
    finally:
        home.write_text(str(os.getpid()))
        records_file.unlink(missing_ok=True)
        try:
            group.rmdir()
        except OSError as exc:  # a daemon the tests left behind still runs in it
            print(f"cpu_per_test: {group} not removed ({exc}): a process of the run is still in it", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
