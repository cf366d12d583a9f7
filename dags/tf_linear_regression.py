"""The seed's example: learn y = 2x + 10 (plus noise) with 1 parameter server and 2 workers.

prepare -> training (launch -> wait for workers -> tear down; evaluate -> export).
Storage comes from ``[airflow_tf] storage`` / $AIRFLOW_TF_STORAGE, read when the tasks run;
the exported model lands in <storage>/models/linear_regression/<version>/ for TensorFlow Serving.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_tf.operators import PrepareTFRecordsOperator
from airflow_tf.task_groups import tf_training

with DAG(
    dag_id="tf_linear_regression",
    description="Distributed linear regression (y = 2x + 10): 1 ps + 2 async workers",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["tensorflow", "example"],
    params={
        "steps": Param(3000, type="integer", minimum=10, maximum=1_000_000, description="target global step"),
        "rows": Param(20000, type="integer", minimum=100, maximum=10_000_000, description="rows of sample data"),
    },
) as dag:

    @task
    def make_sample_data(params=None) -> str:
        """The seed article's data: x uniform, y = 2x + 10 + noise."""
        from airflow_tf.data.samples import write_linear_regression_csv
        from airflow_tf.storage import incoming_dir

        path = os.path.join(incoming_dir(), "linear_regression", "seed.csv")
        if not os.path.exists(path):
            write_linear_regression_csv(path, rows=int(params["rows"]), seed=0)
        return path

    prepare = PrepareTFRecordsOperator(
        task_id="prepare", input=make_sample_data(), name="linear_regression", label="y", eval_fraction=0.2, shards=4,
    )
    prepare >> tf_training(
        dataset=prepare.output,
        ps=1,
        workers=2,
        model="linear_regression",
        optimizer="sgd",
        learning_rate=0.01,
        batch_size=64,
        steps="{{ params.steps }}",
        checkpoint_every_secs=5,
        deferrable=True,
        poke_interval=2,
        timeout=1800,
        thresholds={"mse": {"max": 1.0}},
        model_name="linear_regression",
    )
