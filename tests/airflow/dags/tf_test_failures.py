"""Test-only DAGs: a group whose workers always crash, and a launch that fails once after
launching (its retry must re-attach to the same group)."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG

from airflow_tf.operators import LaunchTFClusterOperator, PrepareTFRecordsOperator, TeardownTFClusterOperator
from airflow_tf.sensors import WorkerCompletionSensor
from airflow_tf.storage import datasets_dir, incoming_dir


class LaunchThatFailsOnce(LaunchTFClusterOperator):
    """Launches, then fails its first try, as if the Airflow worker died after launching."""

    def execute(self, context):
        result = super().execute(context)
        if context["ti"].try_number == 1:
            raise RuntimeError("first try lost after launching the group")
        return result


def _pipeline(dag_id: str, launch_cls, **launch_kwargs):
    with DAG(dag_id=dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False) as dag:
        from airflow.sdk import task

        @task
        def sample() -> str:
            import os

            from airflow_tf.data.samples import write_linear_regression_csv

            path = os.path.join(incoming_dir(), "linear.csv")
            write_linear_regression_csv(path, rows=2000, seed=1)
            return path

        prepare = PrepareTFRecordsOperator(task_id="prepare", input=sample(), output=datasets_dir(),
                                           name="linear", label="y", eval_fraction=0.2, shards=2)
        launch = launch_cls(task_id="launch", dataset=prepare.output, ps=1, workers=2, steps=200, **launch_kwargs)
        wait = WorkerCompletionSensor(task_id="wait_for_workers", group=launch.output, deferrable=True, timeout=600)
        teardown = TeardownTFClusterOperator(task_id="teardown", group=launch.output, launch_task_id="launch")
        launch >> wait >> teardown.as_teardown(setups=launch)
    return dag


crashing = _pipeline("tf_test_crashing_workers", LaunchTFClusterOperator, model="no_such_package.models:build")
retried = _pipeline("tf_test_launch_retry", LaunchThatFailsOnce, retries=1, retry_delay=timedelta(seconds=0))
