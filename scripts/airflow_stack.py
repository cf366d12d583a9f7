"""Airflow's real components on loopback: API server, scheduler, DAG processor and triggerer
with the LocalExecutor, on a private PostgreSQL (``scripts/postgres``) or, when PostgreSQL
cannot serve, on SQLite.

``scripts/stack`` runs it in the foreground for a person, restarting a component that dies;
the real-stack tests import :class:`AirflowStack` and drive the same code. Every component
runs in a session of its own, which holds everything it forks (LocalExecutor workers, their
task processes, log servers) but not the training groups the local backend starts (they get
sessions of their own): ending a component's session ends exactly that component."""

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
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
USERNAME = "admin"
# After SIGTERM a component finishes its own shutdown (marks its job ended, stops its log
# server) within a second; what follows is the interpreter freeing Airflow's large heap, 5-30 s
# of CPU on a busy machine with nothing left to save. So everything still running this long
# after SIGTERM is killed.
STOP_GRACE = 3.0
# A component that dies this often within RESTART_WINDOW seconds is not restarted again.
RESTART_LIMIT = 5
RESTART_WINDOW = 600.0


class StackError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def warm_up(url: str, timeout: float) -> bool:
    """Sends the task execution API of the API server at ``url`` its first request; True once it
    answered. It builds its versioned routes then (Cadwyn, on the API server's event loop): 5-160 s
    of CPU on a busy machine during which the API server answers nobody, and the first tasks' calls
    time out if they come first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/execution/health", timeout=max(1.0, deadline - time.monotonic())):
                return True
        except urllib.error.HTTPError:  # it answered
            return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1)
    return False


class AirflowStack:
    """One Airflow deployment in ``home`` (AIRFLOW_HOME, logs, passwords, the SQLite file or by
    default the PostgreSQL cluster in ``postgres_dir``).

    ``database`` is ``postgres``, ``sqlite`` or ``auto`` (PostgreSQL, else SQLite); after
    :meth:`start`, :attr:`database` says which one serves. ``setup``: ``airflow`` commands run
    after ``db migrate``, before the components start (e.g. ``("teams", "sync")``). ``umask``: the
    components' (default: this process's)."""

    def __init__(
        self,
        home: Path,
        dags_folder: Path,
        *,
        port: int | None = None,
        database: str = "auto",
        postgres_dir: Path | None = None,
        env: dict[str, str] | None = None,
        venv: Path = Path(sys.prefix),  # the environment running this (.venv, or CI's others)
        setup: tuple[tuple[str, ...], ...] = (),
        umask: int | None = None,
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
        self.setup = tuple(setup)
        self.umask = -1 if umask is None else umask
        self.bin = Path(venv) / "bin"
        self.url = f"http://127.0.0.1:{self.port}"
        self.password = ""
        self.processes: dict[str, subprocess.Popen] = {}
        self.restarts: dict[str, list[float]] = {c: [] for c in COMPONENTS}
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
                # A changed file is parsed again at the next refresh whatever this says (its mtime
                # is newer than its last parse); an unchanged one need not be every 30 s, each
                # parse a process of its own.
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "300",
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            }
        )
        env.update(self.extra_env)
        return env

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, timeout: float = 600.0) -> None:
        """Each step (db migrate, healthy, execution API warm) may take ``timeout`` seconds:
        db migrate alone took over 4 minutes here at load average 50."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "logs").mkdir(exist_ok=True)
        self._env = self.environment(self._database_url())
        self._ensure_password()
        self._airflow("db", "migrate", log="db-migrate.log", timeout=timeout)
        for command in self.setup:
            self._airflow(*command, log="setup.log", timeout=timeout)
        for component in COMPONENTS:
            self._spawn(component)
        self.wait_healthy(timeout)
        if not self.warm_up(timeout):
            raise StackError(f"the task execution API at {self.url}/execution/ did not answer within {timeout:.0f}s")

    def stop(self, grace: float = STOP_GRACE) -> tuple[float, float]:
        """Ends every component at once: SIGTERM to everything in their sessions, SIGKILL to
        what is left after ``grace`` seconds; then stops the database. Returns the seconds each
        of the two took."""
        began = time.monotonic()
        sessions = {proc.pid for proc in self.processes.values()}
        _signal_sessions(sessions, signal.SIGTERM)
        if not self._wait_sessions_ended(sessions, grace):
            _signal_sessions(sessions, signal.SIGKILL)
            self._wait_sessions_ended(sessions, 30.0)
        for proc in self.processes.values():
            proc.wait()
        self.processes.clear()
        airflow_stopped = time.monotonic()
        if self._pg_dir is not None:
            subprocess.run([str(ROOT / "scripts" / "postgres"), "stop", str(self._pg_dir)], check=False)
        return airflow_stopped - began, time.monotonic() - airflow_stopped

    def restart_exited(self) -> list[str]:
        """Restarts every component whose process has exited, after killing everything left in
        its session (a scheduler restarted while its old LocalExecutor workers live on finds the
        database locked and queues nothing). Returns one line per restart; raises
        :class:`StackError` for a component that died RESTART_LIMIT times within RESTART_WINDOW."""
        restarted = []
        for name, proc in list(self.processes.items()):
            if proc.poll() is None:
                continue
            _signal_sessions({proc.pid}, signal.SIGKILL)
            self._wait_sessions_ended({proc.pid}, 30.0)
            now = time.monotonic()
            recent = [t for t in self.restarts[name] if now - t < RESTART_WINDOW]
            how = _exit_description(proc.returncode)
            if len(recent) >= RESTART_LIMIT:
                raise StackError(
                    f"airflow {name} {how}, the {len(recent) + 1}th time within {RESTART_WINDOW / 60:.0f} minutes; "
                    f"not restarting it again:\n{self.log_tail(name)}"
                )
            self.restarts[name] = [*recent, now]
            new = self._spawn(name)
            if name == "api-server":
                threading.Thread(target=self.warm_up, args=(240.0,), daemon=True).start()
            restarted.append(f"airflow {name} (pid {proc.pid}) {how}; restarted it as pid {new.pid}")
        return restarted

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

    def warm_up(self, timeout: float) -> bool:
        return warm_up(self.url, timeout)

    def log_tail(self, component: str, lines: int = 40) -> str:
        path = self.home / "logs" / f"{component}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # -- pieces ---------------------------------------------------------------------------
    def _spawn(self, component: str) -> subprocess.Popen:
        with open(self.home / "logs" / f"{component}.log", "ab") as log:
            proc = subprocess.Popen(
                [str(self.bin / "airflow"), component],
                env=self._env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                umask=self.umask,
            )
        self.processes[component] = proc
        return proc

    def _wait_sessions_ended(self, sessions: set[int], timeout: float) -> bool:
        """Until no live process is left in ``sessions``; reaps the components meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            for proc in self.processes.values():
                proc.poll()
            if not session_members(sessions):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

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

    def cli(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
        """``airflow ARGS`` against this deployment (after :meth:`start`), output captured."""
        return subprocess.run([str(self.bin / "airflow"), *args], env=self._env, cwd=self.home, capture_output=True,
                              text=True, timeout=timeout, check=False)

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


def session_members(sessions: set[int]) -> list[psutil.Process]:
    """Live processes (not zombies) in the sessions ``sessions``: a component's session id is
    its leader's pid, and stays so for what it forked after the leader died."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getsid(proc.pid) in sessions and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (OSError, psutil.Error):
            continue
    return members


def _signal_sessions(sessions: set[int], sig: int) -> None:
    for proc in session_members(sessions):
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def _exit_description(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with {returncode}"


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
    starting = True

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        if starting:  # do not wait for the start to finish
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        stack.start()
        starting = False
        print(
            f"Airflow is up at {stack.url} (user {USERNAME}, password {stack.password}; "
            f"database: {stack.database}; logs: {home / 'logs'}). Ctrl-C stops it.",
            flush=True,
        )
        while not stopping:
            for line in stack.restart_exited():
                print(f"scripts/stack: {line}", file=sys.stderr, flush=True)
            time.sleep(1)
    except StackError as exc:
        print(f"scripts/stack: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        starting = False
        airflow_took, database_took = stack.stop()
        print(
            f"scripts/stack: stopped Airflow in {airflow_took:.1f}s and its database in {database_took:.1f}s",
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
