"""Storage per team ([airflow_tf] teams): each task of a team's DAG run writes under its team's
root, a task of no team or of a team left out is refused, and the views name a run after the
team whose root holds it, so a run in one team's root never counts as another team's."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from airflow_tf.plugins.access import Access
from airflow_tf.plugins.links import run_name, split_run_name
from airflow_tf.storage import check_in_team_root, runs_dir, state_dir, storage_root, team_of, teams

from airflow.sdk.api.datamodels._generated import DagRun
from airflow.sdk.execution_time.context import set_current_context

needs_teams = pytest.mark.skipif("team_name" not in DagRun.model_fields,
                                 reason="this Airflow release has no teams (multi-team mode came in 3.2)")


@pytest.fixture
def two_teams(tmp_path, monkeypatch):
    roots = {"team_a": str(tmp_path / "a"), "team_b": str(tmp_path / "b")}
    monkeypatch.setenv("AIRFLOW_TF_TEAMS", json.dumps({team: {"storage": root} for team, root in roots.items()}))
    monkeypatch.setenv("AIRFLOW_TF_STORAGE", str(tmp_path / "shared"))
    monkeypatch.setenv("AIRFLOW_TF_STATE_DIR", str(tmp_path / "shared-groups"))
    return roots


def dag_run_of(team: str | None) -> DagRun:
    """The DAG run the API server hands a running task (with its DAG's team where Airflow has teams)."""
    now = datetime.now(timezone.utc)
    fields = {"team_name": team, "partition_key": None}
    return DagRun(dag_id="tf", run_id="manual__1", logical_date=now, data_interval_start=now, data_interval_end=now,
                  run_after=now, start_date=now, end_date=None, run_type="manual", state="running",
                  consumed_asset_events=[], **{k: v for k, v in fields.items() if k in DagRun.model_fields})


def in_task_of(team: str | None):
    """The context Airflow's task runner sets while a task of a DAG run of ``team`` executes."""
    return set_current_context({"dag_run": dag_run_of(team)})


@needs_teams
def test_the_task_learns_its_team_from_its_dag_run():
    assert team_of({"dag_run": dag_run_of("vision")}) == "vision"
    assert team_of({"dag_run": dag_run_of(None)}) is None
    assert team_of({}) is None


@needs_teams
def test_a_teams_task_writes_under_its_teams_root_and_keeps_its_groups_there(two_teams, tmp_path):
    with in_task_of("team_a"):
        assert storage_root() == two_teams["team_a"]
        assert runs_dir() == f"{two_teams['team_a']}/runs"
        assert state_dir() == f"{two_teams['team_a']}/groups", "another team's tasks may not see its groups"
    with in_task_of("team_b"):
        assert storage_root() == two_teams["team_b"]
    # Outside a task (the API server's views, the airflow-tf CLI): the shared settings.
    assert storage_root() == str(tmp_path / "shared")
    assert state_dir() == str(tmp_path / "shared-groups")


@needs_teams
def test_a_task_of_no_team_or_of_a_team_left_out_is_refused(two_teams):
    with in_task_of("team_c"), pytest.raises(ValueError, match=r"gives no storage to team 'team_c'.*team_a, team_b"):
        storage_root()
    with in_task_of(None), pytest.raises(ValueError, match=r"gives no storage to no team \(its DAG bundle has none\)"):
        runs_dir()


@needs_teams
def test_a_run_dir_outside_the_teams_root_is_refused(two_teams):
    with in_task_of("team_a"):
        check_in_team_root(f"{two_teams['team_a']}/runs/mine", "run_dir")
        check_in_team_root("gs://bucket/runs/mine", "run_dir")  # object storage: the bucket's own permissions
        for theirs in (f"{two_teams['team_b']}/runs/tf-b", f"file://{two_teams['team_b']}/runs/tf-b"):
            with pytest.raises(ValueError, match=r"run_dir .* lies outside this team's storage root .*/a"):
                check_in_team_root(theirs, "run_dir")
        # A '..' is refused whichever side it lands on: behind a link it would resolve elsewhere.
        for dotted in (f"{two_teams['team_a']}/../b/runs/tf-b", f"{two_teams['team_a']}/runs/x/../mine", "runs/mine"):
            with pytest.raises(ValueError, match=r"run_dir .*: .*give a plain absolute path under .*/a"):
                check_in_team_root(dotted, "run_dir")


@pytest.mark.parametrize("setting, error", [
    ("{", r"teams / \$AIRFLOW_TF_TEAMS is not JSON"),
    ('["team_a"]', r"expected a JSON object of teams, got list"),
    ('{"a": {"storage": "/x"}}', r"team 'a': not a team name"),
    ('{"team_a": "/x"}', r"team 'team_a': expected \{\"storage\": \"/absolute/root\"\}"),
    ('{"team_a": {"storage": "relative"}}', r"team 'team_a': storage must be an absolute path"),
    ('{"team_a": {"storage": "/x:y"}}', r"without ',' or ':'"),
    ('{"team_a": {"storage": "/x", "namespace": "ml"}}', r"team 'team_a': expected"),
    ('{"team_a": {"storage": "/x"}, "team_b": {"storage": "/x/b"}}', r"team 'team_b'.* lies inside team 'team_a'"),
])
def test_a_wrong_teams_setting_is_refused_naming_the_setting_and_the_team(monkeypatch, setting, error):
    monkeypatch.setenv("AIRFLOW_TF_TEAMS", setting)
    with pytest.raises(ValueError, match=error):
        teams()


def test_the_views_name_a_run_after_the_team_whose_root_holds_it(tmp_path):
    roots = {"team_a": str(tmp_path / "a" / "runs"), "team_b": str(tmp_path / "b" / "runs")}
    assert run_name(f"{roots['team_a']}/tf-1", roots) == "team_a/tf-1"
    assert run_name(f"file://{roots['team_b']}/tf-1/eval", roots) == "team_b/tf-1/eval"
    assert run_name(str(tmp_path / "shared" / "runs" / "tf-1"), roots) is None  # in no team's root: not served
    assert split_run_name("team_a/tf-1", roots) == ("team_a", "tf-1")
    assert split_run_name("team_c/tf-1", roots) is None and split_run_name("team_a", roots) is None
    for root in roots.values():
        (tmp_path / root / "tf-1").mkdir(parents=True)
    owners = {"team_a/tf-1": {"tf_team_a"}, "team_b/tf-1": {"tf_team_b"}}
    alice = Access(frozenset({"tf_team_a"}), every_dag=False, owners=owners, roots=roots)
    assert alice.may_read_run("team_a/tf-1") and alice.may_read_run("team_a/tf-1/eval")
    assert not alice.may_read_run("team_b/tf-1"), "the same group name in another team's root is that team's"
    admin = Access(frozenset({"tf_team_a", "tf_team_b"}), every_dag=True, owners=owners, roots=roots)
    assert admin.may_read_run("team_b/tf-1") and not admin.may_read_run("team_c/tf-1")
