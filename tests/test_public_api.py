"""The public API is a promise: every name the reference documents (docs/reference/operators.md) and every
name in a package's ``__all__`` imports, and no documented name or parameter of the Airflow-facing
API disappears without a deprecation period.

``tests/public_api.json`` records the documented names and their parameters. A name or parameter
missing from it here means a user's DAG breaks: keep the old one working with the project's
``AirflowTFDeprecationWarning`` for one minor release (see CHANGELOG.md). Record additions with
``python tests/test_public_api.py --write``."""

from __future__ import annotations

import importlib
import inspect
import json
import warnings
import re
import sys
from pathlib import Path

import pendulum
import pytest

from airflow_tf.deprecation import AirflowTFDeprecationWarning

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference" / "operators.md"
RECORDED = Path(__file__).with_name("public_api.json")
# The Airflow-facing packages; their __all__ is part of the recorded API.
RECORDED_PACKAGES = ["airflow_tf.operators", "airflow_tf.sensors", "airflow_tf.triggers"]
ALL_PACKAGES = [*RECORDED_PACKAGES, "airflow_tf.backends", "airflow_tf.cluster", "airflow_tf.cluster.model_code",
                "airflow_tf.data", "airflow_tf.serving", "airflow_tf.runtime.models"]


def documented_names() -> list[str]:
    """``package.module.Name`` of every ``::: ...`` entry of the reference."""
    return re.findall(r"^::: ([\w.]+)\s*$", REFERENCE.read_text(encoding="utf-8"), flags=re.M)


def resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def parameters(obj) -> list[str]:
    """The keyword parameters a user passes (an operator's own, without BaseOperator's)."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    return sorted(name for name, p in signature.parameters.items()
                  if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


def current_api() -> dict[str, list[str]]:
    names = set(documented_names())
    names |= {f"{package}.{name}" for package in RECORDED_PACKAGES
              for name in importlib.import_module(package).__all__}
    return {name: parameters(resolve(name)) for name in sorted(names)}


@pytest.mark.parametrize("dotted", documented_names())
def test_every_name_in_the_reference_imports(dotted):
    assert resolve(dotted) is not None


@pytest.mark.parametrize("package", ALL_PACKAGES)
def test_every_name_in_a_packages_all_imports(package):
    module = importlib.import_module(package)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{package}.__all__ lists names it does not have: {missing}"


def test_no_recorded_name_or_parameter_was_removed():
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))
    now = current_api()
    for name in set(recorded) - set(now):  # no longer documented: still importable, with its warning?
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                now[name] = parameters(resolve(name))
            except (ImportError, AttributeError):
                continue
        assert any(issubclass(w.category, AirflowTFDeprecationWarning) for w in caught), \
            f"{name} moved without the project's AirflowTFDeprecationWarning"
    gone = [name for name in recorded if name not in now]
    assert not gone, f"public names removed without a deprecation period: {gone}"
    lost = {name: sorted(set(params) - set(now[name])) for name, params in recorded.items()
            if set(params) - set(now[name])}
    assert not lost, f"public parameters removed without a deprecation period: {lost}"


def test_the_recording_is_up_to_date():
    """A new public name or parameter is recorded, so removing it later is caught."""
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))
    new = {name: sorted(set(params) - set(recorded.get(name, [])))
           for name, params in current_api().items() if set(params) - set(recorded.get(name, []))}
    assert not new, f"record them with `python tests/test_public_api.py --write`: {new}"


def _in_a_dag(make):
    """``make()`` inside a DAG that also has a launch task (the teardown's old form names it)."""
    from airflow.sdk import DAG

    from airflow_tf.operators import LaunchTFClusterOperator

    with DAG("deprecated_parameters", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        LaunchTFClusterOperator(task_id="launch", dataset="/data/ds", steps=10)
        return make()


def _teardown(**old):
    from airflow_tf.operators import TeardownTFClusterOperator

    return TeardownTFClusterOperator(task_id="teardown", **old)


def _callable(dotted: str):
    """A call of a recorded name with its required arguments and the deprecated ones given."""
    if dotted == "airflow_tf.operators.TeardownTFClusterOperator":
        return _teardown
    required = {"airflow_tf.operators.PrepareTFRecordsOperator": {"task_id": "t", "input": "/in.csv", "name": "ds"},
                "airflow_tf.operators.LaunchTFClusterOperator": {"task_id": "t2", "dataset": "/data/ds"},
                "airflow_tf.task_groups.tf_prepare": {"input": "/in/*.csv", "name": "ds"}}[dotted]
    return lambda **old: resolve(dotted)(**required, **old)


# Every deprecated parameter of a recorded name: (name, parameter, a value, what the warning says to use).
DEPRECATED_PARAMETERS = [
    ("airflow_tf.operators.PrepareTFRecordsOperator", "workers", 2, "encode_threads"),
    ("airflow_tf.operators.PrepareTFRecordsOperator", "target_shard_mb", 64, "target_shard_mib"),
    ("airflow_tf.task_groups.tf_prepare", "partitions", 3, "parts"),
    ("airflow_tf.task_groups.tf_prepare", "workers", 2, "encode_threads"),
    ("airflow_tf.operators.LaunchTFClusterOperator", "training", {"steps": 5}, "one parameter per option"),
    ("airflow_tf.operators.LaunchTFClusterOperator", "min_shard_bytes", 4096, "min_slice_bytes"),
    ("airflow_tf.operators.LaunchTFClusterOperator", "max_shard_bytes", 2**30, "max_slice_bytes"),
    ("airflow_tf.operators.TeardownTFClusterOperator", "launch_task_id", "launch", "launch="),
]


@pytest.mark.parametrize(("dotted", "parameter", "value", "replacement"), DEPRECATED_PARAMETERS,
                         ids=[f"{d.rsplit('.', 1)[1]}.{p}" for d, p, _, _ in DEPRECATED_PARAMETERS])
def test_a_deprecated_parameter_still_works_and_warns_with_the_projects_class_naming_its_replacement(
        dotted, parameter, value, replacement):
    call = _callable(dotted)
    resolve(dotted)  # imported first: Airflow's logging setup on import would take the warning over
    with pytest.warns(AirflowTFDeprecationWarning, match=rf"{parameter}\b.*deprecated.*use .*{re.escape(replacement)}"):
        _in_a_dag(lambda: call(**{parameter: value}))


def test_every_parameter_documented_as_deprecated_is_checked_above():
    """A parameter whose ``:param:`` line says it is deprecated is in DEPRECATED_PARAMETERS."""
    checked = {(d, p) for d, p, _, _ in DEPRECATED_PARAMETERS}
    documented = set()
    for dotted in current_api():
        doc = inspect.getdoc(resolve(dotted)) or ""
        documented |= {(dotted, p) for p in re.findall(r":param (\w+): deprecated", doc)}
    assert documented, "no deprecated parameter found: has the docstring form changed?"
    assert documented <= checked, f"deprecated parameters without a test above: {sorted(documented - checked)}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    # Names no longer documented stay recorded: their deprecation period is still checked.
    merged = {**json.loads(RECORDED.read_text(encoding="utf-8")), **current_api()}
    RECORDED.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n", encoding="utf-8")
