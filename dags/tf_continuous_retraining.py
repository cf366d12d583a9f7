"""Continuous retraining per data partition: when a new partition of data lands (an Airflow
Asset) or on a daily schedule, prepare each new partition once, train on a window of the last
few partitions, warm-start from the model being served, evaluate against it, and export only a
better model.

The chain runs on asset events: ``tf_ingest_linear_data`` (whatever delivers data) writes a
partition of rows under ``incoming/<stream>/<partition>/`` and updates
``linear_regression_incoming``; ``tf_continuous_retraining`` prepares every partition not yet
prepared (one version per partition, named by it; each updates
``airflow_tf.dataset.linear_regression_stream`` with the partition as the event's partition key
on Airflow 3.2+), commits a window version of the last ``WINDOW`` partitions (their shards,
not copied) and trains on it; its export updates ``airflow_tf.model.linear_regression_retrained``
with the new version, its path and metrics; ``tf_deploy_linear_model`` is scheduled on that
model asset and deploys the version.
"""

from __future__ import annotations

import os
import time

import pendulum
from airflow.sdk import DAG, Asset, Param, task
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable

from airflow_tf.operators import DatasetWindowOperator, PrepareTFRecordsOperator, dataset_asset, model_asset
from airflow_tf.task_groups import tf_training

MODEL_NAME = "linear_regression_retrained"
STREAM = "linear_regression_stream"
WINDOW = 3  # partitions the model trains on: the newest ones
# The asset is named, not tied to a path: the same DAGs serve any storage root.
new_linear_data = Asset(name="linear_regression_incoming")


def incoming(*parts: str) -> str:
    """A path under <storage>/incoming/<stream>/, resolved when a task runs."""
    from airflow_tf.storage import incoming_dir

    return os.path.join(incoming_dir(), STREAM, *parts)


with DAG(
    dag_id="tf_ingest_linear_data",
    description="Delivers a new batch of y = 2x + 10 rows and announces it (asset event)",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["tensorflow", "example"],
    params={"rows": Param(5000, type="integer", minimum=100, maximum=10_000_000, description="rows in the batch")},
):

    @task(outlets=[new_linear_data])
    def land_new_batch(params=None) -> str:
        from airflow_tf.data.samples import write_linear_regression_csv

        now = time.time_ns()
        # A partition key that sorts by arrival (and is a valid directory name).
        partition = time.strftime("%Y-%m-%dT%H-%M-%S", time.gmtime(now / 1e9)) + f".{now % 10**9:09d}"
        path = incoming(partition, "batch.csv")
        write_linear_regression_csv(path, rows=int(params["rows"]), seed=now % 2**31)
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
    params={"steps": Param(1500, type="integer", minimum=10, maximum=1_000_000, description="target global step")},
):

    @task
    def new_partitions() -> list[dict]:
        """The partitions landed and not prepared yet, oldest first: one prepare each."""
        from pathlib import Path

        from airflow_tf.data.window import partition_versions
        from airflow_tf.storage import datasets_dir

        landed = Path(incoming())
        names = sorted(p.name for p in landed.iterdir() if p.is_dir()) if landed.is_dir() else []
        prepared = {key for key, _ in partition_versions(Path(datasets_dir()) / STREAM)}
        return [{"partition_key": name, "input": incoming(name, "*.csv")} for name in names if name not in prepared]

    @task
    def warm_start_checkpoint() -> str | None:
        """The checkpoint behind the model being served, if any: training continues from it."""
        from airflow_tf.serving import latest_export
        from airflow_tf.storage import models_dir

        served = latest_export(models_dir(), MODEL_NAME)
        if served is None:
            return None
        return served["metadata"]["warm_start_from"]

    # No new partition: nothing is prepared and the rest is skipped.
    # A mapped task's outlets must be given: each prepared partition updates the dataset's asset.
    prepare = PrepareTFRecordsOperator.partial(task_id="prepare", name=STREAM, label="y", eval_fraction=0.2,
                                               shards=2, outlets=[dataset_asset(STREAM)]
                                               ).expand_kwargs(new_partitions())
    window = DatasetWindowOperator(task_id="window", name=STREAM, last=WINDOW)
    prepare >> window >> tf_training(
        dataset=window.output,
        ps=1,
        workers=2,
        model="linear_regression",
        learning_rate=0.01,
        steps="{{ params.steps }}",
        warm_start_from=warm_start_checkpoint(),
        checkpoint_every_secs=5,
        deferrable=True,
        poke_interval=2,
        timeout=1800,
        thresholds={"mse": {"max": 1.0}},
        compare_to_served=True,
        model_name=MODEL_NAME,
    )


with DAG(
    dag_id="tf_deploy_linear_model",
    description="Deploys each new version of the retrained model (scheduled on the export's model asset)",
    schedule=[model_asset(MODEL_NAME)],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["tensorflow", "example"],
):

    @task
    def deploy(triggering_asset_events=None) -> dict:
        """Points <storage>/deployed/<model>.json at the new version (a stand-in for telling a
        model server to load it); run by hand, it deploys the latest export."""
        from airflow_tf.serving import latest_export
        from airflow_tf.files import write_json
        from airflow_tf.storage import models_dir, storage_root

        events = [e for es in (triggering_asset_events or {}).values() for e in es]
        if events:
            extra = events[-1].extra
            deployed = {"version": extra["version"], "path": extra["path"], "metrics": extra.get("metrics")}
        else:
            served = latest_export(models_dir(), MODEL_NAME)
            if served is None:
                raise ValueError(f"no version of {MODEL_NAME} is exported under {models_dir()} yet")
            deployed = {"version": served["version"], "path": served["path"],
                        "metrics": served["metadata"].get("metrics")}
        write_json(os.path.join(storage_root(), "deployed", f"{MODEL_NAME}.json"), deployed)
        return deployed

    deploy()
