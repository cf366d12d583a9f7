"""A scheduled DAG for the real-stack tests: once unpaused, the scheduler runs it by itself
(no trigger). Its one task records the run it belongs to under $AIRFLOW_TF_STORAGE."""

from __future__ import annotations

import datetime
import json
import os

import pendulum
from airflow.sdk import DAG, task

from airflow_tf.storage import storage_root

with DAG(
    dag_id="tf_stack_hourly",
    schedule=datetime.timedelta(hours=1),
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    tags=["test"],
):

    @task
    def record_run(dag_run=None) -> str:
        path = os.path.join(storage_root(), "scheduled-runs", f"{dag_run.run_id.replace(':', '_')}.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump({"run_id": dag_run.run_id, "run_type": str(dag_run.run_type)}, f)
        os.replace(path + ".tmp", path)
        return path

    record_run()
