"""airflow_tf.compat on the Airflow installed in this environment.

CI runs this file on Airflow 3.1 and 3.3 (and 3.2 where its lock is installed): each feature is
present exactly from the release that introduced it, and where it is absent asking for it gives
one clear error naming the release needed and the one installed. The tests that pretend to be an
older Airflow replace only the version number the module reads from the package metadata.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from types import SimpleNamespace

import airflow
import pytest

from airflow_tf import compat

INSTALLED = tuple(int(part) for part in airflow.__version__.split(".")[:2])


@pytest.fixture
def pretend_airflow(monkeypatch):
    """``pretend_airflow(3, 1, 8)``: compat reads that version instead of the installed one."""
    def pretend(*version: int) -> None:
        compat._probe.cache_clear()
        monkeypatch.setattr(compat, "airflow_version", lambda: tuple(version))

    yield pretend
    compat._probe.cache_clear()


def test_the_version_is_the_installed_airflow():
    assert compat.airflow_version()[:2] == INSTALLED
    assert ".".join(map(str, compat.airflow_version())) == importlib.metadata.version("apache-airflow-core")


@pytest.mark.parametrize("name", sorted(compat.FEATURES))
def test_a_feature_is_there_exactly_from_its_release(name):
    feature = compat.FEATURES[name]
    expected = INSTALLED >= feature.since
    assert compat.has(name) is expected
    assert getattr(compat, f"has_{name}")() is expected
    if expected:
        module = compat.require(name, "this test")
        assert module.__name__ == feature.module
        assert compat.missing(name) is None
    else:
        with pytest.raises(compat.AirflowFeatureUnavailable) as refused:
            compat.require(name, "Durable re-attach")
        message = str(refused.value)
        since = ".".join(map(str, feature.since))
        assert message.startswith(f"Durable re-attach needs Airflow {since} or newer")
        assert f"this is Airflow {airflow.__version__}" in message
        assert feature.install in message


def test_the_features_of_airflow_3_3_are_where_compat_looks():
    """On the newest Airflow the probes find the real things users will touch."""
    if INSTALLED < (3, 3):
        pytest.skip(f"Airflow {airflow.__version__}: the 3.3 features are absent (the test above checks the refusal)")
    from airflow.sdk import Context

    hitl = compat.require("hitl")
    assert {"ApprovalOperator", "HITLOperator", "HITLBranchOperator", "HITLEntryOperator"} <= set(dir(hitl))
    assert compat.require("asset_partitions").PartitionedAssetTimetable.__name__ == "PartitionedAssetTimetable"
    assert {"partition_key", "task_state_store"} <= set(Context.__annotations__)


def test_an_older_airflow_gets_a_refusal_naming_both_versions(pretend_airflow):
    pretend_airflow(3, 1, 8)
    assert compat.has_hitl() is (INSTALLED >= (3, 1))
    assert not compat.has_asset_partitions() and not compat.has_task_state_store()
    with pytest.raises(compat.AirflowFeatureUnavailable, match=r"^Partitioned retraining needs Airflow 3\.2 or newer"
                       r" \(asset partitions, airflow\.sdk\); this is Airflow 3\.1\.8: "
                       r"install apache-airflow>=3\.2$"):
        compat.require("asset_partitions", "Partitioned retraining")
    assert compat.missing("task_state_store") == (
        "The task state store (durable execution) needs Airflow 3.3 or newer (the task state store (durable "
        "execution), airflow.sdk); this is Airflow 3.1.8: install apache-airflow>=3.3")


def test_without_airflow_nothing_is_available_and_the_message_says_so(pretend_airflow, monkeypatch):
    compat._probe.cache_clear()
    monkeypatch.setattr(compat, "airflow_version", lambda: None)
    assert not any(compat.has(name) for name in compat.FEATURES)
    with pytest.raises(compat.AirflowFeatureUnavailable, match="Airflow is not installed"):
        compat.require("hitl", "Approval before export")


def test_context_values_of_a_newer_airflow_are_none_on_an_older_one(pretend_airflow):
    # A task context is a mapping; this one stands for what Airflow 3.3 passes to execute().
    store = object()
    context = {"task_state_store": store, "partition_key": "2026-11-23"}
    assert compat.task_state_store(context) is (store if INSTALLED >= (3, 3) else None)
    assert compat.partition_key(context) == ("2026-11-23" if INSTALLED >= (3, 2) else None)
    assert compat.partition_key({}) is None
    on_the_run = {"dag_run": SimpleNamespace(partition_key="2026-11-22")}  # where Airflow 3.2 keeps it
    assert compat.partition_key(on_the_run) == ("2026-11-22" if INSTALLED >= (3, 2) else None)
    pretend_airflow(3, 1, 8)
    assert compat.task_state_store(context) is None and compat.partition_key(context) is None


def test_an_unknown_feature_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown feature 'task_state'; known: hitl, asset_partitions, task_state_store"):
        compat.has("task_state")


def test_importing_compat_and_reading_the_version_loads_neither_airflow_nor_tensorflow():
    code = ("import json, sys; from airflow_tf import compat; compat.airflow_version(); "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'airflow', 'tensorflow', 'keras'})))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(run.stdout) == []


@pytest.mark.parametrize("installed, read", [("3.2.0rc1", (3, 2, 0)), ("3.1.8", (3, 1, 8)), ("3.3", (3, 3, 0))])
def test_a_release_candidate_reads_as_its_release(monkeypatch, installed, read):
    monkeypatch.setattr(compat.metadata, "version", lambda distribution: installed)
    compat.airflow_version.cache_clear()
    try:
        assert compat.airflow_version() == read
    finally:
        compat.airflow_version.cache_clear()


def test_no_module_imports_exceptions_from_airflow_sdk_exceptions():
    # On Airflow 3.1 airflow.sdk.exceptions lacks AirflowFailException and friends: the package,
    # its example DAGs and the tests take them from airflow.providers.common.compat.sdk, which
    # has them on every supported release. A file that does not fails to import on 3.1 only.
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    offenders = [str(path.relative_to(root)) for folder in ("airflow_tf", "dags", "tests")
                 for path in (root / folder).rglob("*.py")
                 if "from airflow.sdk.exceptions import" in path.read_text(encoding="utf-8")
                 and path != Path(__file__).resolve()]
    assert not offenders, f"import these exceptions from airflow.providers.common.compat.sdk in: {offenders}"
