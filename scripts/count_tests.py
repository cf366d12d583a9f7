"""Prints how many tests each folder of the suite holds, how many of them are slow and how many
are in the long tier (``./scripts/test --long``), as a Markdown table. The counts come from pytest's own collection, so they are never typed anywhere:
run this instead of writing a number down.

    .venv/bin/python scripts/count_tests.py            # the whole suite (tests/)
    .venv/bin/python scripts/count_tests.py tests/data  # any pytest paths
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path


EVERY = "long or not long"
"""The marker expression of every test: without ``-m`` the suite leaves its long tier out."""


def collected(paths: list[str], cwd: Path, marker: str = EVERY) -> list[str]:
    """The node ids pytest collects under ``paths`` with ``-m marker``."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *paths, "-m", marker]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    # 5: nothing collected (e.g. no slow test under these paths); anything else is a real failure.
    if result.returncode not in (0, 5):
        raise SystemExit(f"pytest could not collect {' '.join(paths)}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return [line for line in result.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def folder(node_id: str) -> str:
    """``tests/data/test_x.py::test_y`` -> ``data/``; ``tests/test_x.py::test_y`` -> ``test_x.py``."""
    parts = node_id.split("::", 1)[0].split("/")
    if parts[0] == "tests":
        parts = parts[1:]
    return parts[0] + "/" if len(parts) > 1 else parts[0]


def table(all_ids: list[str], slow_ids: list[str], long_ids: list[str]) -> str:
    every, slow, long = Counter(map(folder, all_ids)), Counter(map(folder, slow_ids)), Counter(map(folder, long_ids))
    rows = ["| folder | tests | of them slow | of them long |", "| --- | ---: | ---: | ---: |"]
    rows += [f"| `{name}` | {every[name]} | {slow[name]} | {long[name]} |" for name in sorted(every)]
    rows.append(f"| all | {sum(every.values())} | {sum(slow.values())} | {sum(long.values())} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[1]
    paths = argv or ["tests"]
    print(table(collected(paths, root), collected(paths, root, "slow"), collected(paths, root, "long")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
