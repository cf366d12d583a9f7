"""A recommendation model on click logs: two string id columns (users and items, 100k+ ids
each) embedded in tables on the parameter servers (split over both), a dense head, Adagrad;
2 parameter servers + 2 workers. Evaluated by AUC on the held-out clicks and exported only
if the AUC reaches 0.7; the exported model takes the raw string ids."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_tf.operators import PrepareTFRecordsOperator
from airflow_tf.task_groups import tf_training

with DAG(
    dag_id="tf_recommendation",
    description="Click-through model with embedding tables on the parameter servers: 2 ps + 2 workers, AUC >= 0.7",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["tensorflow", "example", "embeddings"],
    params={
        "steps": Param(3000, type="integer", minimum=10, maximum=10_000_000, description="target global step"),
        "rows": Param(400_000, type="integer", minimum=1000, maximum=100_000_000, description="clicks to generate"),
    },
) as dag:

    @task
    def generate_clicks(params=None) -> str:
        """Click logs with a long tail of users and items; a stand-in for a day of real logs."""
        from airflow_tf.data.samples import write_clicks_csv
        from airflow_tf.storage import incoming_dir

        path = os.path.join(incoming_dir(), "clicks", f"clicks-{int(params['rows'])}.csv")
        if not os.path.exists(path):
            write_clicks_csv(path, rows=int(params["rows"]), users=150_000, items=120_000, seed=0)
        return path

    prepare = PrepareTFRecordsOperator(
        task_id="prepare", input=generate_clicks(), name="clicks", label="clicked", string_columns=["user", "item"],
        eval_fraction=0.1, shards=8,
    )
    prepare >> tf_training(
        dataset=prepare.output,
        ps=2,
        workers=2,
        model="recommendation_model:build",  # dags/recommendation_model.py, next to this file
        model_kwargs={"buckets": 524_288, "dim": 16},  # 32 MiB per table: 2 slices of 16 MiB
        loss="binary_crossentropy",
        optimizer="adagrad",
        learning_rate=0.5,
        batch_size=256,
        steps="{{ params.steps }}",
        checkpoint_every_secs=10,
        deferrable=True,
        poke_interval=2,
        timeout=3600,
        thresholds={"auc": {"min": 0.7}},
        model_name="clicks",
    )
