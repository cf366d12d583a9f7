"""DAG runs through Airflow itself: ``airflow dags test`` in a test-only AIRFLOW_HOME (SQLite)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from airflow_tf.demo import REPO_DAGS, airflow_env, dags_test, init_airflow

TEST_DAGS = Path(__file__).parent / "dags"


class AirflowHome:
    def __init__(self, root: Path):
        self.root = root
        self.dags = root / "dags"
        self.dags.mkdir(parents=True)
        for source in (*REPO_DAGS.glob("*.py"), *TEST_DAGS.glob("*.py")):
            shutil.copy(source, self.dags / source.name)
        self.env = airflow_env(root, self.dags)
        init_airflow(self.env)

    def run(self, dag_id: str, storage: Path, conf: str | None = None):
        """One DAG run with its own storage and group-state directories."""
        env = dict(self.env, AIRFLOW_TF_STORAGE=str(storage / "storage"), AIRFLOW_TF_STATE_DIR=str(storage / "groups"))
        result = dags_test(env, dag_id, conf)
        (storage / f"{dag_id}.log").write_text(result.stdout)
        return result


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory) -> AirflowHome:
    return AirflowHome(tmp_path_factory.mktemp("airflow"))


def run_state(output: str) -> str:
    """The final DagRun state as Airflow logged it."""
    for line in reversed(output.splitlines()):
        if "DagRun Finished" in line:
            return line.split("state=")[1].split(",")[0]
    raise AssertionError("no 'DagRun Finished' line in the dags test output:\n" + output[-3000:])


def run_id_of(output: str) -> str:
    for line in reversed(output.splitlines()):
        if "DagRun Finished" in line:
            return line.split("run_id=")[1].split(",")[0]
    raise AssertionError("no 'DagRun Finished' line in the dags test output:\n" + output[-3000:])


def task_states(home: AirflowHome, dag_id: str, output: str) -> dict[str, str]:
    """task_id -> final state, read back from Airflow's metadata database."""
    import json
    import subprocess
    import sys

    airflow = str(Path(sys.executable).with_name("airflow"))
    result = subprocess.run(
        [airflow, "tasks", "states-for-dag-run", dag_id, run_id_of(output), "--output", "json"],
        env=home.env, check=True, text=True, capture_output=True,
    )
    rows = json.loads(result.stdout[result.stdout.index("["):])
    return {row["task_id"]: row["state"] for row in rows}
