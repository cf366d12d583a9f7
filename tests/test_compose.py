"""docker-compose.yml (no Docker engine here): it parses, runs Airflow's four components on
PostgreSQL with the LocalExecutor, and stays consistent with the project: build contexts and
Dockerfiles exist, mounted paths exist, every environment name (set or documented in a
comment) is an Airflow option or one the package reads, and the storage is shared."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from airflow.configuration import conf

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
AIRFLOW_SERVICES = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return env


def package_source() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "airflow_tf").rglob("*.py"))


def test_airflow_components_run_on_postgres_with_the_local_executor(compose):
    services = compose["services"]
    for name, command in AIRFLOW_SERVICES.items():
        assert services[name]["command"] == [command], name
        env = environment(services[name])
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        url = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        match = re.fullmatch(r"postgresql\+psycopg2://(\w+):(\w+)@(\w+)/(\w+)", url)
        assert match, url
        user, password, host, database = match.groups()
        postgres = environment(services[host])
        assert (postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"], postgres["POSTGRES_DB"]) == (user, password, database)
        depends = services[name]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy"
        assert depends["airflow-init"]["condition"] == "service_completed_successfully"
    assert services["airflow-init"]["command"] == ["db", "migrate"]
    api_url = environment(services["airflow-scheduler"])["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
    assert api_url.startswith("http://airflow-apiserver:8080/")
    assert "8080:8080" in services["airflow-apiserver"]["ports"]


def test_images_are_built_from_dockerfiles_in_the_repository(compose):
    for name, service in compose["services"].items():
        if "build" in service:
            context = ROOT / service["build"]["context"]
            assert context.is_dir(), name
            assert (context / service["build"].get("dockerfile", "Dockerfile")).is_file(), name
        else:
            assert ":" in service["image"] and not service["image"].endswith(":latest"), f"{name}: pin the image tag"


def test_mounted_host_paths_exist_and_named_volumes_are_declared(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is not in the repository"
            else:
                assert source in compose["volumes"], f"{name} mounts undeclared volume {source}"
    dags = [v for v in compose["services"]["airflow-dag-processor"]["volumes"] if v.startswith("./dags:")]
    assert dags and list((ROOT / "dags").glob("*.py")), "the example DAGs are mounted"


def test_every_environment_name_is_an_airflow_option_or_read_by_the_package():
    # Commented-out settings (the Kubernetes backend) are documentation users copy: check them too.
    names = set(re.findall(r"^\s*#?\s*((?:AIRFLOW|AIRFLOW_TF)_[A-Z0-9_]+):", COMPOSE_FILE.read_text(), re.M))
    assert "AIRFLOW_CONN_KUBERNETES_DEFAULT" in names, "the Kubernetes backend's connection is documented"
    source = package_source()
    for name in sorted(names):
        if name.startswith("AIRFLOW__"):
            section, key = name[len("AIRFLOW__"):].lower().split("__", 1)
            known = conf.configuration_description.get(section, {}).get("options", {})
            assert key in known, f"{name}: Airflow has no option [{section}] {key}"
        elif name.startswith("AIRFLOW_CONN_"):
            conn_id = name[len("AIRFLOW_CONN_"):].lower()
            assert f'"{conn_id}"' in source, f"{name}: the package never uses connection {conn_id!r}"
        else:
            assert f'"{name}"' in source, f"{name}: the package never reads this variable"


def test_storage_is_one_shared_volume_at_the_path_the_dags_use(compose):
    mounts = set()
    for name in AIRFLOW_SERVICES:
        service = compose["services"][name]
        env = environment(service)
        storage = env["AIRFLOW_TF_STORAGE"]
        assert env["AIRFLOW_TF_STATE_DIR"].startswith(storage + "/"), "group state lives on the shared storage"
        mounted = {v.split(":")[0] for v in service["volumes"] if v.split(":")[1] == storage}
        assert len(mounted) == 1, f"{name}: nothing mounted at {storage}"
        mounts |= mounted
    assert len(mounts) == 1 and mounts <= set(compose["volumes"]), mounts


def test_the_triggerer_sees_the_scheduler_processes(compose):
    # The local backend's supervisors start inside the scheduler (LocalExecutor tasks); the
    # deferrable sensor's trigger checks their pids from the triggerer.
    triggerer = compose["services"]["airflow-triggerer"]
    assert triggerer["pid"] == "service:airflow-scheduler"
    assert "airflow-scheduler" in triggerer["depends_on"]
