"""The suite's own scheduling (tests/xdist_groups.py): units of work start longest first by the
recorded times, so a long test is not left to run on alone at the end while the other worker idles."""

from __future__ import annotations

import json
from collections import OrderedDict

import xdist_groups


class _Worker:
    """What the scheduler asks of an xdist worker: run these tests (by their collection index)."""

    def __init__(self, collection: list[str]) -> None:
        self.collection, self.ran = collection, []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.ran.append([self.collection[i] for i in indexes])


def _scheduler(units: dict[str, list[str]], worker: _Worker) -> xdist_groups.GroupScheduling:
    # The queue as xdist's schedule() leaves it, before it hands out the first unit.
    scheduler = object.__new__(xdist_groups.GroupScheduling)
    scheduler._groups, scheduler._longest_first = {}, False
    scheduler.workqueue = OrderedDict((scope, dict.fromkeys(tests, False)) for scope, tests in units.items())
    scheduler.assigned_work, scheduler.registered_collections = {}, {worker: worker.collection}
    return scheduler


def test_units_start_longest_first_by_the_recorded_times_and_a_new_test_counts_one_second(tmp_path, monkeypatch):
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"t.py::quick": 0.5, "t.py::long": 400.0, "g.py::a": 30.0, "g.py::b": 40.0}))
    monkeypatch.setattr(xdist_groups, "DURATIONS", durations)
    units = {"t.py::quick": ["t.py::quick"], "g.py": ["g.py::a", "g.py::b"], "t.py::new": ["t.py::new"],
             "t.py::long": ["t.py::long"]}
    worker = _Worker([test for tests in units.values() for test in tests])
    scheduler = _scheduler(units, worker)
    for _ in units:
        scheduler._assign_work_unit(worker)
    assert worker.ran == [["t.py::long"], ["g.py::a", "g.py::b"], ["t.py::new"], ["t.py::quick"]]


def test_recorded_times_merge_into_the_file_and_a_missing_file_is_no_times(tmp_path):
    durations = tmp_path / "durations.json"
    assert xdist_groups.read_durations(durations) == {}
    xdist_groups.record_durations(durations, {"a.py::x": 1.26, "a.py::y": 2.0})
    xdist_groups.record_durations(durations, {"a.py::y": 3.04})
    assert xdist_groups.read_durations(durations) == {"a.py::x": 1.3, "a.py::y": 3.0}
    assert [p.name for p in tmp_path.iterdir()] == ["durations.json"], "no temporary file is left"


def test_each_planes_tests_share_one_worker_and_the_two_planes_may_run_side_by_side(tmp_path):
    """Every test on the control plane of tests/k8s shares one worker (one plane per run), every
    test on the plane of three nodes of tests/nodes another, whichever file holds it; the two
    are different units, so they may run side by side, and the compose test is in neither."""
    class Item:
        def __init__(self, path, fixturenames=()):
            self.path, self.fixturenames = path, fixturenames

    tests = tmp_path
    assert {xdist_groups.group_of(Item(tests / "k8s" / name, ("plane",)), tests) for name in (
        "test_kubernetes.py", "test_real_nodes.py", "test_kubernetes_logs.py")} == {"k8s-plane"}
    assert {xdist_groups.group_of(Item(tests / "nodes" / name, ("nodes_plane", "tmp_path")), tests) for name in (
        "test_machines.py", "test_nodes.py", "test_nodes_kueue.py")} == {"nodes-plane"}
    assert xdist_groups.group_of(Item(tests / "stack" / "test_compose_stack.py", ("tmp_path",)), tests) not in (
        "k8s-plane", "nodes-plane")
