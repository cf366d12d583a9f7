"""What another team's DAG (or its training code, which writes files in its own run directory)
can put in front of the views and the launch, and what they make of it: a malformed launch
result or record is skipped and logged, never an error for everyone; a file reached through a
link, ``..`` or a hard link is not read; a run directory someone put under the next run's name
first, or a path that resolves elsewhere than it reads, is not launched into.

Real files, links and hard links in a temporary directory; the request path through the
mounted apps is in tests/plugins/test_tensorboard_plugin.py."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
from airflow_tf.backends.ownership import RUN_RECORD, RunDirTakenError, RunLaunch, claim_run_dir, run_launch
from airflow_tf.cluster.results import LaunchResult
from airflow_tf.files import UnsafePathError
from airflow_tf.plugins import access
from airflow_tf.plugins.access import Launch, _launched_it, run_owners
from airflow_tf.plugins.links import run_name
from airflow_tf.plugins.training_view import training_rows

A_LAUNCH = RunLaunch("team_a", "manual__1", "training.launch", -1)
B_LAUNCH = RunLaunch("team_b", "manual__1", "training.launch", -1)


def launch_of(who: RunLaunch, run_dir: object) -> Launch:
    """A launch result as a task returned it, built without from_dict's checks (as a forger's would be)."""
    name = run_dir.rsplit("/", 1)[-1] if isinstance(run_dir, str) else "tf-g"
    result = LaunchResult(group={"backend": "local", "name": name}, run_dir=run_dir, dataset="/d",  # type: ignore[arg-type]
                          training={})
    return Launch(who.dag_id, who.run_id, who.task_id, who.map_index, result, time.time())


@pytest.fixture(autouse=True)
def fresh_log_memory(monkeypatch):
    monkeypatch.setattr(access, "_IGNORED", type(access._IGNORED)())


# -- malformed launch results and records ----------------------------------------------------

@pytest.mark.parametrize(("change", "why"), [
    ({"run_dir": 123}, "run_dir must be str, got int 123"),
    ({"group": "tf-g"}, "group must be dict"),
    ({"group": {"backend": "local"}}, "group must name its group"),
    ({"training": [1]}, "training must be dict"),
    ({"map_index": "0"}, "map_index must be int"),
    ({"map_index": True}, "map_index must be int, got bool"),
    ({"code_hash": 7}, "code_hash must be str or null"),
])
def test_a_launch_result_of_the_wrong_types_is_refused_naming_the_field(change, why):
    good = {"group": {"backend": "local", "name": "tf-g"}, "run_dir": "/runs/tf-g", "dataset": "/d", "training": {}}
    assert LaunchResult.from_dict(good).run_dir == "/runs/tf-g"
    with pytest.raises(ValueError, match=f"LaunchResult: {why}"):
        LaunchResult.from_dict({**good, **change})


@pytest.mark.parametrize("run_dir", [123, None, ["/runs/x"], "relative/tf-x", "/runs/tf-a/../tf-b", "/runs/./tf-a"])
def test_a_run_dir_that_is_not_a_plain_absolute_path_names_no_run_and_is_skipped_with_a_log(run_dir, tmp_path,
                                                                                            caplog):
    assert run_name(run_dir, {"": "/runs"}) is None  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger=access.log.name):
        for _ in range(3):  # read again every few seconds: logged once
            assert not _launched_it(launch_of(A_LAUNCH, run_dir))
    [record] = caplog.records
    assert "ignoring the launch result returned by team_a/manual__1/training.launch" in record.getMessage()


@pytest.mark.parametrize(("record", "why"), [
    ({"dag_id": "team_a", "run_id": "manual__1", "task_id": "training.launch", "map_index": "-1"},
     "map_index must be an integer"),
    ({"dag_id": ["team_a"], "run_id": "manual__1", "task_id": "training.launch", "map_index": -1},
     "dag_id must be a non-empty string"),
    ({"dag_id": "team_a", "run_id": "manual__1", "map_index": -1}, "task_id must be a non-empty string"),
    (["team_a"], "expected a JSON object"),
    ("{not json", "not valid JSON"),
])
def test_a_run_record_of_the_wrong_shape_is_not_trusted(tmp_path, record, why, caplog):
    run = tmp_path / "runs" / "tf-a"
    run.mkdir(parents=True)
    (run / RUN_RECORD).write_text(record if isinstance(record, str) else json.dumps(record))
    with pytest.raises(ValueError, match=why):
        run_launch(run)
    with caplog.at_level("WARNING", logger=access.log.name):
        assert not _launched_it(launch_of(A_LAUNCH, str(run)))
    assert why.split()[0] in caplog.text


def test_a_run_record_reached_through_a_link_or_hard_link_is_not_trusted(tmp_path):
    """A record names the launch that may claim the run: one that is another file (anywhere,
    even a record the launch really wrote) is not this directory's."""
    elsewhere = tmp_path / "elsewhere"
    claim_run_dir(elsewhere, A_LAUNCH)
    runs = tmp_path / "runs"
    for name in ("tf-link", "tf-hard", "tf-through", "tf-loop", "tf-dir"):
        (runs / name).mkdir(parents=True)
    (runs / "tf-link" / RUN_RECORD).symlink_to(elsewhere / RUN_RECORD)
    os.link(elsewhere / RUN_RECORD, runs / "tf-hard" / RUN_RECORD)
    (runs / "tf-through" / "run").symlink_to(elsewhere)
    (runs / "tf-loop" / RUN_RECORD).symlink_to(runs / "tf-loop" / RUN_RECORD)  # a link loop
    (runs / "tf-dir" / RUN_RECORD).mkdir()
    for run_dir, why in [(runs / "tf-link", "symbolic link"), (runs / "tf-hard", "2 hard links"),
                         (runs / "tf-through" / "run", "symbolic link"), (runs / "tf-loop", "symbolic link"),
                         (runs / "tf-dir", "not a regular file")]:
        with pytest.raises(UnsafePathError, match=why):
            run_launch(run_dir)
        assert not _launched_it(launch_of(A_LAUNCH, str(run_dir)))


def test_a_dot_dot_path_through_a_link_does_not_claim_the_run_it_reads_as(tmp_path):
    """``<own run>/link/../../<their run>`` reads as their run, while the kernel resolves it
    inside her own (where her training code wrote a record naming her task)."""
    runs = tmp_path / "runs"
    claim_run_dir(runs / "tf-b-1", B_LAUNCH)
    claim_run_dir(runs / "tf-a-1", A_LAUNCH)
    (runs / "tf-a-1" / "x" / "y").mkdir(parents=True)
    (runs / "tf-a-1" / "link").symlink_to(runs / "tf-a-1" / "x" / "y")
    forger = RunLaunch("team_a", "manual__1", "forge", -1)
    (runs / "tf-a-1" / "tf-b-1").mkdir()
    (runs / "tf-a-1" / "tf-b-1" / RUN_RECORD).write_text(json.dumps(forger.__dict__))
    forged = launch_of(forger, f"{runs}/tf-a-1/link/../../tf-b-1")
    assert not _launched_it(forged)
    assert run_name(forged.result.run_dir, str(runs)) is None
    assert _launched_it(launch_of(B_LAUNCH, f"{runs}/tf-b-1"))


# -- the launch's run directory: created, never squatted ------------------------------------

def test_a_link_put_under_the_next_runs_name_is_not_written_through(tmp_path):
    runs, target = tmp_path / "runs", tmp_path / "their-files"
    target.mkdir()
    runs.mkdir()
    (runs / "tf-next").symlink_to(target)
    with pytest.raises(RunDirTakenError, match=rf"run_dir {runs}/tf-next is a symbolic link \(to {target}\).*"
                                                r"Remove it if it is stale"):
        claim_run_dir(runs / "tf-next", A_LAUNCH)
    assert os.listdir(target) == []


def test_a_directory_another_user_made_under_the_next_runs_name_is_not_taken_over(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory of another uid")  # the suite runs as root here
    squatted = tmp_path / "runs" / "tf-next"
    squatted.mkdir(parents=True)
    os.chown(squatted, 54321, 54321)
    with pytest.raises(RunDirTakenError, match=rf"run_dir {squatted} exists and belongs to uid 54321 \(no launch "
                                               rf"record\), not to uid 0"):
        claim_run_dir(squatted, A_LAUNCH)
    claim_run_dir(tmp_path / "runs" / "tf-b", B_LAUNCH)
    os.chown(tmp_path / "runs" / "tf-b", 54321, 54321)  # even the same DAG's, made by another user
    with pytest.raises(RunDirTakenError, match=r"belongs to uid 54321 \(launched by team_b/manual__1/"):
        claim_run_dir(tmp_path / "runs" / "tf-b", RunLaunch("team_b", "scheduled__2", "training.launch", -1))
    assert not (squatted / RUN_RECORD).exists()


def test_an_existing_directory_without_a_record_is_taken_only_when_empty(tmp_path):
    runs = tmp_path / "runs"
    (runs / "tf-filled").mkdir(parents=True)
    (runs / "tf-filled" / "checkpoint").write_text("someone's")
    with pytest.raises(RunDirTakenError, match=rf"run_dir {runs}/tf-filled exists with no launch record and files "
                                               "in it: no launch of team_a made it"):
        claim_run_dir(runs / "tf-filled", A_LAUNCH)
    (runs / "tf-empty").mkdir()  # as a try stopped between making it and recording itself leaves it
    claim_run_dir(runs / "tf-empty", A_LAUNCH)
    assert run_launch(runs / "tf-empty") == A_LAUNCH


def test_a_run_dir_that_resolves_elsewhere_than_it_reads_is_refused(tmp_path):
    storage, elsewhere = tmp_path / "storage", tmp_path / "elsewhere"
    elsewhere.mkdir()
    storage.mkdir()
    (storage / "runs").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match=rf"run_dir {storage}/runs/tf-a: {storage}/runs is a symbolic link.*"
                                              rf"\({elsewhere}/tf-a\); give run_dir \(or the storage root\) as that "
                                              "resolved path"):
        claim_run_dir(storage / "runs" / "tf-a", A_LAUNCH)
    assert os.listdir(elsewhere) == []
    (storage / "real").mkdir()
    for bad, why in [(f"{storage}/real/../runs/tf-a", r"'\.' and '\.\.' are not followed"),
                     ("runs/tf-a", "not an absolute path")]:
        with pytest.raises(UnsafePathError, match=why):
            claim_run_dir(bad, A_LAUNCH)
    assert os.listdir(elsewhere) == [] and not Path("runs").exists()


# -- the Training view's progress ------------------------------------------------------------

def test_the_training_view_reads_no_progress_through_a_link_or_hard_link_nor_of_the_wrong_shape(tmp_path, monkeypatch,
                                                                                                  caplog):
    monkeypatch.setenv("AIRFLOW_TF_STORAGE", str(tmp_path))
    runs, now = tmp_path / "runs", time.time()
    (runs / "tf-b").mkdir(parents=True)
    (runs / "tf-b" / "progress.json").write_text(json.dumps({"global_step": 777, "target_step": 1000,
                                                             "loss": 0.123, "time": now}))
    for name in ("tf-link", "tf-hard", "tf-shape", "tf-nan", "tf-own"):
        (runs / name).mkdir()
    (runs / "tf-link" / "progress.json").symlink_to(runs / "tf-b" / "progress.json")
    os.link(runs / "tf-b" / "progress.json", runs / "tf-hard" / "progress.json")
    (runs / "tf-shape" / "progress.json").write_text(json.dumps({"global_step": 5, "time": "yesterday"}))
    (runs / "tf-nan" / "progress.json").write_text('{"global_step": 5, "loss": NaN, "eta_seconds": Infinity}')
    (runs / "tf-own" / "progress.json").write_text(json.dumps({"global_step": 42, "target_step": 100}))
    launches = [launch_of(A_LAUNCH, f"{runs}/{name}") for name in ("tf-link", "tf-hard", "tf-shape", "tf-nan",
                                                                     "tf-own")]
    with caplog.at_level("WARNING", logger=access.log.name):
        rows = training_rows(launches, {}, now=now)
        training_rows(launches, {}, now=now)
    steps = {row["group"]: row["global_step"] for row in rows}
    assert steps == {"tf-link": None, "tf-hard": None, "tf-shape": None, "tf-nan": None, "tf-own": 42}
    json.dumps(rows, allow_nan=False)  # what the view answers: no NaN or infinity in it
    assert all(not isinstance(row["last_update"], str) and math.isfinite(row["last_update"]) for row in rows)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 4, messages  # each file once, though read twice
    assert any("progress.json is a symbolic link" in m for m in messages)
    assert any("has 2 hard links" in m for m in messages)
    assert any("time must be a finite number, got 'yesterday'" in m for m in messages)
    assert any("loss must be a finite number, got nan" in m for m in messages)


def test_run_owners_leave_out_what_names_no_run(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_TF_STORAGE", str(tmp_path))
    monkeypatch.delenv("AIRFLOW_TF_TEAMS", raising=False)
    runs = tmp_path / "runs"
    owners = run_owners([launch_of(B_LAUNCH, f"{runs}/tf-b-1"), launch_of(A_LAUNCH, f"{runs}/tf-a/x/../../tf-b-1"),
                         launch_of(A_LAUNCH, "runs/tf-b-1"), launch_of(A_LAUNCH, 123)])
    assert owners == {"tf-b-1": {"team_b"}}
