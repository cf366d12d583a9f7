"""The long tier: tests marked ``long`` are left out of ``./scripts/test`` unless asked for, and are
reported as deselected, never as passed or skipped."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOAD = "tests/airflow/test_load.py"
LONG_TEST = f"{LOAD}::test_four_dag_runs_at_once_all_finish_without_collisions_each_serving_its_model"


def collect(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *args],
                            cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode in (0, 5), result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_a_long_test_runs_only_when_asked_for():
    assert LONG_TEST not in collect(LOAD)
    assert "1 deselected" in collect(LOAD)
    assert LONG_TEST in collect("--long", LOAD)
    assert LONG_TEST in collect("-m", "long", LOAD)
    assert LONG_TEST in collect(LONG_TEST), "a test named by its id runs"


def test_every_long_test_is_slow_so_the_quick_tier_never_holds_one():
    assert "no tests collected" in collect("-m", "long and not slow", "tests")
