"""A small training DAG for the per-DAG access tests, one per team: the test puts this file in one
DAG bundle folder per team (``team_a``, ``team_b``), and the folder's name makes the DAG id
(``tf_team_a``, ``tf_team_b``) and so the team that owns it.

prepare -> launch (1 ps + 1 worker, a progress report every second) -> wait -> teardown;
``tf_<team>_returns``, whose one task returns the value it is triggered with; and
``tf_<team>_probe``, whose task tries to read and write the paths it is given and returns what
the kernel answered. Every task runs as the team's OS user when ``AIRFLOW_TF_TEST_USER_<TEAM>``
names one (Airflow's ``run_as_user``: sudo)."""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_tf.operators import LaunchTFClusterOperator, PrepareTFRecordsOperator, TeardownTFClusterOperator
from airflow_tf.sensors import WorkerCompletionSensor

TEAM = Path(__file__).parent.name
AS_TEAM = {"run_as_user": os.environ.get(f"AIRFLOW_TF_TEST_USER_{TEAM.upper()}") or None}

with DAG(
    dag_id=f"tf_{TEAM}",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={"steps": Param(300, type="integer", minimum=10), "run_dir": Param("", type="string")},
    default_args=AS_TEAM,
):

    @task
    def sample() -> str:
        import os

        from airflow_tf.data.samples import write_linear_regression_csv
        from airflow_tf.storage import incoming_dir

        path = os.path.join(incoming_dir(), f"{TEAM}.csv")
        write_linear_regression_csv(path, rows=2000, seed=1)
        return path

    prepare = PrepareTFRecordsOperator(task_id="prepare", input=sample(), name=f"linear_{TEAM}", label="y",
                                       eval_fraction=0.2, shards=2)
    launch = LaunchTFClusterOperator(task_id="launch", dataset=prepare.output, ps=1, workers=1,
                                     steps="{{ params.steps }}", log_every_secs=1, summary_every_steps=20,
                                     run_dir="{{ params.run_dir }}")  # '' (the default): <root>/runs/<group>
    # Polls on a worker slot: in multi-team mode a deferred task waits for a triggerer of its own
    # team (``airflow triggerer --team-name``), and the test stack runs one global triggerer.
    wait = WorkerCompletionSensor(task_id="wait_for_workers", group=launch.output, deferrable=False,
                                  poke_interval=2, timeout=900)
    teardown = TeardownTFClusterOperator(task_id="teardown", group=launch.output)
    prepare >> launch >> wait >> teardown.as_teardown(setups=launch)


with DAG(
    dag_id=f"tf_{TEAM}_returns",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={"value": Param({}, type="object")},
    default_args=AS_TEAM,
):
    # What any task of a team's DAG can do: return whatever value it likes, here one shaped like
    # a launch result naming another team's run (the ownership tests' forger).

    @task
    def returns() -> dict:
        from airflow.sdk import get_current_context

        return get_current_context()["params"]["value"]

    returns()


with DAG(
    dag_id=f"tf_{TEAM}_probe",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={"read": Param([], type="array"), "write": Param([], type="array")},
    default_args=AS_TEAM,
):
    # What a DAG author's code can reach on the storage: each path read (a directory listed, a
    # file read) or written (a directory or a file created, as a squatter or a forger would).

    @task
    def probe() -> dict:
        import os

        from airflow.sdk import get_current_context

        params, outcome = get_current_context()["params"], {"uid": os.getuid()}
        for path in params["read"]:
            try:
                if os.path.isdir(path):
                    os.listdir(path)
                else:
                    with open(path, "rb") as f:
                        f.read(1)
                outcome[f"read {path}"] = "done"
            except OSError as exc:
                outcome[f"read {path}"] = type(exc).__name__
        for path in params["write"]:
            try:
                if path.endswith("/"):
                    os.mkdir(path)
                else:
                    with open(path, "x") as f:
                        f.write("{}")
                outcome[f"write {path}"] = "done"
            except OSError as exc:
                outcome[f"write {path}"] = type(exc).__name__
        return outcome

    probe()
