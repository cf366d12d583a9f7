"""Baselines from history: run an earlier commit's code beside the current code, in the same run.

A benchmark against an earlier implementation keeps no copy of it: ``checkout(commit)`` makes a
temporary detached ``git worktree`` of that commit (removed afterwards), and ``environment(tree)``
puts that tree first on ``PYTHONPATH``, so a fresh interpreter of the same environment imports
``airflow_tf`` from the commit instead of the working copy (the editable install's finder comes
after ``PYTHONPATH`` entries; a child started with ``-c`` or ``-m`` puts its working directory
before them, so run it in the tree). ``imported_from()`` is what a child prints and
``check_imported_from`` what the parent verifies, so a baseline never silently measures the
current code.

From the command line, run a module of the commit (its own ``python -m`` arguments follow):
``.venv/bin/python bench/history.py COMMIT MODULE [ARGS...]``
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def resolve(commit: str) -> str:
    """The full hash of ``commit`` (a name, tag or abbreviation); an unknown one stops the run."""
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode:
        raise SystemExit(f"bench/history.py: {commit!r} is not a commit of {REPO}")
    return found.stdout.strip()


@contextmanager
def checkout(commit: str) -> Iterator[Path]:
    """A detached worktree of ``commit`` in a temporary directory, removed and unregistered afterwards."""
    sha = resolve(commit)
    parent = Path(tempfile.mkdtemp(prefix=f"airflow-tf-{sha[:10]}-"))
    tree = parent / "tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(tree), sha], check=True)
    try:
        yield tree
    finally:
        # --force: the run may have left files (bytecode, outputs) in the tree.
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(parent, ignore_errors=True)


def environment(tree: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``tree`` first on ``PYTHONPATH``."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    return env


def imported_from(module: str = "airflow_tf") -> str:
    """The directory ``module`` was imported from in this process (for the parent to compare)."""
    return str(Path(sys.modules[module].__file__).resolve().parent)


def check_imported_from(tree: Path, where: str, module: str = "airflow_tf") -> None:
    """Stops the run when the child imported ``module`` from anywhere but ``tree``."""
    if Path(where).resolve() != (Path(tree) / module).resolve():
        raise SystemExit(f"the baseline imported {module} from {where}, not from its commit's tree {tree}")


def run_module(commit: str, module: str, args: list[str]) -> int:
    """``python -m module args`` with ``module`` and ``airflow_tf`` taken from ``commit``."""
    with checkout(commit) as tree:
        return subprocess.run([sys.executable, "-m", module, *args], env=environment(tree), cwd=tree).returncode


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    sys.exit(run_module(sys.argv[1], sys.argv[2], sys.argv[3:]))
