"""Every package installed in the running environment is pinned, at its version, by the lock the
environment was built from.

pip's ``--constraint`` pins only the packages a lock lists: a dependency the lock does not name
(as mypy's ``ast_serialize`` was) installs at whatever version is newest that day, so two
environments from one lock could differ. scripts/bootstrap records the lock and extras it
installed in the environment (``.installed-with``); this test reads it, so each of CI's
environments (other Pythons, the oldest lock, the training image's extras) checks its own lock.
"""

from __future__ import annotations

import sys
from importlib.metadata import distributions
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
RECORD = Path(sys.prefix) / ".installed-with"  # written by scripts/bootstrap: "<lock> <extras>"
PROJECT = "airflow-tf"  # the editable install of this checkout, not a download


def lock_pins(lock: Path) -> dict[str, str]:
    pins = {}
    for line in lock.read_text().splitlines():
        name, _, version = line.partition("==")
        pins[canonicalize_name(name)] = version.strip()
    return pins


def unpinned(installed: dict[str, str], pins: dict[str, str]) -> list[str]:
    """One line per installed package the lock does not pin, or pins at another version."""
    problems = []
    for name, version in sorted(installed.items()):
        if name == PROJECT:
            continue
        if name not in pins:
            problems.append(f"{name}=={version} is installed but not pinned")
        elif pins[name] != version:
            problems.append(f"{name}=={version} is installed but the lock pins {pins[name]}")
    return problems


def test_the_check_names_a_missing_pin_and_another_version():
    installed = {"ast-serialize": "0.1.0", "mypy": "1.19.0", "ruff": "0.14.0", PROJECT: "0.1.0"}
    pins = {"mypy": "1.19.0", "ruff": "0.13.3"}
    assert unpinned(installed, pins) == ["ast-serialize==0.1.0 is installed but not pinned",
                                         "ruff==0.14.0 is installed but the lock pins 0.13.3"]


@pytest.mark.skipif(not RECORD.is_file(), reason=f"{sys.prefix} was not built by scripts/bootstrap (no {RECORD.name})")
def test_every_installed_package_is_pinned_by_the_lock_the_environment_was_built_from():
    lock = Path(RECORD.read_text().split()[0])
    assert lock.is_file(), f"{RECORD} names {lock}, which is not a file"
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in distributions()}
    assert PROJECT in installed and len(installed) > 20, sorted(installed)
    problems = unpinned(installed, lock_pins(lock))
    assert not problems, f"{sys.prefix} holds packages {lock.name} does not pin (add them to it):\n" + "\n".join(problems)
