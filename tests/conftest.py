"""Shared fixtures: a private state directory for local groups that checks no process of
them outlives the test, and a small committed linear-regression dataset."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from processes import group_processes_of, kill_leftovers


TESTS = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups
def pytest_collection_modifyitems(items):
    """With ``-n`` (pytest-xdist, ``--dist loadgroup``): a test that uses a module's fixtures
    (trained groups, emulators) runs on the worker that runs the rest of its file, so they are
    built once; the whole of tests/stack runs on one worker, sharing the session's one Airflow
    stack; every test on the Kubernetes control plane (tests/backends/conftest.py) runs on one
    worker, so a run starts one plane. Every other test goes to whichever worker is free."""
    for item in items:
        path = Path(str(item.path)).resolve()
        if path.is_relative_to(TESTS / "stack"):
            item.add_marker(pytest.mark.xdist_group("stack"))
        elif "plane" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("kubernetes-plane"))
        elif _uses_shared_fixtures(item):
            item.add_marker(pytest.mark.xdist_group(path.as_posix()))


def _uses_shared_fixtures(item) -> bool:
    """Whether a fixture of the test lives longer than the test but not the whole session."""
    definitions = getattr(item, "_fixtureinfo", None)
    if definitions is None:
        return True
    return any(defs[-1].scope in ("class", "module", "package") for defs in definitions.name2fixturedefs.values())


def _wait_until(predicate, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def group_processes():
    """``group_processes(state_dir)``: pids of the live processes of the groups in ``state_dir``."""
    return group_processes_of


@pytest.fixture
def wait_until():
    """``wait_until(predicate, timeout, what=...)``: the predicate's first truthy value, or fail."""
    return _wait_until


@pytest.fixture
def local_state_dir(tmp_path, monkeypatch):
    """A fresh ``AIRFLOW_TF_STATE_DIR``; after the test, no process of its groups may be left."""
    state_dir = (tmp_path / "groups").resolve()
    monkeypatch.setenv("AIRFLOW_TF_STATE_DIR", str(state_dir))
    yield state_dir
    left = kill_leftovers(state_dir)
    assert not left, f"processes left running after the test: {left}"


@pytest.fixture(scope="session")
def linear_dataset(tmp_path_factory) -> str:
    """The seed's y = 2x + 10 + noise as a committed TFRecord dataset; returns its URI."""
    from airflow_tf.data import prepare_dataset
    from airflow_tf.data.samples import write_linear_regression_csv

    root = tmp_path_factory.mktemp("linear")
    csv = write_linear_regression_csv(root / "linear.csv", rows=2000, seed=1)
    summary = prepare_dataset(csv, root / "datasets", name="linear", label="y", shards=4)
    return summary["dataset_uri"]
