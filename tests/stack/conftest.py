"""The real Airflow stack for these tests: API server, scheduler, DAG processor and triggerer
(LocalExecutor) on loopback, on a private PostgreSQL from Debian, started once per session by
the same code as ``scripts/stack``. DAGs are driven the way users drive them: REST API v2
with a token from ``POST /auth/token``, schedules, and the web UI in Chromium."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import psutil
import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from airflow_stack import USERNAME, AirflowStack  # noqa: E402

TEST_DAGS = Path(__file__).parent / "dags"
TERMINAL = ("success", "failed")


class AirflowAPI:
    """A small client of Airflow's REST API v2, authenticated as the simple auth manager's user."""

    def __init__(self, url: str, username: str, password: str) -> None:
        self.url = url
        response = requests.post(f"{url}/auth/token", json={"username": username, "password": password}, timeout=30)
        assert response.status_code == 201, f"POST /auth/token: {response.status_code} {response.text}"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {response.json()['access_token']}"

    def call(self, method: str, path: str, expect: tuple[int, ...] = (200,), **kwargs):
        response = self.session.request(method, f"{self.url}/api/v2{path}", timeout=30, **kwargs)
        assert response.status_code in expect, f"{method} /api/v2{path}: {response.status_code} {response.text[:2000]}"
        return response.json() if response.content else None

    def wait_for_dag(self, dag_id: str, timeout: float = 120.0) -> dict:
        """The DAG once the DAG processor has parsed it; an import error fails at once, quoted."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            response = self.session.get(f"{self.url}/api/v2/dags/{dag_id}", timeout=30)
            if response.status_code == 200:
                return response.json()
            errors = self.call("GET", "/importErrors")["import_errors"]
            if errors:
                quoted = "\n".join(f"{e['filename']}:\n{e['stack_trace']}" for e in errors)
                raise AssertionError(f"DAG files failed to import:\n{quoted}")
            time.sleep(1)
        raise AssertionError(f"DAG {dag_id} was not parsed within {timeout:.0f}s")

    def unpause(self, dag_id: str) -> None:
        assert self.call("PATCH", f"/dags/{dag_id}", json={"is_paused": False})["is_paused"] is False

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        run = self.call("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf or {}})
        return run["dag_run_id"]

    def runs(self, dag_id: str) -> list[dict]:
        return self.call("GET", f"/dags/{dag_id}/dagRuns", params={"order_by": "-run_after"})["dag_runs"]

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        tis = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti for ti in tis}

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float, seen: dict[str, set] | None = None) -> dict:
        """Polls the run until it ends; ``seen`` collects every state each task was found in."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
            if seen is not None:
                for task_id, ti in self.task_instances(dag_id, run_id).items():
                    seen.setdefault(task_id, set()).add(ti["state"])
            if run["state"] in TERMINAL:
                return run
            if time.monotonic() > deadline:
                raise AssertionError(f"{dag_id} run {run_id} still {run['state']} after {timeout:.0f}s")
            time.sleep(0.5)

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        """The task's log as the UI shows it (task process and triggerer), one event per line."""
        content = self.call(
            "GET",
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
            headers={"Accept": "application/json"},
        )["content"]
        return "\n".join(str(line.get("event", "")) if isinstance(line, dict) else str(line) for line in content)

    def failure_report(self, dag_id: str, run_id: str) -> str:
        """States of every task and the log of each one that did not succeed, for assertion messages."""
        lines = []
        for task_id, ti in self.task_instances(dag_id, run_id).items():
            lines.append(f"{task_id}: {ti['state']}")
            if ti["state"] not in ("success", "skipped") and ti["try_number"]:
                log = self.task_log(dag_id, run_id, task_id, ti["try_number"])
                lines.append("\n".join(log.splitlines()[-40:]))
        return "\n".join(lines)


class Stack:
    """The running stack, its REST client, and where its DAGs keep data and training groups."""

    def __init__(self, airflow: AirflowStack, storage: Path, state_dir: Path, artifacts: Path) -> None:
        self.airflow = airflow
        self.storage = storage
        self.state_dir = state_dir
        self.artifacts = artifacts
        self.api = AirflowAPI(airflow.url, USERNAME, airflow.password)


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Stack:
    root = tmp_path_factory.mktemp("stack")
    dags = root / "dags"
    dags.mkdir()
    for source in (*(ROOT / "dags").glob("*.py"), *TEST_DAGS.glob("*.py")):
        (dags / source.name).symlink_to(source)
    storage, state_dir = root / "storage", root / "groups"
    # PostgreSQL runs as the 'postgres' user, which cannot enter pytest's private tmp dirs.
    pg_parent = Path(tempfile.mkdtemp(prefix="airflow-tf-pg-"))
    pg_parent.chmod(0o755)
    airflow = AirflowStack(
        root / "airflow",
        dags,
        postgres_dir=pg_parent / "data",
        env={"AIRFLOW_TF_STORAGE": str(storage), "AIRFLOW_TF_STATE_DIR": str(state_dir)},
    )
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    try:
        airflow.start()
        (artifacts / "stack-database.txt").write_text(airflow.database + "\n")
        if airflow.database != "postgres":
            warnings.warn(f"PostgreSQL could not serve: the Airflow stack runs on {airflow.database}")
        running = Stack(airflow, storage, state_dir, artifacts)
        yield running
        # An open keep-alive connection would hold the API server's graceful shutdown.
        running.api.session.close()
    finally:
        airflow.stop()
        for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
            log = airflow.home / "logs" / f"{component}.log"
            if log.exists():
                shutil.copy(log, artifacts / f"stack-{component}.log")
        shutil.rmtree(pg_parent, ignore_errors=True)


def training_processes(state_dir: Path) -> list[psutil.Process]:
    """Live processes of training groups (runtime tasks, supervisors) launched into ``state_dir``.
    Airflow's own processes carry the same AIRFLOW_TF_STATE_DIR, so the command line decides."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            environ = proc.info["environ"] or {}
        except (psutil.Error, TypeError):
            continue
        if (
            proc.info["status"] != psutil.STATUS_ZOMBIE
            and ("airflow_tf.runtime" in cmdline or "airflow_tf.backends.local_supervisor" in cmdline)
            and environ.get("AIRFLOW_TF_STATE_DIR") == str(state_dir)
        ):
            found.append(proc)
    return found


@pytest.fixture(autouse=True)
def no_training_left(request):
    """After each test, no process of a training group started by the stack may be running."""
    yield
    if "stack" not in request.fixturenames:
        return
    state_dir = request.getfixturevalue("stack").state_dir
    deadline = time.monotonic() + 5.0
    while (left := training_processes(state_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    described = [f"{p.pid}: {' '.join(p.info['cmdline'])[:160]}" for p in left]
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    assert not left, "training processes left running after the test:\n" + "\n".join(described)
