"""Test-only DAGs for what a platform team watches: the training's metrics through Airflow's
Stats, and the chief's log followed into the wait's task log, in poke and deferrable mode."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_tf.operators import PrepareTFRecordsOperator
from airflow_tf.task_groups import tf_training


@task
def sample() -> str:
    import os

    from airflow_tf.data.samples import write_linear_regression_csv
    from airflow_tf.storage import incoming_dir

    path = os.path.join(incoming_dir(), "observed.csv")
    write_linear_regression_csv(path, rows=4000, seed=3)
    return path


for dag_id, deferrable in (("tf_test_observed", False), ("tf_test_observed_deferred", True)):
    with DAG(dag_id=dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
        prepare = PrepareTFRecordsOperator(task_id="prepare", input=sample(), name="observed", label="y",
                                           eval_fraction=0.2, shards=2)
        prepare >> tf_training(dataset=prepare.output, ps=1, workers=1, model="linear_regression", optimizer="sgd",
                               learning_rate=0.01, batch_size=32, steps=4000, log_every_secs=0.5,
                               deferrable=deferrable, poke_interval=1, timeout=600,
                               thresholds={"mse": {"max": 100.0}}, model_name="observed")
