"""Continuous retraining: when new data lands (an Airflow Asset) or on a daily schedule,
prepare a new dataset version from everything received so far, warm-start from the model
being served, evaluate against it, and export only a better model.

``tf_ingest_linear_data`` stands in for whatever delivers data: it writes a new batch of
rows into <storage>/incoming/linear_regression/ and emits the asset event.
"""

from __future__ import annotations

import os
import time

import pendulum
from airflow.sdk import DAG, Asset, task
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable

from airflow_tf.operators import (
    EvaluateModelOperator, ExportSavedModelOperator, LaunchTFClusterOperator, PrepareTFRecordsOperator,
    TeardownTFClusterOperator,
)
from airflow_tf.sensors import WorkerCompletionSensor
from airflow_tf.storage import datasets_dir, incoming_dir, models_dir

MODEL_NAME = "linear_regression_retrained"
INCOMING = os.path.join(incoming_dir(), "linear_regression_stream")
# The asset is named, not tied to a path: the same DAGs serve any storage root.
new_linear_data = Asset(name="linear_regression_incoming")

with DAG(
    dag_id="tf_ingest_linear_data",
    description="Delivers a new batch of y = 2x + 10 rows and announces it (asset event)",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["tensorflow", "example"],
    params={"rows": 5000},
):

    @task(outlets=[new_linear_data])
    def land_new_batch(params=None) -> str:
        from airflow_tf.data.samples import write_linear_regression_csv

        path = os.path.join(INCOMING, f"batch-{time.time_ns()}.csv")
        write_linear_regression_csv(path, rows=int(params["rows"]), seed=time.time_ns() % 2**31)
        return path

    land_new_batch()


with DAG(
    dag_id="tf_continuous_retraining",
    description="Retrain on new data (asset) or daily; warm-start; export only a better model",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 3 * * *", timezone="UTC"), assets=new_linear_data
    ),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["tensorflow", "example"],
    params={"steps": 1500},
):

    @task
    def warm_start_checkpoint() -> str | None:
        """The checkpoint behind the model being served, if any: training continues from it."""
        from airflow_tf.serving import latest_export

        served = latest_export(models_dir(), MODEL_NAME)
        if served is None:
            return None
        return served["metadata"]["warm_start_from"]

    prepare = PrepareTFRecordsOperator(
        task_id="prepare",
        input=os.path.join(INCOMING, "*.csv"),
        output=datasets_dir(),
        name="linear_regression_stream",
        label="y",
        eval_fraction=0.2,
        shards=2,
    )
    launch = LaunchTFClusterOperator(
        task_id="launch",
        dataset=prepare.output,
        ps=1,
        workers=2,
        model="linear_regression",
        learning_rate=0.01,
        steps="{{ params.steps }}",
        training={"warm_start_from": warm_start_checkpoint()},
        checkpoint_every_secs=5,
    )
    wait = WorkerCompletionSensor(
        task_id="wait_for_workers", group=launch.output, deferrable=True, poke_interval=2, timeout=1800
    )
    teardown = TeardownTFClusterOperator(task_id="teardown", group=launch.output, launch_task_id="launch")
    evaluate = EvaluateModelOperator(
        task_id="evaluate", launch=launch.output, thresholds={"mse": {"max": 1.0}},
        compare_to_served=True, model_name=MODEL_NAME,
    )
    export = ExportSavedModelOperator(
        task_id="export", launch=launch.output, metrics=evaluate.output, model_name=MODEL_NAME
    )

    launch >> wait >> teardown.as_teardown(setups=launch)
    [wait, teardown] >> evaluate >> export
