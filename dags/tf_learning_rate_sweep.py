"""A learning-rate sweep with Airflow's dynamic task mapping: one training group (and run
directory) per learning rate, each evaluated on the held-out split; only the best blessed
run (lowest eval loss) is exported.

Runnable on one machine: each group is small (1 ps + 1 worker) and ``max_active_trainings``
bounds how many mapped launches and waits run at once.

``tf_learning_rate_sweep_approved`` is the same sweep with ``approval=True``: a person sees every
run's metrics and approves (or rejects) the export of the chosen one, in the UI's "Required
actions" or through the REST API (Airflow 3.1 or later).
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_tf.operators import PrepareTFRecordsOperator
from airflow_tf.task_groups import tf_training

def sweep(dag_id: str, *, approval: bool) -> DAG:
    """The sweep DAG; with ``approval`` a person approves the chosen run's export."""
    with DAG(
        dag_id=dag_id,
        description="Train y = 2x + 10 at several learning rates (mapped), export the best"
        + (" once a person approves it" if approval else ""),
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        tags=["tensorflow", "example"],
        params={
            "learning_rates": Param([0.005, 0.02], type="array", minItems=1, maxItems=8,
                                    items={"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                                    description="one training per learning rate"),
            "steps": Param(1000, type="integer", minimum=10, maximum=1_000_000, description="target global step"),
        },
    ) as dag:

        @task
        def make_sample_data() -> str:
            from airflow_tf.data.samples import write_linear_regression_csv
            from airflow_tf.storage import incoming_dir

            path = os.path.join(incoming_dir(), "linear_regression", "sweep.csv")
            if not os.path.exists(path):
                write_linear_regression_csv(path, rows=5000, seed=0)
            return path

        @task
        def learning_rates(params=None) -> list[float]:
            return [float(rate) for rate in params["learning_rates"]]

        prepare = PrepareTFRecordsOperator(
            task_id="prepare", input=make_sample_data(), name="linear_regression_sweep", label="y", shards=2,
        )
        prepare >> tf_training(
            "sweep",
            dataset=prepare.output,
            ps=1,
            workers=1,
            model="linear_regression",
            steps="{{ params.steps }}",
            checkpoint_every_secs=5,
            expand={"learning_rate": learning_rates()},
            max_active_trainings=2,
            poke_interval=2,
            timeout=1800,
            thresholds={"mse": {"max": 1.0}},
            select_by="mse",
            model_name="linear_regression_sweep",
            approval=approval,
            approval_timeout=timedelta(days=1) if approval else None,  # then rejected: no new version
        )
    return dag


sweep("tf_learning_rate_sweep", approval=False)
sweep("tf_learning_rate_sweep_approved", approval=True)
