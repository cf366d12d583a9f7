"""bench/history.py: a baseline from an earlier commit runs that commit's code, and leaves no
worktree behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import history  # noqa: E402

# Prints where airflow_tf came from and whether its prepare takes buffer_mib (streaming, 12b701d on).
PROBE = ("import inspect, json, history; from airflow_tf.data.prepare import prepare_dataset; "
         "print(json.dumps([history.imported_from(), 'buffer_mib' in inspect.signature(prepare_dataset).parameters]))")


def worktrees() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "worktree", "list", "--porcelain"], capture_output=True, text=True,
                          check=True).stdout


def test_a_child_imports_the_commits_code_and_the_worktree_is_removed_afterwards():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    with history.checkout("8ad7996") as tree:
        assert str(tree) in worktrees()
        env = history.environment(tree, {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "bench")})
        # cwd: ``-c`` puts the working directory first on sys.path, ahead of PYTHONPATH.
        run = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tree, capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        where, streaming = json.loads(run.stdout.strip().splitlines()[-1])
        history.check_imported_from(tree, where)
        assert streaming is False, "the baseline ran the streaming prepare: not the commit's code"
        with pytest.raises(SystemExit, match="not from its commit's tree"):
            history.check_imported_from(tree, str(ROOT / "airflow_tf"))
    assert not tree.exists() and str(tree) not in worktrees()


def test_an_unknown_commit_stops_before_anything_is_made():
    with pytest.raises(SystemExit, match="is not a commit"):
        history.resolve("no-such-commit-anywhere")
