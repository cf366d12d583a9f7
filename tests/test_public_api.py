"""The public API is a promise: every name the reference documents (docs/reference/operators.md) and every
name in a package's ``__all__`` imports, and no documented name or parameter of the Airflow-facing
API disappears without a deprecation period.

``tests/public_api.json`` records the documented names and their parameters. A name or parameter
missing from it here means a user's DAG breaks: keep the old one working with a
``DeprecationWarning`` for one minor release (see CHANGELOG.md). Record additions with
``python tests/test_public_api.py --write``."""

from __future__ import annotations

import importlib
import inspect
import json
import warnings
import re
import sys
from pathlib import Path

import pytest

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
        assert any(issubclass(w.category, DeprecationWarning) for w in caught), f"{name} moved without a warning"
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


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    RECORDED.write_text(json.dumps(current_api(), indent=1) + "\n", encoding="utf-8")
