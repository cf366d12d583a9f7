"""The seed's example: learn y = 2x + 10 (plus noise) with 1 parameter server and 2 workers.

prepare -> launch -> wait for workers (deferrable) -> tear down -> evaluate -> export.
Storage comes from $AIRFLOW_TF_STORAGE (see airflow_tf.storage); the exported model lands in
<storage>/models/linear_regression/<version>/ for TensorFlow Serving.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task

from airflow_tf.operators import (
    EvaluateModelOperator, ExportSavedModelOperator, LaunchTFClusterOperator, PrepareTFRecordsOperator,
    TeardownTFClusterOperator,
)
from airflow_tf.sensors import WorkerCompletionSensor
from airflow_tf.storage import datasets_dir, incoming_dir

with DAG(
    dag_id="tf_linear_regression",
    description="Distributed linear regression (y = 2x + 10): 1 ps + 2 async workers",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["tensorflow", "example"],
    params={"steps": 3000, "rows": 20000},
) as dag:

    @task
    def make_sample_data(params=None) -> str:
        """The seed article's data: x uniform, y = 2x + 10 + noise."""
        from airflow_tf.data.samples import write_linear_regression_csv

        path = os.path.join(incoming_dir(), "linear_regression", "seed.csv")
        if not os.path.exists(path):
            write_linear_regression_csv(path, rows=int(params["rows"]), seed=0)
        return path

    prepare = PrepareTFRecordsOperator(
        task_id="prepare",
        input=make_sample_data(),
        output=datasets_dir(),
        name="linear_regression",
        label="y",
        eval_fraction=0.2,
        shards=4,
    )
    launch = LaunchTFClusterOperator(
        task_id="launch",
        dataset=prepare.output,
        ps=1,
        workers=2,
        model="linear_regression",
        optimizer="sgd",
        learning_rate=0.01,
        batch_size=64,
        steps="{{ params.steps }}",
        checkpoint_every_secs=5,
    )
    wait = WorkerCompletionSensor(
        task_id="wait_for_workers", group=launch.output, deferrable=True, poke_interval=2, timeout=1800
    )
    teardown = TeardownTFClusterOperator(task_id="teardown", group=launch.output, launch_task_id="launch")
    evaluate = EvaluateModelOperator(task_id="evaluate", launch=launch.output, thresholds={"mse": {"max": 1.0}})
    export = ExportSavedModelOperator(
        task_id="export", launch=launch.output, metrics=evaluate.output, model_name="linear_regression"
    )

    launch >> wait >> teardown.as_teardown(setups=launch)
    [wait, teardown] >> evaluate >> export
