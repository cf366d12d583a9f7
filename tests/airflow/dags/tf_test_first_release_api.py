"""Test-only DAG written against airflow-tf 0.1.0's API, as its README showed it: the launch's
training options as ``training={...}`` and the teardown finding its launch by
``launch_task_id``. Both are deprecated and must keep working (with a warning) until 0.3.0.

The teardown is given no ``group``: it finds the group by name from the launch's task id alone."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_tf.operators import (
    EvaluateModelOperator, ExportSavedModelOperator, LaunchTFClusterOperator, PrepareTFRecordsOperator,
    TeardownTFClusterOperator,
)
from airflow_tf.sensors import WorkerCompletionSensor


@task
def sample() -> str:
    import os

    from airflow_tf.data.samples import write_linear_regression_csv
    from airflow_tf.storage import incoming_dir

    path = os.path.join(incoming_dir(), "linear.csv")
    write_linear_regression_csv(path, rows=2000, seed=1)
    return path


with DAG("tf_test_first_release_api", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
         catchup=False):
    prepare = PrepareTFRecordsOperator(task_id="prepare", input=sample(), name="linear", label="y", shards=2)
    launch = LaunchTFClusterOperator(task_id="launch", dataset=prepare.output, ps=1, workers=2,
                                     training={"model": "linear_regression", "steps": 300, "learning_rate": 0.05})
    wait = WorkerCompletionSensor(task_id="wait_for_workers", group=launch.output, deferrable=True, timeout=600)
    teardown = TeardownTFClusterOperator(task_id="teardown", launch_task_id="launch")
    evaluate = EvaluateModelOperator(task_id="evaluate", launch=launch.output, thresholds={"mse": {"max": 5.0}})
    export = ExportSavedModelOperator(task_id="export", launch=launch.output, metrics=evaluate.output,
                                      model_name="first_release")
    launch >> wait >> teardown.as_teardown(setups=launch)
    [wait, teardown] >> evaluate >> export
