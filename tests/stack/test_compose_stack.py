"""docker-compose.yml brought up for real with podman-compose on Podman (no Docker engine here), from
the images scripts/images built (docs/how-to/develop.md says which public bases are stand-ins), as
docs/how-to/deploy.md tells Podman users: the demo DAG runs through it to a blessed export that
serves as TensorFlow Serving loads it, and `down --volumes` leaves nothing behind.

Podman 4.3 runs no health checks by itself (they need systemd's timers) and podman-compose 1.6
waits for neither a healthy nor a completed service there, so the services are brought up as the
guide says: `up --no-deps` a step at a time in the order of the file's `depends_on`, each step
after the conditions it names hold. compose.podman.yml (the guide's override) gives the triggerer
the scheduler's process namespace by container name. Podman's network stack turns IPv4 forwarding
on and leaves its firewall chains when the last network goes: containers.HostNetwork puts both back."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import containers
import pytest
import requests
import yaml
from airflow_stack import free_port, warm_up
from serving_check import WARMUP, serve_both_ways
from stack.conftest import USERNAME, AirflowAPI
from test_compose import COMPOSE_FILE, created_env, required_variables

ANSI_STYLE = re.compile(r"\x1b\[[0-9;]*m")  # the line is coloured for a terminal
OVERRIDE_FILE = COMPOSE_FILE.with_name("compose.podman.yml")
DAG_ID = "tf_linear_regression"
MODEL = "linear_regression"
STORAGE = "/opt/airflow/storage"  # AIRFLOW_TF_STORAGE in the containers, on the airflow-tf-storage volume
STEP_TIMEOUT = 600.0  # a service healthy or done (the migrations: 15 s here)
UP_TIMEOUT = 900.0  # the API server answering after its container starts (30 s here)
RUN_TIMEOUT = 1200.0  # the demo run, small (90 s here)

pytestmark = pytest.mark.slow


class Compose:
    """podman-compose on the repository's docker-compose.yml and the guide's Podman override, as a
    project of its own (containers are named <project>_<service>_1)."""

    def __init__(self, workdir: Path, project: str) -> None:
        self.project = project
        self.env_file = workdir / ".env"
        # The test's own environment must not stand in for what .env says.
        self.env = {k: v for k, v in os.environ.items()
                    if k not in required_variables() and not k.startswith(("AIRFLOW_UI_", "COMPOSE_"))}
        self.env.update(containers.store_env())

    def __call__(self, *args: str, timeout: float = STEP_TIMEOUT) -> subprocess.CompletedProcess[str]:
        command = [str(Path(sys.executable).with_name("podman-compose")), "--project-name", self.project,
                   "--env-file", str(self.env_file), "-f", str(COMPOSE_FILE), "-f", str(OVERRIDE_FILE), *args]
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def logs(self) -> str:
        done = self("logs", "--tail", "30")
        return (done.stdout + done.stderr)[-8000:]

    def up_in_dependency_order(self) -> list[list[str]]:
        """Every service up, a step of `up --no-deps` at a time: a service's step comes once the
        conditions its `depends_on` names hold. Returns the steps."""
        config = self("config")
        assert config.returncode == 0, f"podman-compose config failed:\n{config.stderr[-3000:]}"
        services = yaml.safe_load(config.stdout)["services"]
        depends = {name: dict(service.get("depends_on") or {}) for name, service in services.items()}
        steps, ready = [], set()
        while len(ready) < len(services):
            step = sorted(n for n in services if n not in ready and set(depends[n]) <= ready)
            assert step, f"depends_on goes round in a circle among {sorted(set(services) - ready)}"
            up = self("up", "--detach", "--no-build", "--no-deps", *step)
            assert up.returncode == 0, f"up {' '.join(step)} failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
            for name in step:
                for condition in sorted({d[name]["condition"] for d in depends.values() if name in d}):
                    self.wait_for(name, condition)
            ready.update(step)
            steps.append(step)
        return steps

    def wait_for(self, service: str, condition: str) -> None:
        container = self.container(service)
        if condition == "service_completed_successfully":
            waited = containers.podman("wait", container, timeout=STEP_TIMEOUT)
            code = waited.stdout.strip()
            assert code == "0", f"{service} exited {code}:\n{containers.podman('logs', container).stderr[-3000:]}"
            return
        deadline = time.monotonic() + STEP_TIMEOUT
        while time.monotonic() < deadline:
            if condition == "service_healthy":  # the service's own health check, run now
                if containers.podman("healthcheck", "run", container, check=False).returncode == 0:
                    return
            elif condition == "service_started":
                state = containers.podman("inspect", "--format", "{{.State.Running}}", container).stdout.strip()
                if state == "true":
                    return
            else:
                raise AssertionError(f"depends_on condition {condition!r} of {service} is not one Compose knows")
            time.sleep(1)
        raise AssertionError(f"{service} not {condition} within {STEP_TIMEOUT:.0f}s:\n{self.logs()}")

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
            health = requests.get(f"{url}/api/v2/monitor/health", timeout=5)
            if health.status_code == 200 and health.json()["metadatabase"]["status"] == "healthy":
                return
        except requests.RequestException:
            pass
        time.sleep(2)
    raise AssertionError(f"the API server did not answer within {UP_TIMEOUT:.0f}s:\n{compose.logs()}")


def login_password(compose: Compose) -> str:
    """The generated password, found as docs/how-to/deploy.md says: in the API server's log."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = compose("logs", "airflow-apiserver")
        for line in (logs.stdout + logs.stderr).splitlines():
            if f"Password for user '{USERNAME}'" in line:
                return ANSI_STYLE.sub("", line).rsplit(":", 1)[1].strip()
        time.sleep(2)
    raise AssertionError(f"the API server logged no 'Password for user' line:\n{compose.logs()}")


def mounted() -> set[str]:
    return {line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()}


@pytest.mark.long
@pytest.mark.timeout(3600)
def test_compose_runs_the_demo_dag_to_a_blessed_export_and_down_leaves_nothing(tmp_path):
    containers.built("airflow-tensorflow", "postgres")  # current already: ./scripts/test built them
    created_env(tmp_path)
    port = free_port()
    with open(tmp_path / ".env", "a") as env_file:  # not a user's own 8080
        env_file.write(f"AIRFLOW_UI_PORT={port}\n")
    compose = Compose(tmp_path, f"airflowtf{containers.new_label()}")
    netns_before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    forwarding_before = containers.IP_FORWARD.read_text()
    rules_before = {table: containers.iptables_rules(table) for table in containers.IPTABLES_TABLES}
    file_systems: list[str] = []
    host_network = containers.HostNetwork()
    with host_network:
        try:
            steps = compose.up_in_dependency_order()
            assert steps == [["postgres"], ["airflow-init"],
                             ["airflow-apiserver", "airflow-dag-processor", "airflow-scheduler"],
                             ["airflow-triggerer"]], steps
            for name in compose.owned("containers"):
                file_systems.append(containers.podman(
                    "inspect", "--format", "{{.GraphDriver.Data.MergedDir}}", name).stdout.strip())
            url = f"http://127.0.0.1:{port}"
            wait_for_health(url, compose)
            # As the guide says: the execution API's first request, before the first task's.
            assert warm_up(url, UP_TIMEOUT), f"{url}/execution/ did not answer:\n{compose.logs()}"
            api = AirflowAPI(url, USERNAME, login_password(compose))
            api.wait_for_dag(DAG_ID, timeout=300)
            api.unpause(DAG_ID)
            run_id = api.trigger(DAG_ID, {"steps": 600, "rows": 4000})
            run = api.wait_for_run(DAG_ID, run_id, timeout=RUN_TIMEOUT)
            assert run["state"] == "success", f"{api.failure_report(DAG_ID, run_id)}\n{compose.logs()}"
            # The sensor waited on the triggerer, whose trigger found the group's supervisor among
            # the scheduler's processes (the process namespace compose.podman.yml shares).
            sensor = api.task_instances(DAG_ID, run_id)["training.wait_for_workers"]
            log = api.task_log(DAG_ID, run_id, "training.wait_for_workers", sensor["try_number"])
            assert "Pausing task as DEFERRED" in log and "Trigger fired event" in log, log[-3000:]

            evaluation = api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/training.evaluate"
                                         "/xcomEntries/return_value", params={"deserialize": "true"})["value"]
            assert evaluation["blessed"] is True, evaluation
            volume = containers.podman("volume", "inspect", "--format", "{{.Mountpoint}}",
                                       f"{compose.project}_airflow-tf-storage").stdout.strip()
            versions = sorted((Path(volume) / "models" / MODEL).iterdir())
            # TensorFlow Serving's layout: <models>/<name>/<numeric version>/saved_model.pb
            assert [v.name for v in versions] == ["1"] and (versions[0] / "saved_model.pb").is_file(), versions
            record = json.loads((versions[0] / "assets.extra" / "airflow_tf.json").read_text())
            assert record["blessed"] is True and record["checkpoint"] == evaluation["checkpoint"], record
            assert record["checkpoint"].startswith(f"{STORAGE}/runs/"), "the export names its run on the volume"
            serve_both_ways(versions[0], versions[0] / WARMUP, tmp_path)
        finally:
            down = compose("down", "--volumes", "--timeout", "10")
    assert down.returncode == 0, f"podman-compose down failed:\n{down.stderr[-3000:]}"
    for kind in ("containers", "pods", "volumes", "networks"):
        assert compose.owned(kind) == [], f"podman-compose down left {kind} behind"
    assert file_systems and not set(file_systems) & mounted(), "container file systems are still mounted"
    assert not containers.podman("image", "mount").stdout.strip(), "an image is still mounted"
    netns_after = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    assert netns_after <= netns_before, f"network namespaces left: {netns_after - netns_before}"
    if host_network.restored:  # else another run still uses Podman's network and puts the host back
        assert containers.IP_FORWARD.read_text() == forwarding_before, "IPv4 forwarding was left on"
        for table, before in rules_before.items():
            left = [r for r in containers.iptables_rules(table) if r not in before]
            assert not left, f"iptables rules left in table {table}: {left}"
