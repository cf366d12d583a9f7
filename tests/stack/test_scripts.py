"""Mistakes a person makes with scripts/postgres and scripts/stack get errors that say what to do."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from airflow_stack import RESTART_LIMIT, AirflowStack, StackError  # scripts/ is on sys.path (conftest.py)

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


def test_a_component_that_keeps_dying_is_restarted_without_its_leftovers_then_given_up(tmp_path):
    """The supervision of scripts/stack with a stand-in for the `airflow` command (a real one
    takes a minute to start each time): it leaves a child behind in its session, as a killed
    scheduler leaves its LocalExecutor workers, and exits with 3."""
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "airflow").write_text('#!/bin/bash\nsleep 300 &\necho $! >> "$PWD/children"\nexit 3\n')
    (venv_bin / "airflow").chmod(0o755)
    stack = AirflowStack(tmp_path / "home", tmp_path, venv=tmp_path / "venv")
    (stack.home / "logs").mkdir(parents=True)
    stack._env = {"PATH": os.environ["PATH"]}
    children = stack.home / "children"

    def left_behind() -> list[int]:
        pids = [int(p) for p in children.read_text().split()] if children.exists() else []
        return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

    first = stack._spawn("scheduler")
    try:
        for restart in range(1, RESTART_LIMIT + 1):
            stack.processes["scheduler"].wait(30)
            while not left_behind():  # the child has written its pid
                time.sleep(0.05)
            old, leftovers = stack.processes["scheduler"].pid, left_behind()
            (line,) = stack.restart_exited()
            assert line == f"airflow scheduler (pid {old}) exited with 3; restarted it as pid {stack.processes['scheduler'].pid}"
            alive = [p for p in leftovers if p in left_behind()]
            assert not alive, "what the dead one left in its session was killed before the restart"
        stack.processes["scheduler"].wait(30)
        with pytest.raises(StackError, match=rf"airflow scheduler exited with 3, the {RESTART_LIMIT + 1}th time within 10 minutes; not restarting it again"):
            stack.restart_exited()
    finally:
        stack.stop()
    assert first.returncode == 3 and not left_behind(), "stop() ended the last one's leftovers too"


BOOTSTRAP = str(Path(__file__).resolve().parents[2] / "scripts" / "bootstrap")
OLD_PYTHON = next(iter(sorted(Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")).glob("versions/3.10.*/bin/python3.10"))), None)


@pytest.mark.parametrize("interpreter", [
    pytest.param("/bin/false", id="not-python"),
    pytest.param(str(OLD_PYTHON), id="python-3.10", marks=pytest.mark.skipif(
        OLD_PYTHON is None, reason="no Python 3.10 on this machine to try an unsupported version with")),
])
def test_bootstrap_refuses_an_unsupported_interpreter_before_touching_the_environment(tmp_path, interpreter):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "kept").write_text("the user's environment")
    done = subprocess.run([BOOTSTRAP], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AIRFLOW_TF_PYTHON": interpreter, "AIRFLOW_TF_VENV": str(venv)})
    assert done.returncode == 2
    assert f"no supported Python at '{interpreter}'; set AIRFLOW_TF_PYTHON" in done.stderr
    if "3.10" in interpreter:
        assert "is not supported: pyproject.toml requires >=3.11," in done.stderr
    assert [p.name for p in venv.iterdir()] == ["kept"], "the environment was left as it was"


@pytest.mark.parametrize("variable, value, message", [
    ("AIRFLOW_TF_CONSTRAINTS", "constraints/airflow-3.0-tf-2.18.txt",
     "AIRFLOW_TF_CONSTRAINTS=constraints/airflow-3.0-tf-2.18.txt is not a file; the tested locks are constraints.txt and"),
    ("AIRFLOW_TF_EXTRAS", "tensorflow,test] ; rm -rf x",
     "AIRFLOW_TF_EXTRAS='tensorflow,test] ; rm -rf x' is not a comma-separated list of pyproject.toml's extras"),
])
def test_bootstrap_refuses_a_missing_lock_or_bad_extras_before_touching_the_environment(tmp_path, variable, value,
                                                                                        message):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "kept").write_text("the user's environment")
    done = subprocess.run([BOOTSTRAP], capture_output=True, text=True, timeout=60,
                          env={**os.environ, variable: value, "AIRFLOW_TF_VENV": str(venv)})
    assert done.returncode == 2
    assert message in done.stderr
    assert [p.name for p in venv.iterdir()] == ["kept"], "the environment was left as it was"
