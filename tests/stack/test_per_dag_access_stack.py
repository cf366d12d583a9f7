"""Per-DAG access to TensorBoard and the Training view on the real stack.

The stack here runs in Airflow's multi-team mode with the simple auth manager: two DAG bundles,
each owned by a team (``team_a``, ``team_b``), each holding one training DAG (``tf_team_a``,
``tf_team_b``); alice is a viewer in team_a, bob a viewer in team_b, admin an admin. The auth
manager answers per DAG (through the DAG's team), as Airflow's own REST API shows first. Both
DAGs train; then each user sees only their own team's runs in TensorBoard and in the Training
view, gets 404 for the other team's scalars, the admin sees both, and signed out is 401. In
Chromium, alice sees a running group's step move in the Training view, and signed out is refused.

Each team has its own storage root (``[airflow_tf] teams``), owned by an OS user of its own
(created for the module, with an ACL that lets it reach the interpreter), and every task of a
team's DAGs runs as that user (Airflow's ``run_as_user``, through sudo): this stands in for what a
deployment does with a worker per team (a Celery queue, an edge worker, a namespace), and shows
that a team's task can neither read nor write the other team's runs, whatever its code does.

A stack of its own (not the session's ``stack``): multi-team mode is set when Airflow starts."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote

import psutil
import pytest
import requests

from airflow_stack import AirflowStack  # noqa: E402  (conftest puts scripts/ on the path)
from airflow_tf.plugins.links import run_name

from stack.conftest import ARTIFACTS, USERNAME, AirflowAPI

# The module's first test also sets up both teams' stack and DAG runs (six minutes unloaded,
# over ten on a loaded machine): beyond the suite's 600 s a test.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TEAM_DAG_FILE = Path(__file__).parent / "team_dags" / "tf_team_training.py"
TEAMS = ("team_a", "team_b")
DAG_KINDS = ("", "_returns", "_probe")
"""The DAGs of each team's bundle: tf_<team>, tf_<team>_returns, tf_<team>_probe."""
OS_USERS = {team: f"airflow-tf-{team.replace('_', '-')}" for team in TEAMS}
"""Each team's OS user: the only one that may write its storage root."""
USERS = {"alice": "team_a", "bob": "team_b"}
LAUNCH = "launch"
SMALL_STEPS = 300


class TeamStack:
    def __init__(self, airflow: AirflowStack, storage: Path, teams: dict[str, Path], passwords: dict[str, str]) -> None:
        self.airflow = airflow
        self.url = airflow.url
        self.storage = storage
        self.teams = teams
        """Each team's storage root."""
        self.passwords = passwords
        self.admin = AirflowAPI(airflow.url, USERNAME, airflow.password)

    def api(self, user: str) -> AirflowAPI:
        return AirflowAPI(self.url, user, self.passwords[user])

    @property
    def roots(self) -> dict[str, str]:
        """TensorBoard's run roots, as the plugin serves them (a team's runs under its name)."""
        return {team: str(root / "runs") for team, root in self.teams.items()}


class OsUsers:
    """The teams' OS users for the module: created (or found left by an interrupted run), given
    traverse (x) on the directories leading to the interpreter that others may not enter, and
    removed with their ACL entries at the end."""

    def __init__(self, homes: dict[str, Path]) -> None:
        self.homes = homes
        self.acl: list[tuple[str, str]] = []

    def __enter__(self) -> OsUsers:
        for team, user in OS_USERS.items():
            try:
                pwd.getpwnam(user)
            except KeyError:
                subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", str(self.homes[team]),
                                "--shell", "/usr/sbin/nologin", user], check=True)
        closed = {str(parent) for path in (Path(os.path.realpath(sys.executable)), Path(sys.prefix).resolve())
                  for parent in path.parents if not os.stat(parent).st_mode & stat.S_IXOTH}
        for directory in sorted(closed):
            for user in OS_USERS.values():
                subprocess.run(["setfacl", "-m", f"u:{user}:x", directory], check=True)
                self.acl.append((user, directory))
        return self

    def __exit__(self, *exc: object) -> None:
        for user, directory in self.acl:
            subprocess.run(["setfacl", "-x", f"u:{user}", directory], check=False)
        for user in OS_USERS.values():
            subprocess.run(["userdel", user], check=False, capture_output=True)

    @staticmethod
    def uid(team: str) -> int:
        return pwd.getpwnam(OS_USERS[team]).pw_uid


@pytest.fixture(scope="module")
def team_stack():
    # Not below pytest's own temporary directory (0700, root's): the teams' users parse the DAG
    # files of their bundles again after sudo, and write their roots.
    root = Path(tempfile.mkdtemp(prefix="airflow-tf-teams-"))
    root.chmod(0o755)
    storage = root / "storage"
    teams = {team: storage / team for team in TEAMS}
    with OsUsers(teams) as users:
        try:
            yield from _team_stack(root, storage, teams, users)
        finally:
            shutil.rmtree(root, ignore_errors=True)


def _team_stack(root: Path, storage: Path, teams: dict[str, Path], users: OsUsers):
    for team, team_root in teams.items():
        team_root.mkdir(parents=True)
        os.chown(team_root, users.uid(team), users.uid(team))
        team_root.chmod(0o700)  # its team's user alone (the API server reads it as root here)
    bundles = []
    for team in TEAMS:
        folder = root / "bundles" / team
        folder.mkdir(parents=True)
        (folder / TEAM_DAG_FILE.name).symlink_to(TEAM_DAG_FILE)
        bundles.append({"name": f"{team}-dags", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                        "kwargs": {"path": str(folder)}, "team_name": team})
    (root / "dags").mkdir()  # every DAG is in a team's bundle
    home = root / "airflow"
    home.mkdir()
    passwords = {user: secrets.token_urlsafe(12) for user in USERS}
    (home / "passwords.json").write_text(json.dumps(passwords))
    pg_parent = Path(tempfile.mkdtemp(prefix="airflow-tf-pg-"))
    pg_parent.chmod(0o755)  # PostgreSQL runs as 'postgres', which cannot enter pytest's private tmp dirs
    airflow = AirflowStack(
        home, root / "dags", postgres_dir=pg_parent / "data",
        env={
            "AIRFLOW_TF_STORAGE": str(storage / "shared"),  # no team writes there: every DAG is a team's
            "AIRFLOW_TF_TEAMS": json.dumps({team: {"storage": str(path)} for team, path in teams.items()}),
            **{f"AIRFLOW_TF_TEST_USER_{team.upper()}": user for team, user in OS_USERS.items()},
            "AIRFLOW__CORE__MULTI_TEAM": "True",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                [f"{USERNAME}:admin", *(f"{user}:viewer:{team}" for user, team in USERS.items())]),
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
        },
        setup=(("teams", "sync"),),  # the bundles' teams, before the auth manager checks its users' teams
    )
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        airflow.start()
        yield TeamStack(airflow, storage, teams, passwords)
    finally:
        airflow.stop()
        for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
            log = airflow.home / "logs" / f"{component}.log"
            if log.exists():
                shutil.copy(log, ARTIFACTS / f"team-stack-{component}.log")
        shutil.rmtree(pg_parent, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_team_training_left(request):
    """After each test, no process of a training group this stack started may be running."""
    yield
    if "team_stack" not in request.fixturenames:
        return
    request.getfixturevalue("team_stack")
    deadline = time.monotonic() + 10.0
    while (left := team_training_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in left:
        proc.kill()
    assert not left, f"training processes left running: {[p.pid for p in left]}"


def team_training_processes() -> list[psutil.Process]:
    """Live processes of the training groups this stack's teams launched (their supervisors and
    runtime tasks): they run as the teams' OS users, which exist for this module only."""
    uids = {OsUsers.uid(team) for team in TEAMS}
    found = []
    for proc in psutil.process_iter(["cmdline", "status", "uids"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if (proc.info["status"] != psutil.STATUS_ZOMBIE and proc.info["uids"] and proc.info["uids"].real in uids
                and ("airflow_tf.runtime" in cmdline or "airflow_tf.backends.local.supervisor" in cmdline
                     or cmdline.startswith("airflow-tf "))):  # a task's title
            found.append(proc)
    return found


def launch_result(api: AirflowAPI, dag_id: str, run_id: str) -> dict:
    return api.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{LAUNCH}/xcomEntries/return_value",
                    params={"deserialize": "true"})["value"]


@pytest.fixture(scope="module")
def trained(team_stack) -> dict[str, dict]:
    """Both teams' DAGs trained once: per DAG id, its run id, TensorBoard run name, run dir and group."""
    admin = team_stack.admin
    runs = {}
    for team in TEAMS:
        dag_id = f"tf_{team}"
        admin.wait_for_dag(dag_id, timeout=300)
        admin.unpause(dag_id)
        runs[dag_id] = admin.trigger(dag_id, conf={"steps": SMALL_STEPS})
    found = {}
    for dag_id, run_id in runs.items():
        run = admin.wait_for_run(dag_id, run_id, timeout=1200)
        assert run["state"] == "success", admin.failure_report(dag_id, run_id)
        result = launch_result(admin, dag_id, run_id)
        name = run_name(result["run_dir"], team_stack.roots)
        assert name, result
        found[dag_id] = {"run_id": run_id, "name": name, "run_dir": result["run_dir"],
                         "group": Path(result["run_dir"]).name}
    return found


def get(api: AirflowAPI | None, url: str, **kwargs) -> requests.Response:
    session = api.session if api else requests
    return session.get(url, timeout=120, **kwargs)


def loaded(api: AirflowAPI, url: str, run: str, timeout: float = 120.0) -> requests.Response:
    """``/tensorboard/data/runs`` once it lists ``run``: TensorBoard loads the runs in the
    background after its first request, and again every 5 s."""
    deadline = time.monotonic() + timeout
    while True:
        listed = get(api, f"{url}/tensorboard/data/runs")
        if listed.status_code != 200 or run in listed.json() or time.monotonic() > deadline:
            return listed
        time.sleep(2)


def test_airflows_own_api_grants_each_user_one_dag(team_stack, trained):
    for user, team in USERS.items():
        api = team_stack.api(user)
        dags = {d["dag_id"] for d in api.call("GET", "/dags")["dags"]}
        assert dags == {f"tf_{team}{kind}" for kind in DAG_KINDS}, (user, dags)
    assert {d["dag_id"] for d in team_stack.admin.call("GET", "/dags")["dags"]} == {
        f"tf_{team}{kind}" for team in TEAMS for kind in DAG_KINDS}


def test_tensorboard_shows_each_user_only_the_runs_of_the_dags_they_may_read(team_stack, trained):
    url = team_stack.url
    a, b = trained["tf_team_a"]["name"], trained["tf_team_b"]["name"]
    users = {user: team_stack.api(user) for user in USERS}

    assert get(None, f"{url}/tensorboard/data/runs").status_code == 401
    assert get(None, f"{url}/tensorboard/data/plugin/scalars/scalars", params={"run": a, "tag": "loss"}).status_code == 401

    for user, api, own, other in (("alice", users["alice"], a, b), ("bob", users["bob"], b, a)):
        listed = loaded(api, url, own)
        assert listed.status_code == 200 and own in listed.json() and other not in listed.json(), (user, listed.text)
        tags = get(api, f"{url}/tensorboard/data/plugin/scalars/tags").json()
        assert own in tags and other not in tags, (user, tags)
        curve = get(api, f"{url}/tensorboard/data/plugin/scalars/scalars", params={"run": own, "tag": "loss"})
        assert curve.status_code == 200 and len(curve.json()) >= 2, (user, curve.text[:500])
        # The other team's run answers exactly like a run that does not exist.
        theirs = get(api, f"{url}/tensorboard/data/plugin/scalars/scalars", params={"run": other, "tag": "loss"})
        missing = get(api, f"{url}/tensorboard/data/plugin/scalars/scalars",
                      params={"run": "tf-no-such-run", "tag": "loss"})
        assert theirs.status_code == missing.status_code == 404, (user, theirs.text, missing.text)
        assert theirs.text.replace(other, "tf-no-such-run") == missing.text
        # The time-series page's data (what the UI draws) and the DAG-run view follow the same rule.
        series = api.session.post(f"{url}/tensorboard/data/plugin/timeseries/timeSeries", timeout=120,
                                  data={"requests": json.dumps([{"plugin": "scalars", "tag": "loss"}])})
        assert series.status_code == 200, series.text[:500]
        [answer] = series.json()
        assert own in answer["runToSeries"] and other not in answer["runToSeries"], (user, answer)
        other_dag = "tf_team_b" if user == "alice" else "tf_team_a"
        view = get(api, f"{url}/tensorboard/airflow/dag-run", allow_redirects=False,
                   params={"dag_id": other_dag, "run_id": trained[other_dag]["run_id"]})
        assert view.status_code == 404, view.text

    admin = team_stack.admin
    listed = get(admin, f"{url}/tensorboard/data/runs").json()
    assert {a, b} <= set(listed), listed
    for name in (a, b):
        assert get(admin, f"{url}/tensorboard/data/plugin/scalars/scalars",
                   params={"run": name, "tag": "loss"}).status_code == 200


def test_the_training_view_lists_each_user_only_the_groups_of_the_dags_they_may_read(team_stack, trained):
    url = team_stack.url
    assert get(None, f"{url}/training/api/groups").status_code == 401
    assert get(None, f"{url}/training/").status_code == 401
    for user, team in USERS.items():
        groups = get(team_stack.api(user), f"{url}/training/api/groups").json()["groups"]
        assert [g["dag_id"] for g in groups] == [f"tf_{team}"], (user, groups)
        [group] = groups
        mine = trained[f"tf_{team}"]
        assert group["run_id"] == mine["run_id"] and group["group"] == mine["group"]
        assert group["state"] == "succeeded" and group["backend"] == "local" and group["map_index"] == -1
        assert group["global_step"] >= SMALL_STEPS and group["target_step"] == SMALL_STEPS and group["percent"] == 100
        assert group["examples_per_sec"] > 0 and group["loss"] is not None and group["failure_reason"] is None
        assert unquote(group["log_url"]) == f"{url}/dags/tf_{team}/runs/{mine['run_id']}/tasks/wait_for_workers"
        assert mine["name"] in unquote(group["tensorboard_url"]).replace("\\", "")
    admin = get(team_stack.admin, f"{url}/training/api/groups").json()["groups"]
    assert sorted(g["dag_id"] for g in admin) == ["tf_team_a", "tf_team_b"], admin
    page = get(team_stack.api("alice"), f"{url}/training/")
    assert page.status_code == 200 and "Training groups" in page.text


@pytest.mark.timeout(2400)
def test_in_chromium_a_signed_in_user_sees_a_running_groups_step_move_and_signed_out_is_refused(
        team_stack, trained, browser):
    url, admin = team_stack.url, team_stack.admin
    # Long enough to watch its step move over a few of the view's refreshes (every 3 s) even at the
    # fastest this machine trains it (about 1,000 steps/s seen; the small run's own examples/s, its
    # start included, said 8), and no more: every step is CPU the other tests wait for.
    steps = 10_000
    run_id = admin.trigger("tf_team_a", conf={"steps": steps})

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.set_default_navigation_timeout(180_000)
    screenshot = ARTIFACTS / "ui-training-view.png"
    screenshot.unlink(missing_ok=True)
    try:
        page.goto(url)
        page.get_by_label("Username").fill("alice")
        page.get_by_label("Password").fill(team_stack.passwords["alice"])
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda u: "/login" not in u and u.startswith(url))
        page.goto(f"{url}/plugin/training")
        frame = page.frame_locator("iframe")
        running = frame.locator("tr[data-state=running]").filter(has_text=run_id).locator("td.step")
        running.wait_for(timeout=600_000)  # the run is queued, prepared, launched; then the chief reports
        # Then followed whatever its state: on a machine faster than the estimate the group may
        # finish (its last step shown, the row "succeeded") between two refreshes.
        step = frame.locator("tr").filter(has_text=run_id).locator("td.step")
        deadline, first = time.monotonic() + 300, None
        while time.monotonic() < deadline:
            text = step.inner_text(timeout=60_000).strip()
            if text:
                current = int(text.split("/")[0])
                if first is None:
                    first = current
                    assert first < steps, f"the group was at its last step ({steps}) when first shown: raise steps"
                elif current > first:
                    break
            page.wait_for_timeout(1000)
        else:
            raise AssertionError(f"the step stayed at {first} for 300 s")
        assert step.inner_text().strip().endswith(f"/ {steps}")
        page.screenshot(path=str(screenshot), full_page=True)
        assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # Only her team's groups: bob's DAG is not listed.
        assert page.frame_locator("iframe").locator("tr").filter(has_text="tf_team_b").count() == 0
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "ui-training-view-error.png"), full_page=True)
        raise
    finally:
        context.close()

    anonymous = browser.new_context()
    try:
        response = anonymous.new_page().goto(f"{url}/training/")
        assert response.status == 401, response.status
    finally:
        anonymous.close()

    run = admin.wait_for_run("tf_team_a", run_id, timeout=1200)
    assert run["state"] == "success", admin.failure_report("tf_team_a", run_id)


def returned_by_team_a(team_stack, *values: dict) -> list[str]:
    """Runs of team_a's ``tf_team_a_returns`` (side by side), whose task returned each of
    ``values``; their run ids."""
    admin = team_stack.admin
    admin.wait_for_dag("tf_team_a_returns", timeout=300)
    admin.unpause("tf_team_a_returns")
    run_ids = [admin.trigger("tf_team_a_returns", conf={"value": value}) for value in values]
    for run_id in run_ids:
        run = admin.wait_for_run("tf_team_a_returns", run_id, timeout=600)
        assert run["state"] == "success", admin.failure_report("tf_team_a_returns", run_id)
    return run_ids


def scalars(team_stack, user: str, run: str) -> requests.Response:
    return get(team_stack.api(user), f"{team_stack.url}/tensorboard/data/plugin/scalars/scalars",
               params={"run": run, "tag": "loss"})


def test_a_launch_result_returned_by_another_teams_task_claims_neither_the_run_nor_a_directory_in_it(
        team_stack, trained):
    """team_a's DAG author returns values shaped like launch results naming team_b's run (a
    lock-out of bob) and a directory inside it (a way into its evaluation curves): both are
    ignored, logged, and change nothing anyone sees."""
    url, b = team_stack.url, trained["tf_team_b"]
    eval_dir = Path(b["run_dir"]) / "eval"
    eval_dir.mkdir()
    for events in Path(b["run_dir"]).glob("events.out.tfevents.*"):
        shutil.copy(events, eval_dir / events.name)  # curves inside team_b's run, as an evaluation writes them
    genuine = launch_result(team_stack.admin, "tf_team_b", b["run_id"])
    forged_runs = returned_by_team_a(team_stack, *({**genuine, "run_dir": run_dir}
                                                   for run_dir in (b["run_dir"], str(eval_dir))))
    time.sleep(6)  # past the plugin's 5 s reuse of the launches it read

    for run in (b["name"], f"{b['name']}/eval"):
        assert scalars(team_stack, "alice", run).status_code == 404, run
        assert scalars(team_stack, "bob", run).status_code == 200, run  # bob keeps his run
    listed = get(team_stack.api("alice"), f"{url}/tensorboard/data/runs").json()
    assert not any(name.startswith(b["name"]) for name in listed), listed
    assert {b["name"], f"{b['name']}/eval"} <= set(get(team_stack.api("bob"), f"{url}/tensorboard/data/runs").json())
    for user, team in USERS.items():
        groups = get(team_stack.api(user), f"{url}/training/api/groups").json()["groups"]
        assert {g["dag_id"] for g in groups} == {f"tf_{team}"}, (user, groups)  # no row of the forger's DAG
        assert (b["group"] in {g["group"] for g in groups}) == (team == "team_b"), (user, groups)
    log = (team_stack.airflow.home / "logs" / "api-server.log").read_text(errors="replace")
    for run_id in forged_runs:
        assert f"ignoring the launch result returned by tf_team_a_returns/{run_id}/returns" in log, run_id


def test_a_malformed_launch_result_breaks_no_ones_views(team_stack, trained):
    """team_a's DAG author returns launch-shaped values of the wrong types: each is skipped, and
    every user's TensorBoard, Training view and DAG-run view answer as before."""
    url, a = team_stack.url, trained["tf_team_a"]
    genuine = launch_result(team_stack.admin, "tf_team_a", a["run_id"])
    returned_by_team_a(team_stack, {**genuine, "run_dir": 123}, {**genuine, "run_dir": ["x"]},
                       {**genuine, "group": "x"}, {**genuine, "run_dir": "../../etc"})
    time.sleep(6)  # past the plugin's 5 s reuse of the launches it read
    for user, team in USERS.items():
        api, own = team_stack.api(user), trained[f"tf_{team}"]
        assert get(api, f"{url}/tensorboard/data/runs").status_code == 200, user
        assert scalars(team_stack, user, own["name"]).status_code == 200, user
        groups = get(api, f"{url}/training/api/groups")
        assert groups.status_code == 200 and own["group"] in {g["group"] for g in groups.json()["groups"]}, user
        view = get(api, f"{url}/tensorboard/airflow/dag-run", allow_redirects=False,
                   params={"dag_id": f"tf_{team}", "run_id": own["run_id"]})
        assert view.status_code == 307, (user, view.text)


def test_a_link_out_of_a_run_does_not_serve_the_other_run(team_stack, trained):
    a, b = trained["tf_team_a"], trained["tf_team_b"]
    link = Path(a["run_dir"]) / "link"
    link.symlink_to(b["run_dir"])
    try:
        assert scalars(team_stack, "alice", f"{a['name']}/link").status_code == 404
        assert scalars(team_stack, "alice", a["name"]).status_code == 200  # her own run still is
        listed = get(team_stack.api("alice"), f"{team_stack.url}/tensorboard/data/runs").json()
        assert f"{a['name']}/link" not in listed, listed
    finally:
        link.unlink()


def probe_as(team_stack, team: str, read: list[str], write: list[str]) -> dict:
    """What a task of ``team``'s DAG got from the kernel for each path (see tf_<team>_probe)."""
    admin, dag_id = team_stack.admin, f"tf_{team}_probe"
    admin.wait_for_dag(dag_id, timeout=300)
    admin.unpause(dag_id)
    run_id = admin.trigger(dag_id, conf={"read": read, "write": write})
    run = admin.wait_for_run(dag_id, run_id, timeout=600)
    assert run["state"] == "success", admin.failure_report(dag_id, run_id)
    return admin.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/probe/xcomEntries/return_value",
                      params={"deserialize": "true"})["value"]


def test_a_teams_task_can_neither_read_nor_write_the_other_teams_runs(team_stack, trained):
    """team_a's DAG author runs code as team_a's user: team_b's run, its events, its record and
    the name of its next run are out of reach, directly or through a link in team_a's own root."""
    a, b = trained["tf_team_a"], trained["tf_team_b"]
    own, theirs = team_stack.teams["team_a"], team_stack.teams["team_b"]
    events = next(Path(b["run_dir"]).glob("events.out.tfevents.*"))
    link = Path(a["run_dir"]) / "their-run"
    link.symlink_to(b["run_dir"])  # as a DAG author of team_a could make it in team_a's run
    try:
        outcome = probe_as(team_stack, "team_a",
                           read=[b["run_dir"], str(events), str(Path(b["run_dir"]) / "launched_by.json"),
                                 str(link), a["run_dir"]],
                           write=[f"{theirs}/runs/tf_team_b-next/", f"{b['run_dir']}/forged.json",
                                  f"{theirs}/runs/forged-link/", f"{own}/runs/scratch/"])
    finally:
        link.unlink()
    assert outcome.pop("uid") == OsUsers.uid("team_a"), "the task ran as team_a's user"
    assert outcome.pop(f"read {a['run_dir']}") == "done" and outcome.pop(f"write {own}/runs/scratch/") == "done"
    assert outcome and set(outcome.values()) == {"PermissionError"}, outcome
    assert not (theirs / "runs" / "tf_team_b-next").exists() and not (Path(b["run_dir"]) / "forged.json").exists()


@pytest.mark.timeout(1800)  # a DAG run of four tasks, each a process started through sudo
def test_a_launch_into_the_other_teams_root_is_refused_and_creates_nothing_there(team_stack, trained):
    admin, theirs = team_stack.admin, team_stack.teams["team_b"]
    squat = theirs / "runs" / "squatted-by-team-a"
    run_id = admin.trigger("tf_team_a", conf={"steps": 20, "run_dir": str(squat)})
    run = admin.wait_for_run("tf_team_a", run_id, timeout=1200)
    assert run["state"] == "failed"
    assert admin.task_instances("tf_team_a", run_id)["launch"]["state"] == "failed"
    # The exception's message is in the log event's error details, not its text.
    log = admin.call("GET", f"/dags/tf_team_a/dagRuns/{run_id}/taskInstances/launch/logs/1",
                     params={"full_content": "true"}, headers={"Accept": "application/json"})["content"]
    refusal = f"run_dir {squat} lies outside this team's storage root {team_stack.teams['team_a']}"
    assert refusal in json.dumps(log), admin.failure_report("tf_team_a", run_id)
    assert not squat.exists()


def test_the_storage_root_is_not_shown_to_viewers(team_stack, trained):
    storage = str(team_stack.storage)
    for path in ("/tensorboard/data/logdir", "/tensorboard/data/environment"):
        answer = get(team_stack.api("alice"), f"{team_stack.url}{path}")
        assert answer.status_code == 200 and storage not in answer.text, (path, answer.text)
    assert get(team_stack.api("alice"), f"{team_stack.url}/tensorboard/data/logdir").json() == {"logdir": ""}
