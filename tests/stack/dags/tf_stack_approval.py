"""Test-only DAGs for the real stack: one small training whose export a person approves or
rejects (``tf_stack_approval``), and the same with a short answer timeout that rejects by itself
(``tf_stack_approval_timeout``)."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, task

from airflow_tf.operators import PrepareTFRecordsOperator
from airflow_tf.task_groups import tf_training


@task
def sample() -> str:
    import os

    from airflow_tf.data.samples import write_linear_regression_csv
    from airflow_tf.storage import incoming_dir

    path = os.path.join(incoming_dir(), "approval", "linear.csv")
    if not os.path.exists(path):
        write_linear_regression_csv(path, rows=3000, seed=3)
    return path


for dag_id, timeout in (("tf_stack_approval", None), ("tf_stack_approval_timeout", timedelta(seconds=5))):
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
             tags=["test"]):
        prepare = PrepareTFRecordsOperator(task_id="prepare", input=sample(), name="approval", label="y", shards=2)
        prepare >> tf_training(dataset=prepare.output, ps=1, workers=1, steps=800, learning_rate=0.05,
                               poke_interval=1, thresholds={"mse": {"max": 1.0}}, compare_to_served=True,
                               model_name=dag_id, approval=True, approval_timeout=timeout)
