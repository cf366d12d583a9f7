"""The demo DAG run by a real Airflow against a plane, driven through its REST API, and the
progress its training writes in the storage folder: what the tests that fault a node or a pod
during a DAG run share."""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from airflow_tf.demo import REPO_DAGS, kubernetes_env

from k8s.plane import wait_for

sys.path.insert(0, str(REPO_DAGS.parent / "scripts"))
from airflow_stack import USERNAME, AirflowStack  # noqa: E402


class ScheduledRun:
    """The demo DAG triggered on a real Airflow (API server, scheduler, DAG processor,
    triggerer: ``scripts/airflow_stack.py``) whose deployment backend is the plane, driven
    through its REST API as a user's client would (each ``airflow`` CLI call would cost seconds
    of CPU that the training competes for)."""

    DAG = "tf_linear_regression"

    def __init__(self, home: Path, plane: Path, steps: int) -> None:
        # PostgreSQL runs as the 'postgres' user, which cannot enter pytest's private tmp dirs.
        self.postgres = Path(tempfile.mkdtemp(prefix="airflow-tf-pg-"))
        self.postgres.chmod(0o755)
        self.stack = AirflowStack(home, REPO_DAGS, postgres_dir=self.postgres / "data", env=kubernetes_env(plane),
                                  umask=0o002)
        self.conf = {"steps": steps, "rows": 5000}

    def call(self, method: str, path: str, expect: tuple[int, ...] = (200,), **kwargs):
        response = self.session.request(method, f"{self.stack.url}/api/v2{path}", timeout=60, **kwargs)
        assert response.status_code in expect, f"{method} /api/v2{path}: {response.status_code} {response.text[:2000]}"
        return response

    def trigger(self) -> str:
        import requests

        self.stack.start()
        token = requests.post(f"{self.stack.url}/auth/token", json={"username": USERNAME,
                              "password": self.stack.password}, timeout=60)
        assert token.status_code == 201, f"POST /auth/token: {token.status_code} {token.text}"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token.json()['access_token']}"
        wait_for(lambda: self.call("GET", f"/dags/{self.DAG}", expect=(200, 404)).status_code == 200, 300,
                 f"the DAG processor to parse {self.DAG}", interval=1)
        assert self.call("PATCH", f"/dags/{self.DAG}", json={"is_paused": False}).json()["is_paused"] is False
        run = self.call("POST", f"/dags/{self.DAG}/dagRuns", json={"logical_date": None, "conf": self.conf}).json()
        self.run_id = run["dag_run_id"]
        return self.run_id

    def state(self) -> str | None:
        state = self.call("GET", f"/dags/{self.DAG}/dagRuns/{self.run_id}").json()["state"]
        return state if state in ("success", "failed") else None

    def task_logs(self) -> str:
        return "\n".join(path.read_text(errors="replace") for path in sorted(
            (self.stack.home / "logs").rglob(f"run_id={self.run_id}/**/*.log")))

    def stop(self) -> None:
        self.stack.stop()
        shutil.rmtree(self.postgres, ignore_errors=True)


def progress(runs: Path, earlier: set[str]) -> dict:
    """The training's progress.json, with the step of its newest checkpoint (the run directories
    in ``earlier`` are other tests' trainings on the same plane)."""
    for run in runs.glob("tf-*"):
        if run.name in earlier:
            continue
        try:
            found = json.loads((run / "progress.json").read_text())
            newest = re.search(r'^model_checkpoint_path: "model\.ckpt-(\d+)"', (run / "checkpoint").read_text(), re.M)
        except (OSError, ValueError):  # not written yet, or being replaced
            continue
        return {**found, "checkpoint_step": int(newest.group(1)) if newest else None}
    return {}
