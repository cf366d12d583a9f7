"""Test-only DAG: a group of the name this run's launch derives already runs, started by
someone else (another deployment's labels). On Airflow 3.3 the launch refuses it (its task
state store holds no record of creating it), without retrying."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, task

from airflow_tf.operators import LaunchTFClusterOperator, TeardownTFClusterOperator
from airflow_tf.sensors import WorkerCompletionSensor


@task
def someone_elses_group(dag_run=None) -> str:
    import sys

    from airflow_tf.backends.local import LocalBackend
    from airflow_tf.cluster import GroupSpec, RoleSpec, group_name
    from airflow_tf.storage import state_dir

    name = group_name(dag_run.dag_id, "launch", dag_run.run_id, -1)
    sleep = [sys.executable, "-c", "import time; time.sleep(900)"]
    spec = GroupSpec(name=name, roles={"ps": RoleSpec(replicas=1, command=sleep),
                                       "worker": RoleSpec(replicas=1, command=sleep)},
                     labels={"airflow.dag_id": "another_deployment", "airflow.run_id": "theirs"})
    backend = LocalBackend(state_dir())
    backend.hand_over(backend.launch(spec))
    return name


with DAG("tf_test_foreign_group", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
         catchup=False):
    launch = LaunchTFClusterOperator(task_id="launch", dataset="/nonexistent/dataset/1", ps=1, workers=1, steps=10,
                                     retries=2, retry_delay=timedelta(seconds=0))
    wait = WorkerCompletionSensor(task_id="wait_for_workers", group=launch.output, timeout=60)
    teardown = TeardownTFClusterOperator(task_id="teardown", group=launch.output)
    someone_elses_group() >> launch >> wait >> teardown.as_teardown(setups=launch)
