"""docker-compose.yml (no Docker engine here): it parses, runs Airflow's four components on
PostgreSQL with the LocalExecutor, and stays consistent with the project: build contexts and
Dockerfiles exist, mounted paths exist, every environment name (set or documented in a
comment) is an Airflow option or one the package reads, and the storage is shared. Its
secrets come from .env (the commands in docs/how-to/deploy.md create one), never from the file,
and the UI is published on loopback unless .env says otherwise."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from airflow.configuration import conf
from cryptography.fernet import Fernet

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DEPLOYMENT_DOC = ROOT / "docs" / "how-to" / "deploy.md"
AIRFLOW_SERVICES = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}
# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}: Compose's syntax.
VARIABLE = re.compile(r"\$\{(\w+)(?:(:?[-?])((?:[^{}]|\{[^{}]*\})*))?\}")


class MissingVariable(Exception):
    pass


def interpolate(value, env: dict[str, str]):
    """What `docker compose` makes of the parsed file's values given .env (``env``)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match) -> str:
        name, op, arg = match.groups()
        current = env.get(name)
        missing = current is None or (op is not None and op.startswith(":") and current == "")
        if op and op.endswith("?") and missing:
            raise MissingVariable(f"required variable {name} is missing a value: {arg}")
        if op and op.endswith("-") and missing:
            return interpolate(arg, env)
        return current or ""

    return VARIABLE.sub(substitute, value.replace("$$", "\0")).replace("\0", "$")


def required_variables() -> set[str]:
    return {m.group(1) for m in VARIABLE.finditer(COMPOSE_FILE.read_text()) if (m.group(2) or "").endswith("?")}


def created_env(tmp_path: Path) -> dict[str, str]:
    """The .env that the commands in docs/how-to/deploy.md write, run in an empty directory."""
    blocks = re.findall(r"```bash\n(.*?)```", DEPLOYMENT_DOC.read_text(), re.S)
    create = [b for b in blocks if "> .env" in b]
    assert len(create) == 1, "docs/how-to/deploy.md shows one block of commands that creates .env"
    subprocess.run(["bash", "-euo", "pipefail", "-c", create[0]], cwd=tmp_path, check=True)
    env_file = tmp_path / ".env"
    assert env_file.stat().st_mode & 0o077 == 0, ".env holds secrets: only its owner may read it"
    return dict(line.split("=", 1) for line in env_file.read_text().splitlines() if line and not line.startswith("#"))


@pytest.fixture(scope="module")
def raw_compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def dot_env(tmp_path_factory) -> dict[str, str]:
    return created_env(tmp_path_factory.mktemp("compose"))


@pytest.fixture(scope="module")
def compose(raw_compose, dot_env) -> dict:
    return interpolate(raw_compose, dot_env)


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
        match = re.fullmatch(r"postgresql\+psycopg2://(\w+):([0-9a-f]+)@(\w+)/(\w+)", url)
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


def test_every_secret_comes_from_dot_env_and_a_missing_one_stops_compose_by_name(raw_compose, dot_env):
    required = required_variables()
    assert required == {"POSTGRES_PASSWORD", "AIRFLOW_JWT_SECRET", "AIRFLOW_API_SECRET_KEY", "AIRFLOW_FERNET_KEY"}
    assert set(dot_env) == required, "the documented commands write every required variable, nothing else"
    for name in sorted(required):
        without = {k: v for k, v in dot_env.items() if k != name}
        for env in (without, {**without, name: ""}):
            with pytest.raises(MissingVariable, match=rf"{name} is missing a value: put {name} in \.env"):
                interpolate(raw_compose, env)

    # No secret is written in the file itself: the database password appears only as ${...}.
    airflow_env = environment(raw_compose["services"]["airflow-scheduler"])
    postgres_env = environment(raw_compose["services"]["postgres"])
    assert postgres_env["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    assert ":${POSTGRES_PASSWORD:?" in airflow_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY", "AIRFLOW__CORE__FERNET_KEY"):
        assert airflow_env[key].startswith("${"), key


def test_generated_secrets_are_fresh_and_usable(dot_env, tmp_path):
    Fernet(dot_env["AIRFLOW_FERNET_KEY"].encode())  # raises unless 32 bytes of URL-safe base64
    assert re.fullmatch(r"[0-9a-f]{48,}", dot_env["POSTGRES_PASSWORD"]), "URL-safe as it is"
    assert len(dot_env["AIRFLOW_JWT_SECRET"]) >= 64 and len(dot_env["AIRFLOW_API_SECRET_KEY"]) >= 64
    assert len(set(dot_env.values())) == len(dot_env), "every secret is its own"
    assert created_env(tmp_path) != dot_env, "each run of the commands makes new secrets"


def test_dot_env_example_names_every_setting_and_git_ignores_dot_env():
    text = ENV_EXAMPLE.read_text()
    listed = set(re.findall(r"^(\w+)=", text, re.M))
    optional = set(re.findall(r"^# (\w+)=", text, re.M))
    assert listed == required_variables()
    defaults = {m.group(1) for m in VARIABLE.finditer(COMPOSE_FILE.read_text()) if (m.group(2) or "").endswith("-")}
    assert optional == defaults == {"AIRFLOW_UI_ADDRESS", "AIRFLOW_UI_PORT"}
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT)
    assert ignored.returncode == 0, ".gitignore must keep .env (secrets) out of the repository"


def test_the_ui_is_published_on_loopback_unless_dot_env_says_otherwise(raw_compose, dot_env):
    def published(env: dict[str, str]) -> list[str]:
        services = interpolate(raw_compose, env)["services"]
        assert [n for n, s in services.items() if s.get("ports")] == ["airflow-apiserver"], "only the UI is published"
        return services["airflow-apiserver"]["ports"]

    assert published(dot_env) == ["127.0.0.1:8080:8080"]
    assert published({**dot_env, "AIRFLOW_UI_PORT": "9090"}) == ["127.0.0.1:9090:8080"]
    assert published({**dot_env, "AIRFLOW_UI_ADDRESS": "0.0.0.0"}) == ["0.0.0.0:8080:8080"]


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
