"""Every process of a local group says whose it is: each task's title in ps and /proc names its
task, group and run, and the group's name and run are in every process's environment; and a
teardown that returns has left none of them running."""

from __future__ import annotations

import os

import pytest

from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.local.processes import is_running, process_start_time
from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.cluster.names import process_title
from processes import environ_of, group_processes_of, titled_processes


def test_a_title_names_task_group_and_run_and_shows_no_control_character():
    assert process_title("worker-1", "tf-x", "/runs/a b") == "airflow-tf worker-1 group=tf-x run=/runs/a b"
    assert process_title("ps-0", "tf-x", "/runs/a\nb\x00") == "airflow-tf ps-0 group=tf-x run=/runs/a?b?"
    own = {"ps": {"replicas": 1, "command": ["sleep", "9"]}, "worker": {"replicas": 1, "command": ["true"]}}
    spec = GroupSpec(name="tf-x", roles=own, labels={"airflow.dag_id": "d", "airflow.run_id": "manual__1"})
    assert spec.run_name() == "d/manual__1", "a group without a run directory is named by its Airflow run"
    assert GroupSpec(name="tf-x", roles=own).run_name() == "-"


@pytest.mark.slow
def test_a_groups_processes_are_found_by_their_title_and_a_teardown_leaves_none(
        local_state_dir, linear_dataset, tmp_path, wait_until):
    run_dir = tmp_path / "a run"  # a space in the run directory: the title's last word runs to its end
    config = TrainingConfig(dataset=linear_dataset, run_dir=str(run_dir), steps=10_000_000, batch_size=32,
                            learning_rate=0.05, checkpoint_every_secs=5, log_every_secs=1)
    backend = LocalBackend()
    ref = backend.launch(GroupSpec.for_training("titles", config, ps=1, workers=2))
    try:
        tasks = wait_until(lambda: len(p := backend.processes(ref)) == 3 and p, 180, what="3 tasks")
        expected = {tasks[f"titles-{task}"]: f"airflow-tf {task} group=titles run={run_dir}"
                    for task in ("ps-0", "worker-0", "worker-1")}
        # Each task titles itself as it starts (a forked worker writes over its fork server's line).
        assert wait_until(lambda: titled_processes(run_dir) == expected and expected, 180,
                          what=f"the tasks' titles {expected}, found {titled_processes(run_dir)}")
        for pid, title in expected.items():
            name = title.split()[1]
            with open(f"/proc/{pid}/comm") as f:
                assert f.read().strip() == name, "top and ps -e name a task by its role"
            environ = environ_of(pid)
            assert (environ["AIRFLOW_TF_GROUP"], environ["AIRFLOW_TF_RUN"]) == ("titles", str(run_dir)), environ
        # The workers were forked, so what /proc shows of their environment is the fork server's;
        # each still titled itself from its own TF_CONFIG and variables, not the server's.
        workers = [pid for pid, title in expected.items() if " worker-" in title]
        assert all("TF_CONFIG" not in environ_of(pid) for pid in workers), "the trainers are forked"
        whole_group = group_processes_of(local_state_dir)
        supervisor, server = backend.supervisor_pid(ref), None
        for pid in whole_group:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"airflow_tf.runtime.forkserver" in f.read():
                    server = pid
        assert server is not None and supervisor in whole_group and set(expected) <= set(whole_group)
        with open(f"/proc/{server}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[-3:-1] == [b"group=titles", f"run={run_dir}".encode()], \
                "the fork server names its group too"
        assert all(environ_of(pid)["AIRFLOW_TF_GROUP"] == "titles" for pid in (supervisor, server))
        started = {pid: process_start_time(pid) for pid in whole_group}
    finally:
        backend.teardown(ref)
    # At once, no sleep: the teardown returned, so nothing of the group runs.
    assert [pid for pid, start in started.items() if is_running(pid, start)] == []
    assert titled_processes(run_dir) == {} and group_processes_of(local_state_dir) == []


def test_a_task_titles_itself_from_its_environment_and_keeps_its_environment_readable():
    """What ps reads: the title alone in /proc/<pid>/cmdline, the role as the name, and the
    environment in /proc/<pid>/environ as it was (the title does not spill into it)."""
    import subprocess
    import sys

    code = ("from airflow_tf.runtime.proctitle import name_task_process\n"
            "print(name_task_process('ps', 3))\n"
            "print(open('/proc/self/cmdline', 'rb').read().rstrip(b'\\0').decode())\n"
            "print(open('/proc/self/comm').read().strip())\n"
            "print(b'AIRFLOW_TF_RUN=/runs/r 1' in open('/proc/self/environ', 'rb').read().split(b'\\0'))\n")
    env = dict(os.environ, AIRFLOW_TF_GROUP="tf-x", AIRFLOW_TF_RUN="/runs/r 1")
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert shown.stdout.splitlines() == ["airflow-tf ps-3 group=tf-x run=/runs/r 1"] * 2 + ["ps-3", "True"]
    del env["AIRFLOW_TF_GROUP"]  # not a local group's task (a plain run): left as it is
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert plain.stdout.splitlines()[0] == "None" and plain.stdout.splitlines()[1].startswith(sys.executable)
