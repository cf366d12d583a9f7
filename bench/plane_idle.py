"""CPU of an idle Kubernetes plane (``scripts/kube up``), an earlier commit's against the current one.

``.venv/bin/python bench/plane_idle.py [--baseline COMMIT] [--settle 20] [--seconds 60]``

Each plane is brought up (the baseline's by its own ``scripts/kube`` in a worktree of that commit,
:mod:`history`), left to settle, then each component's CPU is read from ``/proc`` over
``--seconds`` with nothing asking it anything, and the plane is brought down. The tests keep a plane
up for most of a suite run, so its idle CPU is CPU the tests' own processes cannot use.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from history import REPO, checkout  # noqa: E402
from suite_cpu import TICKS, cpu_ticks  # noqa: E402


def _cpu_seconds(run_dir: Path) -> dict[str, float]:
    """Component -> CPU seconds so far, for each process the plane recorded in ``run/*.pid``."""
    used = {}
    for pid_file in sorted(run_dir.glob("*.pid")):
        ticks = cpu_ticks(pid_file.read_text().strip())
        if ticks is not None:
            used[pid_file.stem] = ticks / TICKS
    return used


def idle_share(kube: Path, settle: float, seconds: float) -> dict[str, float]:
    """Each component's share of one core while the plane of ``kube`` (a ``scripts/kube``) idles."""
    with tempfile.TemporaryDirectory(prefix="airflow-tf-plane-idle-") as parent:
        plane = Path(parent) / "plane"
        subprocess.run([sys.executable, str(kube), "up", str(plane)], check=True, stdout=subprocess.DEVNULL)
        try:
            time.sleep(settle)
            before = _cpu_seconds(plane / "run")
            time.sleep(seconds)
            after = _cpu_seconds(plane / "run")
        finally:
            subprocess.run([sys.executable, str(kube), "down", str(plane)], check=False)
    return {name: (after[name] - before[name]) / seconds for name in before if name in after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="5087dc5", help="the earlier commit (default: before the leases "
                                                               "were renewed every 15 s)")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after up before measuring")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds measured")
    args = parser.parse_args()
    with checkout(args.baseline) as tree:
        baseline = idle_share(tree / "scripts" / "kube", args.settle, args.seconds)
    ours = idle_share(REPO / "scripts" / "kube", args.settle, args.seconds)
    print(f"{'component':<26}{'baseline':>10}{'ours':>10}   (share of one core, idle)")
    for name in sorted(set(baseline) | set(ours)):
        print(f"{name:<26}{baseline.get(name, 0):>10.1%}{ours.get(name, 0):>10.1%}")
    total_base, total_ours = sum(baseline.values()), sum(ours.values())
    print(f"{'whole plane':<26}{total_base:>10.1%}{total_ours:>10.1%}   ratio ours/baseline "
          f"{total_ours / total_base:.2f}")


if __name__ == "__main__":
    main()
