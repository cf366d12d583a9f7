"""Every function's cyclomatic complexity as radon counts it (docs/how-to/develop.md names radon and
its bar): prints each function at or over the bar and exits 1 if there is one.

Usage: ``.venv/bin/python scripts/complexity.py PATH...`` (a folder: its ``*.py`` files; a file:
read whatever its name, as ``scripts/kube`` has no ``.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Function

BAR = 20
"""A function is kept under this (docs/how-to/develop.md)."""


def over_the_bar(paths: list[Path]) -> list[str]:
    files = [f for path in paths for f in (sorted(path.rglob("*.py")) if path.is_dir() else [path])]
    found = []
    for file in files:
        # A class's own figure sums its methods': only functions and methods count.
        functions = {(f.lineno, f.fullname): f for block in cc_visit(file.read_text(encoding="utf-8"))
                     for f in [block, *getattr(block, "methods", [])] if isinstance(f, Function)}
        found += [f"{file}:{f.lineno} {f.fullname}: {f.complexity}" for _, f in sorted(functions.items())
                  if f.complexity >= BAR]
    return found


def main() -> int:
    found = over_the_bar([Path(arg) for arg in sys.argv[1:]])
    for line in found:
        print(f"complexity {BAR} or more (radon): {line}; split it into named steps", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
