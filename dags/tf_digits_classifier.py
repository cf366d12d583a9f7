"""A classifier on real data: the 8x8 handwritten digits bundled with scikit-learn (no
download). 1 parameter server + 2 workers train an MLP; the model is exported only if its
accuracy on the held-out split reaches 0.9."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_tf.operators import PrepareTFRecordsOperator
from airflow_tf.task_groups import tf_training

with DAG(
    dag_id="tf_digits_classifier",
    description="Handwritten digits (8x8) MLP classifier: 1 ps + 2 workers, exported at accuracy >= 0.9",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["tensorflow", "example"],
    params={"steps": Param(1500, type="integer", minimum=10, maximum=1_000_000, description="target global step")},
) as dag:

    @task
    def export_digits() -> str:
        """scikit-learn's digits as NumPy: a 64-value ``pixels`` vector and the ``digit`` label."""
        import numpy as np
        from sklearn.datasets import load_digits

        from airflow_tf.storage import incoming_dir

        digits = load_digits()
        path = os.path.join(incoming_dir(), "digits", "digits.npz")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp.npz"
        np.savez(tmp, pixels=(digits.data / 16.0).astype("float32"), digit=digits.target.astype("int64"))
        os.replace(tmp, path)
        return path

    prepare = PrepareTFRecordsOperator(
        task_id="prepare", input=export_digits(), name="digits", label="digit", eval_fraction=0.2, shards=4,
    )
    prepare >> tf_training(
        dataset=prepare.output,
        ps=1,
        workers=2,
        model="mlp_classifier",
        model_kwargs={"hidden_units": [64], "num_classes": 10},
        optimizer="adam",
        learning_rate=0.005,
        batch_size=64,
        steps="{{ params.steps }}",
        checkpoint_every_secs=5,
        deferrable=True,
        poke_interval=2,
        timeout=1800,
        thresholds={"accuracy": {"min": 0.9}},
        model_name="digits",
    )
