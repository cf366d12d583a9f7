"""Airflow's real components on loopback: API server, scheduler, DAG processor and triggerer
with the LocalExecutor, on a private PostgreSQL (``scripts/postgres``) or, when PostgreSQL
cannot serve, on SQLite.

``scripts/stack`` runs it in the foreground for a person; the real-stack tests import
:class:`AirflowStack` and drive the same code. Every component runs in its own process group,
so :meth:`AirflowStack.stop` also ends the task processes the LocalExecutor forked."""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
USERNAME = "admin"


class StackError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AirflowStack:
    """One Airflow deployment in ``home`` (AIRFLOW_HOME, logs, passwords, the SQLite file or by
    default the PostgreSQL cluster in ``postgres_dir``).

    ``database`` is ``postgres``, ``sqlite`` or ``auto`` (PostgreSQL, else SQLite); after
    :meth:`start`, :attr:`database` says which one serves."""

    def __init__(
        self,
        home: Path,
        dags_folder: Path,
        *,
        port: int | None = None,
        database: str = "auto",
        postgres_dir: Path | None = None,
        env: dict[str, str] | None = None,
        venv: Path = ROOT / ".venv",
    ) -> None:
        if database not in ("auto", "postgres", "sqlite"):
            raise StackError(f"database: {database!r} is not one of auto, postgres, sqlite")
        self.home = Path(home).resolve()
        self.dags_folder = Path(dags_folder).resolve()
        if not self.dags_folder.is_dir():
            raise StackError(f"DAGs folder {self.dags_folder} does not exist")
        self.port = port or free_port()
        self.database = database
        self.extra_env = dict(env or {})
        self.bin = Path(venv) / "bin"
        self.url = f"http://127.0.0.1:{self.port}"
        self.password = ""
        self.processes: dict[str, subprocess.Popen] = {}
        # As root, PostgreSQL runs as 'postgres', which must be able to enter this directory.
        self.postgres_dir = Path(postgres_dir or self.home / "postgres").resolve()
        self._pg_dir: Path | None = None

    # -- settings -------------------------------------------------------------------------
    def environment(self, sql_alchemy_conn: str) -> dict[str, str]:
        secrets_file = self.home / "secrets.json"
        if secrets_file.exists():
            keys = json.loads(secrets_file.read_text())
        else:
            # Every component must sign and check the same task tokens and session cookies.
            keys = {
                "jwt_secret": secrets.token_urlsafe(32),
                "secret_key": secrets.token_urlsafe(32),
                "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            }
            _write_atomic(secrets_file, json.dumps(keys))
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
        env.update(
            {
                "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__FERNET_KEY": keys["fernet_key"],
                # Few task processes at once: each one imports Airflow (and maybe TensorFlow).
                "AIRFLOW__CORE__PARALLELISM": "4",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:admin",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sql_alchemy_conn,
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__BASE_URL": self.url,
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__API__SECRET_KEY": keys["secret_key"],
                "AIRFLOW__API_AUTH__JWT_SECRET": keys["jwt_secret"],
                # The log servers of the scheduler and triggerer listen too: keep them off the
                # defaults (8793, 8794) so that several stacks can run side by side.
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                # New and changed DAG files show up within seconds, not minutes.
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            }
        )
        env.update(self.extra_env)
        return env

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, timeout: float = 240.0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "logs").mkdir(exist_ok=True)
        self._env = self.environment(self._database_url())
        self._ensure_password()
        self._airflow("db", "migrate", log="db-migrate.log", timeout=timeout)
        for component in COMPONENTS:
            log = open(self.home / "logs" / f"{component}.log", "ab")
            self.processes[component] = subprocess.Popen(
                [str(self.bin / "airflow"), component],
                env=self._env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
        self.wait_healthy(timeout)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM every component's process group, SIGKILL what is left after ``grace``."""
        for proc in self.processes.values():
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.processes.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # Children (LocalExecutor task processes, log servers) may outlive their leader.
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        self.processes.clear()
        if self._pg_dir is not None:
            subprocess.run([str(ROOT / "scripts" / "postgres"), "stop", str(self._pg_dir)], check=False)

    def __enter__(self) -> "AirflowStack":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_healthy(self, timeout: float) -> dict:
        """Until the API server answers and the scheduler, triggerer and DAG processor have a
        fresh heartbeat; a component that exits fails at once with the end of its log."""
        deadline = time.monotonic() + timeout
        health: dict = {}
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise StackError(f"airflow {name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as resp:
                    health = json.load(resp)
            except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
                health = {}
            parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
            if health and all((health.get(p) or {}).get("status") == "healthy" for p in parts):
                return health
            time.sleep(1)
        raise StackError(
            f"Airflow at {self.url} was not healthy after {timeout:.0f}s (last health: {health}); "
            f"logs are in {self.home / 'logs'}"
        )

    def log_tail(self, component: str, lines: int = 40) -> str:
        path = self.home / "logs" / f"{component}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # -- pieces ---------------------------------------------------------------------------
    def _database_url(self) -> str:
        if self.database in ("auto", "postgres"):
            self._pg_dir = self.postgres_dir
            done = subprocess.run(
                [str(ROOT / "scripts" / "postgres"), "start", str(self._pg_dir), str(free_port())],
                capture_output=True,
                text=True,
            )
            if done.returncode == 0:
                self.database = "postgres"
                return done.stdout.strip().splitlines()[-1]
            self._pg_dir = None
            if self.database == "postgres":
                raise StackError(f"PostgreSQL could not start:\n{done.stderr.strip()}")
            print(f"airflow-stack: PostgreSQL cannot serve, using SQLite:\n{done.stderr.strip()}", file=sys.stderr)
        self.database = "sqlite"
        return f"sqlite:///{self.home / 'airflow.db'}"

    def _ensure_password(self) -> None:
        """A known password for the simple auth manager's user (it keeps existing entries)."""
        path = self.home / "passwords.json"
        passwords = json.loads(path.read_text()) if path.exists() else {}
        if USERNAME not in passwords:
            passwords[USERNAME] = secrets.token_urlsafe(12)
            _write_atomic(path, json.dumps(passwords))
        self.password = passwords[USERNAME]

    def _airflow(self, *args: str, log: str, timeout: float) -> None:
        with open(self.home / "logs" / log, "ab") as out:
            done = subprocess.run(
                [str(self.bin / "airflow"), *args],
                env=self._env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
        if done.returncode != 0:
            tail = "\n".join((self.home / "logs" / log).read_text(errors="replace").splitlines()[-30:])
            raise StackError(f"airflow {' '.join(args)} failed ({done.returncode}):\n{tail}")


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o600)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/stack",
        description="Run Airflow's API server, scheduler, DAG processor and triggerer on loopback "
        "(LocalExecutor, PostgreSQL from Debian) until Ctrl-C.",
    )
    parser.add_argument("--home", type=Path, default=ROOT / ".stack", help="AIRFLOW_HOME (default: .stack)")
    parser.add_argument("--dags", type=Path, default=ROOT / "dags", help="DAGs folder (default: dags/)")
    parser.add_argument("--storage", type=Path, help="AIRFLOW_TF_STORAGE (default: <home>/storage)")
    parser.add_argument("--port", type=int, default=8080, help="API server and UI port (default: 8080)")
    parser.add_argument("--database", choices=("auto", "postgres", "sqlite"), default="auto")
    args = parser.parse_args(argv)

    home = args.home.resolve()
    storage = (args.storage or home / "storage").resolve()
    storage.mkdir(parents=True, exist_ok=True)
    env = {"AIRFLOW_TF_STORAGE": str(storage), "AIRFLOW_TF_STATE_DIR": str(storage / "groups")}
    stack = AirflowStack(home, args.dags, port=args.port, database=args.database, env=env)
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        stack.start()
        print(
            f"Airflow is up at {stack.url} (user {USERNAME}, password {stack.password}; "
            f"database: {stack.database}; logs: {home / 'logs'}). Ctrl-C stops it.",
            flush=True,
        )
        while not stopping:
            for name, proc in stack.processes.items():
                if proc.poll() is not None:
                    raise StackError(f"airflow {name} exited with {proc.returncode}:\n{stack.log_tail(name)}")
            time.sleep(1)
    except StackError as exc:
        print(f"scripts/stack: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
