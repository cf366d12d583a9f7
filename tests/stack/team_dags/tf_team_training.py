"""A small training DAG for the per-DAG access tests, one per team: the test puts this file in one
DAG bundle folder per team (``team_a``, ``team_b``), and the folder's name makes the DAG id
(``tf_team_a``, ``tf_team_b``) and so the team that owns it.

prepare -> launch (1 ps + 1 worker, a progress report every second) -> wait -> teardown; and
``tf_<team>_returns``, whose one task returns the value it is triggered with."""

from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_tf.operators import LaunchTFClusterOperator, PrepareTFRecordsOperator, TeardownTFClusterOperator
from airflow_tf.sensors import WorkerCompletionSensor

TEAM = Path(__file__).parent.name

with DAG(
    dag_id=f"tf_{TEAM}",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={"steps": Param(300, type="integer", minimum=10)},
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
                                     steps="{{ params.steps }}", log_every_secs=1, summary_every_steps=20)
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
):
    # What any task of a team's DAG can do: return whatever value it likes, here one shaped like
    # a launch result naming another team's run (the ownership tests' forger).

    @task
    def returns() -> dict:
        from airflow.sdk import get_current_context

        return get_current_context()["params"]["value"]

    returns()
