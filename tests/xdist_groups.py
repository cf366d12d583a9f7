"""Keeping tests that share a costly fixture on one pytest-xdist worker.

pytest-xdist's ``--dist loadgroup`` reads ``xdist_group`` marks by rewriting each item's node id,
which pytest 9 no longer lets it do: the marks are silently ignored and every test goes to any
worker, so a run started two Kubernetes planes and two Airflow stacks. Here the workers write
each test's group (:func:`group_of`) to a file the controller names, and the controller's
scheduler makes each group one unit of work, the largest first (xdist's ``loadscope`` reorder).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

GROUPS_ENV = "AIRFLOW_TF_TEST_GROUPS"
"""The file the workers write ``{node id: group}`` to; set by the controller before they start."""


def group_of(item, tests: Path) -> str | None:
    """The group a test must share a worker with: the whole of tests/stack (one Airflow stack),
    the whole of tests/k8s (one control plane; the node agent's tests make and count network
    namespaces and mounts, so two must never overlap), the tests of a file whose fixtures outlive
    one test (trained groups, emulators); else none."""
    path = Path(str(item.path)).resolve()
    for folder in ("stack", "k8s"):
        if path.is_relative_to(tests / folder):
            return folder
    if _uses_shared_fixtures(item):
        return path.as_posix()
    return None


def _uses_shared_fixtures(item) -> bool:
    """Whether a fixture of the test lives longer than the test but not the whole session."""
    definitions = getattr(item, "_fixtureinfo", None)
    if definitions is None:
        return True
    return any(defs[-1].scope in ("class", "module", "package") for defs in definitions.name2fixturedefs.values())


def name_groups_file() -> Path:
    """In the controller: a fresh file for the workers' groups, named in the environment they inherit."""
    handle, name = tempfile.mkstemp(prefix="airflow-tf-test-groups.", suffix=".json")
    os.close(handle)
    os.environ[GROUPS_ENV] = name
    return Path(name)


def write_groups(items, tests: Path) -> None:
    """In a worker: record each collected test's group (all workers collect the same tests)."""
    target = Path(os.environ[GROUPS_ENV])
    groups = {item.nodeid: group for item in items if (group := group_of(item, tests))}
    staged = target.with_name(f"{target.name}.{os.getpid()}")
    staged.write_text(json.dumps(groups))
    staged.replace(target)


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with the groups the workers recorded as scopes; a test of no group
    is a scope of its own, so it goes to whichever worker is free."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:  # read once all workers finished collecting
            self._groups = json.loads(Path(os.environ[GROUPS_ENV]).read_text() or "{}")
        return self._groups.get(nodeid, nodeid)
