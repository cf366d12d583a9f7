"""DAG runs through Airflow itself: ``airflow dags test`` in a test-only AIRFLOW_HOME (SQLite)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_tf.demo import REPO_DAGS, airflow_env, dags_test, reserialize

TEST_DAGS = Path(__file__).parent / "dags"


class AirflowHome:
    def __init__(self, root: Path, install_db):
        self.root = root
        self.dags = root / "dags"
        self.dags.mkdir(parents=True)
        for source in (*REPO_DAGS.glob("*.py"), *TEST_DAGS.glob("*.py")):
            shutil.copy(source, self.dags / source.name)
        self.env = airflow_env(root, self.dags)
        install_db(self.env)
        reserialize(self.env)
        errors = subprocess.run([str(Path(sys.executable).with_name("airflow")), "dags", "list-import-errors"],
                                env=self.env, text=True, capture_output=True).stdout
        assert "Traceback" not in errors and "Error" not in errors, f"a DAG failed to import:\n{errors}"

    def run(self, dag_id: str, storage: Path, conf: str | None = None):
        """One DAG run with its own storage and group-state directories. DAG files read the
        storage path at parse time (asset URIs, paths); ``dags test`` writes the DAGs it parses
        under this run's environment to the database before the run."""
        env = dict(self.env, AIRFLOW_TF_STORAGE=str(storage / "storage"), AIRFLOW_TF_STATE_DIR=str(storage / "groups"))
        result = dags_test(env, dag_id, conf)
        (storage / f"{dag_id}.log").write_text(result.stdout)
        return result


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory, migrated_airflow_db) -> AirflowHome:
    return AirflowHome(tmp_path_factory.mktemp("airflow"), migrated_airflow_db)
