"""Mistakes a person makes with scripts/postgres and scripts/stack get errors that say what to do."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from airflow_stack import AirflowStack, StackError  # scripts/ is on sys.path (conftest.py)

POSTGRES = str(Path(__file__).resolve().parents[2] / "scripts" / "postgres")


def test_postgres_refuses_a_port_that_is_not_a_number(tmp_path):
    done = subprocess.run([POSTGRES, "start", str(tmp_path / "db"), "80a"], capture_output=True, text=True)
    assert done.returncode != 0
    assert "PORT must be a number, got '80a'" in done.stderr


def test_postgres_url_of_a_directory_without_a_cluster_says_how_to_create_one(tmp_path):
    done = subprocess.run([POSTGRES, "url", str(tmp_path / "db")], capture_output=True, text=True)
    assert done.returncode != 0
    assert f"no cluster in {tmp_path / 'db'}; run 'scripts/postgres start {tmp_path / 'db'}' first" in done.stderr


def test_stack_names_a_missing_dags_folder_and_an_unknown_database(tmp_path):
    with pytest.raises(StackError, match=f"DAGs folder {tmp_path / 'nope'} does not exist"):
        AirflowStack(tmp_path / "home", tmp_path / "nope")
    with pytest.raises(StackError, match="database: 'mysql' is not one of auto, postgres, sqlite"):
        AirflowStack(tmp_path / "home", tmp_path, database="mysql")
