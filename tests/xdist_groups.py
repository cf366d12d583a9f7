"""Keeping tests that share a costly fixture on one pytest-xdist worker.

pytest-xdist's ``--dist loadgroup`` reads ``xdist_group`` marks by rewriting each item's node id,
which pytest 9.2 no longer lets it do: the marks are silently ignored and every test goes to any
worker, so a run started two Kubernetes planes and two Airflow stacks (pytest-xdist issue #1386,
with pytest-xdist 3.8.0, the pinned one; its fix, pull request #1388, was not released by
2026-11). This works around it by overriding two private methods of xdist's
``LoadScopeScheduling`` (``_assign_work_unit``, ``_split_scope``), which a release of xdist may
rename: ``tests/test_xdist_groups.py`` would then fail. Once a release carrying #1386's fix is
pinned, the groups can be ``xdist_group`` marks again and the longest-first order is all that
stays here. Here the workers write
each test's group (:func:`group_of`) to a file the controller names, and the controller's
scheduler makes each group one unit of work. Units start longest first, by the times a run of the
suite recorded in ``tests/durations.json`` (``./scripts/test --record-durations
tests/durations.json`` refreshes it): a long test started last would run on alone while the other
worker idles.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

from airflow_tf.files import read_json, write_json

GROUPS_ENV = "AIRFLOW_TF_TEST_GROUPS"
"""The file the workers write ``{node id: group}`` to; set by the controller before they start."""
DURATIONS = Path(__file__).with_name("durations.json")
"""``{node id: seconds}`` of a whole run of the suite: each test's setup, call and teardown."""
UNKNOWN_SECONDS = 1.0
"""What a test not in :data:`DURATIONS` (a new one) is taken to cost: most tests are quick."""


SHARED_PER_FOLDER = {"stack": "stack", "k8s": "plane", "nodes": "nodes_plane"}
"""The folders whose package-scoped fixture is started once per worker that asks for it: one
Airflow stack (tests/stack), one control plane (tests/k8s) and one plane of three real nodes
(tests/nodes) per run when its tests share a worker."""
GROUP_OF_FOLDER = {"stack": "stack", "k8s": "k8s-plane", "nodes": "nodes-plane"}
"""The group of each of those folders' tests. The two planes may run side by side: their nodes
live in network namespaces of their own and leave the host's IPv4 forwarding alone, the sysctls
their kubelets change are recorded once for all planes (``scripts/kube``), and each plane's
check that ``down`` left nothing counts only its own links, cgroups, processes and mounts."""


def group_of(item, tests: Path) -> str | None:
    """The group a test must share a worker with: the tests of tests/stack on its Airflow stack,
    those of tests/k8s on its control plane and those of tests/nodes on their plane of three
    nodes (:data:`SHARED_PER_FOLDER`), and the tests of a file whose fixtures outlive one test
    (trained groups, the multi-team stack); else none."""
    path = Path(str(item.path)).resolve()
    for folder, fixture in SHARED_PER_FOLDER.items():
        if path.is_relative_to(tests / folder) and fixture in getattr(item, "fixturenames", ()):
            return GROUP_OF_FOLDER[folder]
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


def read_durations(path: Path) -> dict[str, float]:
    """The recorded times, or none when the file is missing (every unit then costs its test count)."""
    return read_json(path, missing_ok=True) or {}


def record_durations(path: Path, measured: dict[str, float]) -> None:
    """Merge this run's times into ``path`` (tests it did not run keep theirs), written whole or not at all."""
    write_json(path, {**read_durations(path), **{test: round(seconds, 1) for test, seconds in measured.items()}},
               fsync=False)


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with the groups the workers recorded as scopes; a test of no group
    is a scope of its own, so it goes to whichever worker is free."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self._groups: dict[str, str] | None = None
        self._longest_first = False

    def _assign_work_unit(self, node) -> None:
        if not self._longest_first:  # the queue is whole before its first unit is handed out
            durations = read_durations(DURATIONS)
            cost = {scope: sum(durations.get(test, UNKNOWN_SECONDS) for test in unit)
                    for scope, unit in self.workqueue.items()}
            for scope in sorted(self.workqueue, key=lambda scope: -cost[scope]):
                self.workqueue.move_to_end(scope)
            self._longest_first = True
        super()._assign_work_unit(node)

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:  # read once all workers finished collecting
            self._groups = json.loads(Path(os.environ[GROUPS_ENV]).read_text() or "{}")
        return self._groups.get(nodeid, nodeid)
