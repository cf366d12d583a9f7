"""The locks (constraints.txt, constraints/*.txt) agree with pyproject.toml and with CI.

Each lock pins every requirement pyproject.toml declares, exactly once, at versions its ranges
allow; together the locks cover every Airflow and TensorFlow minor release pyproject.toml
declares; constraints.txt (what ./scripts/test and ./scripts/demo install) is the newest; and
.ci/run installs every lock.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCKS = sorted((ROOT / "constraints").glob("airflow-*-tf-*.txt"))
NAMED = re.compile(r"airflow-(\d+\.\d+)-tf-(\d+\.\d+)\.txt")


def requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    declared = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(r) for r in declared if not Requirement(r).name.startswith("airflow-tf")]


def pins(lock: Path) -> dict[str, Version]:
    pinned: dict[str, Version] = {}
    for number, line in enumerate(lock.read_text().splitlines(), 1):
        name, sep, version = line.partition("==")
        assert sep and name and version and " " not in line, f"{lock.name}:{number}: not name==version: {line!r}"
        assert canonicalize_name(name) not in pinned, f"{lock.name}:{number}: {name} pinned twice"
        pinned[canonicalize_name(name)] = Version(version)
    return pinned


def minor(version: Version) -> str:
    return f"{version.major}.{version.minor}"


@pytest.mark.parametrize("lock", [ROOT / "constraints.txt", *LOCKS], ids=lambda p: p.name)
def test_a_lock_pins_every_declared_requirement_within_its_range(lock):
    pinned = pins(lock)
    lines = lock.read_text().splitlines()
    assert lines == sorted(lines, key=str.upper), f"{lock.name} is not sorted (LC_ALL=C sort -f)"
    for requirement in requirements():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{lock.name} does not pin {requirement.name} (pyproject.toml declares it)"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{lock.name} pins {requirement.name}=={pinned[name]}, outside pyproject.toml's {requirement}")


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_a_lock_holds_the_releases_its_name_says(lock):
    airflow, tensorflow = NAMED.fullmatch(lock.name).groups()
    pinned = pins(lock)
    assert (minor(pinned["apache-airflow"]), minor(pinned["tensorflow"])) == (airflow, tensorflow)
    assert minor(pinned["apache-airflow-core"]) == airflow


def test_the_locks_cover_every_declared_minor_release_and_the_root_lock_is_the_newest():
    specifiers = {canonicalize_name(r.name): r.specifier for r in requirements()}
    tested = {name: {minor(pins(lock)[name]) for lock in LOCKS} for name in ("apache-airflow", "tensorflow")}
    for name, candidates in (("apache-airflow", ["3.0", "3.1", "3.2", "3.3", "3.4"]),
                             ("tensorflow", ["2.18", "2.19", "2.20", "2.21", "2.22"])):
        declared = {c for c in candidates if specifiers[name].contains(Version(f"{c}.0"))}
        assert declared == tested[name], f"pyproject.toml declares {name} {sorted(declared)}, locks test {sorted(tested[name])}"
    newest = pins(ROOT / "constraints.txt")
    for name in ("apache-airflow", "tensorflow"):
        assert newest[name] == max(pins(lock)[name] for lock in LOCKS), f"constraints.txt has not the newest {name}"


# Locks CI leaves out for its time budget; tests/README.md gives the run that tested each.
TESTED_WHEN_MADE = ("airflow-3.2-tf-2.20.txt", "airflow-3.3-tf-2.19.txt")


def test_ci_installs_every_lock_but_those_tested_when_made():
    ci = "\n".join(line for line in (ROOT / ".ci" / "run").read_text().splitlines() if not line.lstrip().startswith("#"))
    readme = (ROOT / "tests" / "README.md").read_text()
    for lock in LOCKS:
        if lock.resolve() == (ROOT / "constraints.txt").resolve():
            continue  # the default of ./scripts/test
        if lock.name in TESTED_WHEN_MADE:
            assert f"constraints/{lock.name}" not in ci and lock.name in readme, lock.name
            continue
        assert f"constraints/{lock.name}" in ci, f".ci/run does not test {lock.name}"
    assert "constraints/airflow-3.1-tf-2.19.txt" in ci, "the oldest combination runs in CI"
