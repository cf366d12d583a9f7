"""``scripts/kube up``'s node options refused before anything starts, each naming the option and
what to give instead; nothing is left behind."""

from __future__ import annotations

import subprocess
import sys

from k8s.plane import KUBE_SCRIPT


def _up(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(KUBE_SCRIPT), "up", *args], capture_output=True, text=True, timeout=60)


def test_node_options_that_cannot_work_are_refused_naming_what_to_give(tmp_path):
    both = _up(str(tmp_path / "both"), "--node", "--nodes", "2")
    assert both.returncode != 0 and "--node is the old name of --nodes 1; give only --nodes N" in both.stderr
    storage = _up(str(tmp_path / "storage"), "--storage", str(tmp_path / "s"))
    assert storage.returncode != 0 and "--storage is the folder offered to the pods of real nodes: give it with " \
        "--nodes N" in storage.stderr
    deep = tmp_path / ("d" * 100)
    long = _up(str(deep), "--nodes", "1")
    assert long.returncode != 0 and f"kube: {deep} is too long a path for its nodes' sockets" in long.stderr
    assert "choose a shorter one" in long.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing was made"
