"""docker-compose.yml brought up for real: Podman and podman-compose (no Docker engine here) run the
file as it is, from the images scripts/images built (docs/how-to/develop.md: which public bases
are stand-ins), the demo DAG runs through it to a blessed export, and `down -v` leaves nothing.

Podman's network stack turns IPv4 forwarding on and leaves its firewall chains when the last
network goes: the test puts both back as it found them. One difference from Docker Compose is bridged by an override file, as docs/how-to/deploy.md tells
Podman users: podman-compose passes `pid: service:airflow-scheduler` to podman as it is, which
podman refuses, so the triggerer is given the scheduler's container by name."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import containers
import pytest
import requests
from airflow_stack import free_port
from stack.conftest import USERNAME, AirflowAPI
from test_compose import COMPOSE_FILE, created_env

DAG_ID = "tf_linear_regression"
UP_TIMEOUT = 900.0  # first start of five Airflow containers on two cores, migrations included
RUN_TIMEOUT = 1200.0


class Compose:
    """podman-compose on the repository's docker-compose.yml, as a project of this test's own."""

    def __init__(self, workdir: Path, project: str) -> None:
        self.project = project
        self.override = workdir / "podman-override.yml"
        self.override.write_text(
            "services:\n  airflow-triggerer:\n"
            f"    pid: container:{self.container('airflow-scheduler')}\n")
        self.env_file = workdir / ".env"
        self.env = {**os.environ, **containers.store_env()}

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"  # podman-compose's naming

    def __call__(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        command = [str(Path(sys.executable).with_name("podman-compose")), "--project-name", self.project,
                   "--env-file", str(self.env_file), "-f", str(COMPOSE_FILE), "-f", str(self.override), *args]
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)

    def owned(self, kind: str) -> list[str]:
        """This project's containers, pods, volumes or networks still known to Podman."""
        label = f"label=io.podman.compose.project={self.project}"
        listing = {
            "containers": ("ps", "--all", "--format", "{{.Names}}", "--filter", label),
            "pods": ("pod", "ps", "--format", "{{.Name}}", "--filter", f"name=pod_{self.project}"),
            "volumes": ("volume", "ls", "--format", "{{.Name}}", "--filter", label),
            "networks": ("network", "ls", "--format", "{{.Name}}", "--filter", f"name={self.project}"),
        }[kind]
        return containers.podman(*listing).stdout.split()


def wait_for_health(url: str, compose: Compose) -> None:
    deadline = time.monotonic() + UP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/api/v2/monitor/health", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(2)
    raise AssertionError(f"the API server did not answer within {UP_TIMEOUT:.0f}s:\n"
                         f"{compose('logs', '--tail', '40').stdout[-6000:]}")


def login_password(compose: Compose) -> str:
    """The generated password, found as docs/how-to/deploy.md says: in the API server's log."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = compose("logs", "airflow-apiserver")
        for line in (logs.stdout + logs.stderr).splitlines():
            if "Password for user" in line:
                return line.rsplit(":", 1)[1].strip()
        time.sleep(2)
    raise AssertionError("the API server logged no 'Password for user' line")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_compose_runs_the_demo_dag_to_a_blessed_export_and_down_leaves_nothing(tmp_path):
    containers.built("airflow-tensorflow", "postgres")
    created_env(tmp_path)
    port = free_port()
    with open(tmp_path / ".env", "a") as env_file:  # another port than a user's own 8080
        env_file.write(f"AIRFLOW_UI_PORT={port}\n")
    compose = Compose(tmp_path, f"airflowtf{containers.new_label()}")
    merged_dirs: list[str] = []
    host_network = containers.HostNetwork()
    try:
        up = compose("up", "--detach", "--no-build", timeout=UP_TIMEOUT)
        assert up.returncode == 0, f"podman-compose up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
        for name in compose.owned("containers"):
            merged = containers.podman("inspect", "--format", "{{.GraphDriver.Data.MergedDir}}", name, check=False)
            merged_dirs += merged.stdout.split()
        url = f"http://127.0.0.1:{port}"
        wait_for_health(url, compose)
        api = AirflowAPI(url, USERNAME, login_password(compose))
        api.wait_for_dag(DAG_ID, timeout=300)
        api.unpause(DAG_ID)
        run_id = api.trigger(DAG_ID, {"steps": 600, "rows": 4000})
        run = api.wait_for_run(DAG_ID, run_id, timeout=RUN_TIMEOUT)
        assert run["state"] == "success", api.failure_report(DAG_ID, run_id)

        tasks = api.task_instances(DAG_ID, run_id)
        evaluate = next(t for t in tasks if t.endswith("evaluate"))
        result = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{evaluate}/xcomEntries/return_value")
        assert '"blessed": true' in str(result["value"]).replace("True", "true"), result["value"]
        volume = f"{compose.project}_airflow-tf-storage"
        storage = Path(containers.podman("volume", "inspect", "--format", "{{.Mountpoint}}", volume).stdout.strip())
        exports = sorted((storage / "models" / "linear_regression").glob("*/saved_model.pb"))
        assert exports, f"no SavedModel under {storage}/models/linear_regression"
    finally:
        down = compose("down", "--volumes", "--timeout", "10")
        host_network.restore()
    assert down.returncode == 0, f"podman-compose down failed:\n{down.stderr[-3000:]}"
    for kind in ("containers", "pods", "volumes", "networks"):
        assert compose.owned(kind) == [], f"podman-compose down left {kind} behind"
    still_mounted = set(merged_dirs) & {line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()}
    assert not still_mounted, f"container file systems still mounted: {still_mounted}"
