"""The real Airflow stack for these tests: API server, scheduler, DAG processor and triggerer
(LocalExecutor) on loopback, on a private PostgreSQL from Debian, started once for the tests of
this folder (a package, so the stack stops after its last test rather than at the session's end) by
the same code as ``scripts/stack``. DAGs are driven the way users drive them: REST API v2
with a token from ``POST /auth/token``, schedules, and the web UI in Debian's Chromium driven
by Playwright for Python.

Fixtures: ``stack`` (the folder's stack: :class:`Stack`), ``signed_in_page`` (a Chromium page
signed in to it), ``browser`` (the folder's Chromium), ``script_stack`` (runs
``scripts/stack`` itself in a private home: :class:`ScriptStack`)."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import psutil
import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from airflow_stack import USERNAME, AirflowStack, free_port, session_members  # noqa: E402

TEST_DAGS = Path(__file__).parent / "dags"
TERMINAL = ("success", "failed")
ARTIFACTS = ROOT / "test-artifacts"
# Debian's chromium package; Playwright drives it as it is (no browser download).
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


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


@pytest.fixture(scope="package")
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
    artifacts = ARTIFACTS
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
            and ("airflow_tf.runtime" in cmdline or "airflow_tf.backends.local.supervisor" in cmdline
                 or cmdline.startswith("airflow-tf "))  # a task's title
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


@pytest.fixture(scope="package")
def browser():
    """Debian's Chromium (``CHROMIUM``, default /usr/bin/chromium), headless, driven by the
    ``playwright`` package; one browser for this folder's tests, closed after the last."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: ./scripts/test installs Debian's chromium (as root)"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def signed_in_page(stack, browser, request):
    """A Playwright ``Page`` in a fresh browser context (own cookies, 1400x900), signed in to the
    session's stack as the simple auth manager's user through the login form, left on the
    Airflow home page. Navigate with ``page.goto(f"{stack.airflow.url}/dags/<dag_id>")``.
    Waits default to 120 s and page loads to 180 s: the UI's JavaScript bundle alone took a
    minute to load here on a busy machine. When the test fails, a screenshot of the page is saved as
    ``test-artifacts/<test name>-error.png``; save your own with
    ``page.screenshot(path=stack.artifacts / "<name>.png", full_page=True)``."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.set_default_navigation_timeout(180_000)
    try:
        page.goto(stack.airflow.url)
        page.get_by_label("Username").fill(USERNAME)
        page.get_by_label("Password").fill(stack.airflow.password)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda url: "/login" not in url and url.startswith(stack.airflow.url))
        yield page
    finally:
        if getattr(request.node, "failed", True):
            name = re.sub(r"[^\w.-]+", "_", request.node.name)
            try:
                page.screenshot(path=str(ARTIFACTS / f"{name}-error.png"), full_page=True)
            except Exception as exc:  # the page may be what broke
                warnings.warn(f"no screenshot of the failed page: {exc}")
        context.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Lets fixtures see whether their test failed (``request.node.failed``)."""
    report = yield
    if report.when == "call":
        item.failed = report.failed
    return report


class ScriptStack:
    """``scripts/stack`` run as a person runs it, in its own home and database, its output
    collected line by line (:meth:`wait_for_line`)."""

    def __init__(self, root: Path, dags: Path) -> None:
        self.home = root / "home"
        self.port = free_port()
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        self.process = subprocess.Popen(
            [str(ROOT / "scripts" / "stack"), "--home", str(self.home), "--dags", str(dags),
             "--port", str(self.port), "--database", "postgres"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match:
        """The first match of ``pattern`` in an output line not read before; fails with the output
        if it does not come, or if scripts/stack exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=1)
            except queue.Empty:
                if self.process.poll() is not None and self._queue.empty():
                    break
                continue
            self.lines.append(line)
            if match := re.search(pattern, line):
                return match
        raise AssertionError(f"scripts/stack printed no line matching {pattern!r} within {timeout:.0f}s:\n" + "\n".join(self.lines[-60:]))

    def api(self, username: str, password: str) -> AirflowAPI:
        return AirflowAPI(self.url, username, password)

    def components(self) -> dict[str, psutil.Process]:
        """The live Airflow component processes, by component name."""
        found = {}
        for child in psutil.Process(self.process.pid).children():
            cmdline = child.cmdline()
            if len(cmdline) >= 2 and cmdline[-2].endswith("/airflow"):
                found[cmdline[-1]] = child
        return found

    def wait_for_component(self, name: str, pid: int, timeout: float) -> psutil.Process:
        """The component ``name`` once it runs as ``pid``; fails with the stack's children and the
        end of the component's log if it does not within ``timeout`` (e.g. it died at start)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.components().get(name)
            if found is not None and found.pid == pid:
                return found
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        children = []
        for child in psutil.Process(self.process.pid).children():
            try:
                children.append(f"{child.pid} {child.status()}: {' '.join(child.cmdline())[:160]}")
            except psutil.Error as exc:
                children.append(f"{child.pid}: {exc!r}")
        log = self.home / "logs" / f"{name}.log"
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else "(no log)"
        raise AssertionError(
            f"airflow {name} is not running as pid {pid} after {timeout:.0f}s; scripts/stack's children:\n"
            + "\n".join(children) + f"\nthe end of {log}:\n{tail}"
        )

    def processes(self) -> list[psutil.Process]:
        """Every live process of this stack: the components and all they forked, and the database."""
        members = session_members({p.pid for p in self.components().values()})
        pid_file = self.home / "postgres" / "postmaster.pid"
        if pid_file.exists():
            try:
                postmaster = psutil.Process(int(pid_file.read_text().split()[0]))
                members += [postmaster, *postmaster.children(recursive=True)]
            except (psutil.Error, ValueError):
                pass
        return members

    def kill(self) -> None:
        """SIGKILL of scripts/stack and everything it runs (the fixture's last resort)."""
        leftovers = self.processes()
        for proc in [psutil.Process(self.process.pid), *leftovers]:
            try:
                proc.kill()
            except psutil.Error:
                pass
        self.process.wait()


@pytest.fixture
def script_stack():
    """Starts ``scripts/stack`` on the test DAGs (tests/stack/dags) with a free port in a new
    home (under /tmp, which the ``postgres`` user can enter); yields the :class:`ScriptStack`
    at once (wait for "Airflow is up" yourself); at the end stops what is left of it and keeps
    its logs in test-artifacts/script-stack-*.log."""
    root = Path(tempfile.mkdtemp(prefix="airflow-tf-script-stack-"))
    root.chmod(0o755)
    dags = root / "dags"
    dags.mkdir()
    for source in TEST_DAGS.glob("*.py"):
        (dags / source.name).symlink_to(source)
    running = ScriptStack(root, dags)
    try:
        yield running
    finally:
        if running.process.poll() is None:
            running.process.send_signal(signal.SIGINT)
            try:
                running.process.wait(60)
            except subprocess.TimeoutExpired:
                running.kill()
        while not running._queue.empty():
            running.lines.append(running._queue.get())
        print("scripts/stack printed:\n" + "\n".join(running.lines))
        ARTIFACTS.mkdir(exist_ok=True)
        for log in (running.home / "logs").glob("*.log"):
            shutil.copy(log, ARTIFACTS / f"script-stack-{log.name}")
        if (running.home / "postgres" / "PG_VERSION").exists():
            subprocess.run([str(ROOT / "scripts" / "postgres"), "stop", str(running.home / "postgres")], check=False)
        shutil.rmtree(root, ignore_errors=True)
