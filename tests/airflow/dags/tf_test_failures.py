"""Test-only DAGs: a group whose workers always crash, a launch that fails once after
launching (its retry must re-attach to the same group), and a model the launch refuses."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, task

from airflow_tf.operators import LaunchTFClusterOperator, PrepareTFRecordsOperator, TeardownTFClusterOperator
from airflow_tf.sensors import WorkerCompletionSensor
from airflow_tf.task_groups import tf_training


class LaunchThatFailsOnce(LaunchTFClusterOperator):
    """Launches, then fails its first try, as if the Airflow worker died after launching."""

    def execute(self, context):
        result = super().execute(context)
        if context["ti"].try_number == 1:
            raise RuntimeError("first try lost after launching the group")
        return result


@task
def sample() -> str:
    import os

    from airflow_tf.data.samples import write_linear_regression_csv
    from airflow_tf.storage import incoming_dir

    path = os.path.join(incoming_dir(), "linear.csv")
    write_linear_regression_csv(path, rows=2000, seed=1)
    return path


def _dag(dag_id: str) -> DAG:
    return DAG(dag_id=dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)


def _prepare() -> PrepareTFRecordsOperator:
    return PrepareTFRecordsOperator(task_id="prepare", input=sample(), name="linear", label="y", eval_fraction=0.2,
                                    shards=2)


with _dag("tf_test_crashing_workers"):
    prepare = _prepare()
    prepare >> tf_training(dataset=prepare.output, ps=1, workers=2, steps=200,
                           model="no_such_package.models:build", model_name="never")

with _dag("tf_test_refused_model"):
    prepare = _prepare()
    prepare >> tf_training(dataset=prepare.output, steps=200, model="not a model reference", model_name="never",
                           launch_retries=2, launch_retry_delay=timedelta(seconds=0))

# Wired by hand with the public operators: the launch fails its first try after launching.
with _dag("tf_test_launch_retry"):
    prepare = _prepare()
    launch = LaunchThatFailsOnce(task_id="launch", dataset=prepare.output, ps=1, workers=2, steps=200, retries=1,
                                 retry_delay=timedelta(seconds=0))
    wait = WorkerCompletionSensor(task_id="wait_for_workers", group=launch.output, deferrable=True, timeout=600)
    teardown = TeardownTFClusterOperator(task_id="teardown", group=launch.output)
    launch >> wait >> teardown.as_teardown(setups=launch)
