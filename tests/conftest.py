"""Shared fixtures: a private state directory for local groups that checks no process of
them outlives the test, a small committed linear-regression dataset, and Airflow's metadata
database migrated once per run."""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path

import pytest
import xdist_groups
from processes import group_processes_of, kill_leftovers


TESTS = Path(__file__).resolve().parent
_GROUPS_FILE = pytest.StashKey[Path]()
_MEASURED: dict[str, float] = {}
"""Each test's seconds this run, where the reports arrive (the controller, or the one process
without -n); written out with ``--record-durations``."""


def pytest_configure(config):
    if not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist") and (
            config.getoption("dist") == "loadgroup" and config.getoption("numprocesses")):
        config.stash[_GROUPS_FILE] = xdist_groups.name_groups_file()


def pytest_addoption(parser):
    parser.addoption("--record-durations", metavar="FILE", default=None,
                     help="write each test's time (setup, call, teardown) into FILE, merged with what it holds; "
                          "tests/durations.json orders the units of a run with -n (tests/xdist_groups.py)")
    parser.addoption("--long", action="store_true", default=False,
                     help="run the long tier too: the tests marked long, left out otherwise (tests/README.md)")


def pytest_unconfigure(config):
    if (groups := config.stash.get(_GROUPS_FILE, None)) is not None:
        groups.unlink(missing_ok=True)


def pytest_runtest_logreport(report):
    _MEASURED[report.nodeid] = _MEASURED.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    target = session.config.getoption("record_durations")
    if target and _MEASURED and not hasattr(session.config, "workerinput"):
        xdist_groups.record_durations(Path(target), _MEASURED)


def _named(item, args: list[str]) -> bool:
    """Whether a ``path::name`` argument names this test (or its class)."""
    for arg in args:
        path, sep, rest = arg.partition("::")
        if sep and Path(path).resolve() == item.path and item.nodeid.split("::", 1)[1].startswith(rest):
            return True
    return False


def pytest_collection_modifyitems(config, items):
    """Tests marked ``long`` are left out (deselected, never skipped) unless ``--long`` is given,
    ``-m`` chooses by its own expression, or the test is named by its id. With ``-n``
    (pytest-xdist): tests sharing a costly fixture run on one worker (:mod:`xdist_groups`);
    every other test goes to whichever worker is free."""
    if not config.getoption("long") and not config.getoption("markexpr"):
        left_out = [item for item in items if item.get_closest_marker("long") and not _named(item, config.args)]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if item not in left_out]
    if hasattr(config, "workerinput") and xdist_groups.GROUPS_ENV in os.environ:
        xdist_groups.write_groups(items, TESTS)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    return xdist_groups.GroupScheduling(config, log) if config.getvalue("dist") == "loadgroup" else None


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


@pytest.fixture(scope="session")
def migrated_airflow_db(tmp_path_factory, worker_id):
    """``install(env)``: puts a migrated SQLite metadata database where ``env`` (from
    ``airflow_tf.demo.airflow_env``) has Airflow look for it, as ``init_airflow`` would. The
    database is migrated once per run, by the first worker that needs it, and copied from then on:
    each ``airflow db migrate`` of a fresh database costs seconds of CPU."""
    from airflow_tf.demo import airflow_env, init_airflow

    # The workers of one run share the parent of their base directories; one process has its own.
    shared = tmp_path_factory.getbasetemp()
    shared = shared if worker_id == "master" else shared.parent
    template = shared / "migrated-airflow" / "airflow.db"
    with open(shared / "migrated-airflow.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.exists():
            env = airflow_env(template.parent / "work")
            init_airflow(env)
            shutil.copy(Path(env["AIRFLOW_HOME"]) / "airflow.db", template.with_suffix(".tmp"))
            template.with_suffix(".tmp").rename(template)

    def install(env: dict[str, str]) -> None:
        home = Path(env["AIRFLOW_HOME"])
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{home / 'airflow.db'}", env
        home.mkdir(parents=True, exist_ok=True)
        shutil.copy(template, home / "airflow.db")

    return install
