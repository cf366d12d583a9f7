"""The per-DAG rule behind TensorBoard and the Training view (which runs a user may see, from what
the launches recorded), and the Training view's rows built from real progress.json files.

The real auth managers answering these questions on the real stack are in
tests/stack/test_per_dag_access_stack.py."""

from __future__ import annotations

import json
import time

from airflow_tf.cluster.progress import read_progress_file
from airflow_tf.cluster.results import LaunchResult
import pytest

from airflow_tf.backends.ownership import RunDirTakenError, RunLaunch, claim_run_dir, run_launch
from airflow_tf.files import UnsafePathError, read_beneath
from airflow_tf.plugins.access import Access, Launch, _launched_it, run_owners
from airflow_tf.plugins.training_view import Wait, training_rows


def launch(dag_id: str, run_dir: str, *, run_id: str = "manual__1", task_id: str = "training.launch",
           map_index: int = -1, recorded_at: float | None = None) -> Launch:
    result = LaunchResult(group={"backend": "local", "name": run_dir.rstrip("/").rsplit("/", 1)[-1]},
                          run_dir=run_dir, dataset="file:///data", training={})
    return Launch(dag_id, run_id, task_id, map_index, result, time.time() if recorded_at is None else recorded_at)


def test_a_run_is_readable_only_with_every_dag_that_recorded_it(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    monkeypatch.setenv("AIRFLOW_TF_STORAGE", str(tmp_path))
    owners = run_owners([
        launch("team_a", f"{runs}/tf-a-1"),
        launch("team_b", f"{runs}/tf-b-1"),
        # Another DAG's launch naming team_b's run directory does not open it to its own readers.
        launch("team_c", f"{runs}/tf-b-1"),
        launch("team_a", str(tmp_path / "elsewhere" / "tf-out")),  # outside runs/: not a TensorBoard run
    ])
    assert owners == {"tf-a-1": {"team_a"}, "tf-b-1": {"team_b", "team_c"}}
    alice = Access(frozenset({"team_a"}), every_dag=False, owners=owners, roots={"": str(runs)})
    assert alice.may_read_run("tf-a-1") and alice.may_read_run("tf-a-1/eval")  # a directory inside the run
    assert not alice.may_read_run("tf-b-1") and not alice.may_read_run("tf-b-1/eval")
    assert not alice.may_read_run("tf-from-the-cli")  # recorded by no launch
    assert not alice.may_read_run("tf-a-10")  # a name that only starts like hers
    bob = Access(frozenset({"team_b"}), every_dag=False, owners=owners, roots={"": str(runs)})
    assert not bob.may_read_run("tf-b-1") and not bob.may_read_run("tf-a-1")
    admin = Access(frozenset({"team_a", "team_b", "team_c"}), every_dag=True, owners=owners, roots={"": str(runs)})
    assert all(admin.may_read_run(name) for name in ("tf-a-1", "tf-b-1", "tf-from-the-cli"))


def test_a_launch_result_counts_only_when_the_run_directory_records_that_launch(tmp_path):
    runs = tmp_path / "runs"
    claim_run_dir(runs / "tf-b-1", RunLaunch("team_b", "manual__1", "training.launch", -1))
    (runs / "tf-b-1" / "eval").mkdir()
    assert _launched_it(launch("team_b", f"{runs}/tf-b-1"))
    assert _launched_it(launch("team_b", f"file://{runs}/tf-b-1"))
    # What any task of another DAG (or another run of the same one) can return: ignored.
    assert not _launched_it(launch("team_a", f"{runs}/tf-b-1"))
    assert not _launched_it(launch("team_b", f"{runs}/tf-b-1", run_id="manual__2"))
    assert not _launched_it(launch("team_b", f"{runs}/tf-b-1", map_index=0))
    assert not _launched_it(launch("team_a", f"{runs}/tf-b-1/eval"))  # a directory inside it
    assert not _launched_it(launch("team_a", f"{runs}/tf-from-the-cli"))  # no record at all


def test_ignored_launch_results_are_logged_once_and_remembered_within_a_bound(tmp_path, monkeypatch, caplog):
    from airflow_tf.plugins import access

    monkeypatch.setattr(access, "_IGNORED", type(access._IGNORED)())
    monkeypatch.setattr(access, "IGNORED_REMEMBERED", 3)
    forged = [launch("team_a", f"{tmp_path}/runs/tf-{n}", run_id=f"forged__{n}") for n in range(5)]
    with caplog.at_level("WARNING", logger=access.log.name):
        for _ in range(2):  # the launches are read again every few seconds
            assert not any(_launched_it(claim) for claim in forged[:2])
        assert len(caplog.records) == 2, "each ignored result is logged once"
        assert not any(_launched_it(claim) for claim in forged)
    assert len(access._IGNORED) == 3, "a flood of forged results keeps only the newest in memory"


def test_a_launch_cannot_take_another_dags_run_directory_or_one_inside_a_run(tmp_path):
    runs = tmp_path / "runs"
    first = RunLaunch("team_b", "manual__1", "training.launch", -1)
    claim_run_dir(runs / "tf-b-1", first)
    with pytest.raises(RunDirTakenError, match=r"belongs to a run of DAG team_b .*not of team_a"):
        claim_run_dir(runs / "tf-b-1", RunLaunch("team_a", "manual__1", "launch", -1))
    with pytest.raises(RunDirTakenError, match=r"is inside the run directory .*tf-b-1 \(launched by team_b/"):
        claim_run_dir(runs / "tf-b-1" / "eval", RunLaunch("team_a", "manual__1", "launch", -1))
    assert run_launch(runs / "tf-b-1") == first and not (runs / "tf-b-1" / "eval").exists()
    # The same DAG's next run resumes in place and now owns it.
    later = RunLaunch("team_b", "scheduled__2", "training.launch", -1)
    claim_run_dir(runs / "tf-b-1", later)
    assert run_launch(runs / "tf-b-1") == later


def test_a_run_reached_through_a_link_is_not_readable_and_a_linked_file_is_never_read(tmp_path):
    runs = tmp_path / "runs"
    for name in ("tf-a-1", "tf-b-1"):
        (runs / name).mkdir(parents=True)
        (runs / name / "events.out.tfevents.1").write_bytes(b"")
    (runs / "tf-a-1" / "link").symlink_to(runs / "tf-b-1")
    (runs / "tf-a-1" / "copied").mkdir()
    (runs / "tf-a-1" / "copied" / "events.out.tfevents.2").symlink_to(runs / "tf-b-1" / "events.out.tfevents.1")
    (runs / "tf-a-1" / "inner").mkdir()
    (runs / "tf-a-1" / "inner" / "events.out.tfevents.3").symlink_to(runs / "tf-a-1" / "events.out.tfevents.1")
    owners = {"tf-a-1": {"team_a"}, "tf-b-1": {"team_b"}}
    alice = Access(frozenset({"team_a"}), every_dag=False, owners=owners, roots={"": str(runs)})
    assert alice.may_read_run("tf-a-1") and alice.may_read_run("tf-a-1/inner") and alice.may_read_run("tf-a-1/copied")
    assert not alice.may_read_run("tf-a-1/link")
    # The directories she may read hold linked event files: TensorBoard opens every event file
    # as this does (airflow_tf.plugins.run_files), so it reads none of them, wherever they point.
    for linked in ("tf-a-1/copied/events.out.tfevents.2", "tf-a-1/inner/events.out.tfevents.3"):
        with pytest.raises(UnsafePathError, match="symbolic link"):
            read_beneath(str(runs), linked)
    admin = Access(frozenset({"team_a", "team_b"}), every_dag=True, owners={}, roots={"": str(runs)})
    (runs / "tf-out").symlink_to(tmp_path)
    assert admin.may_read_run("tf-b-1") and not admin.may_read_run("tf-out")  # nothing outside runs/
    assert not admin.may_read_run("tf-a-1/link")  # nor tf-b-1 a second time, under another name


def write_progress(run_dir, **report) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "progress.json").write_text(json.dumps(report))


def test_training_rows_show_progress_state_failure_and_links(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_TF_STORAGE", str(tmp_path))
    runs, now = tmp_path / "runs", time.time()
    write_progress(runs / "tf-run", global_step=120, target_step=1000, percent=12.0, examples_per_sec=5300.0,
                   loss=0.25, eta_seconds=8.0, done=False, time=now - 2)
    write_progress(runs / "tf-done", global_step=1000, target_step=1000, percent=100.0, examples_per_sec=5000.0,
                   loss=0.01, eta_seconds=0.0, done=True, time=now - 60)
    (runs / "tf-broken").mkdir()
    (runs / "tf-broken" / "progress.json").write_text("{not json")
    launches = [
        launch("team_b", f"file://{runs}/tf-done", recorded_at=now - 120),
        launch("team_b", f"{runs}/tf-broken", run_id="manual__2", map_index=3, recorded_at=now - 30),
        launch("team_a", f"{runs}/tf-run", recorded_at=now - 10),
        launch("team_a", f"{runs}/tf-old", run_id="old", recorded_at=now - 30 * 24 * 3600),
    ]
    waits = {
        ("team_b", "manual__1", -1): [Wait("training.wait_for_workers", "success")],
        ("team_b", "manual__2", 3): [Wait("other.wait_for_workers", "running"),
                                     Wait("training.wait_for_workers", "failed", "worker 1 exited with code 3")],
        ("team_a", "manual__1", -1): [Wait("training.wait_for_workers", "deferred", replacements=(
            "tf-run-ps-0 restarted 1 time(s), last: stuck: its TensorFlow server left 3 health questions",))],
        ("team_a", "old", -1): [Wait("training.wait_for_workers", "success")],
    }
    rows = training_rows(launches, waits, now=now)
    assert [(r["group"], r["state"]) for r in rows] == [
        ("tf-run", "running"), ("tf-broken", "failed"), ("tf-done", "succeeded")]  # tf-old: finished long ago
    running, failed, done = rows
    assert (running["global_step"], running["target_step"], running["percent"]) == (120, 1000, 12.0)
    assert (running["examples_per_sec"], running["loss"], running["eta_seconds"]) == (5300.0, 0.25, 8.0)
    assert running["last_update"] == now - 2 and running["backend"] == "local"
    assert running["log_url"].endswith("/dags/team_a/runs/manual__1/tasks/training.wait_for_workers")
    assert "runFilter=" in running["tensorboard_url"]
    assert failed["failure_reason"] == "worker 1 exited with code 3" and failed["map_index"] == 3
    assert failed["log_url"].endswith("/tasks/training.wait_for_workers/mapped/3")
    assert failed["global_step"] is None and failed["last_update"] == now - 30  # no readable report: the launch's time
    assert done["eta_seconds"] is None and done["failure_reason"] is None
    assert running["replacements"] == ["tf-run-ps-0 restarted 1 time(s), last: stuck: its TensorFlow server "
                                       "left 3 health questions"] and done["replacements"] == []


def test_the_progress_reader_takes_the_chiefs_report_and_nothing_else(tmp_path):
    assert read_progress_file(str(tmp_path)) is None
    (tmp_path / "progress.json").write_text("[1, 2]")
    assert read_progress_file(str(tmp_path)) is None
    write_progress(tmp_path, global_step=5, target_step=10)
    assert read_progress_file(str(tmp_path)) == {"global_step": 5, "target_step": 10}
