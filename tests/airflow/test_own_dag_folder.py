"""A user's own DAG folder, outside this repository: a DAG and its model module side by side,
no PYTHONPATH. The training tasks import the model from the run's code snapshot."""

from __future__ import annotations

import json
import textwrap

import pytest

from airflow_tf.demo import airflow_env, dag_run_state, dags_test, predict

pytestmark = pytest.mark.slow

MODEL = '''
import keras


def build():
    """The seed's kind of model: one input, one Dense unit, no arguments."""
    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
'''

DAG_FILE = '''
import os

import pendulum
from airflow.sdk import DAG, task

from airflow_tf.operators import PrepareTFRecordsOperator
from airflow_tf.task_groups import tf_training

with DAG("my_own_model", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):

    @task
    def data() -> str:
        from airflow_tf.data.samples import write_linear_regression_csv
        from airflow_tf.storage import incoming_dir

        path = os.path.join(incoming_dir(), "mine.csv")
        write_linear_regression_csv(path, rows=4000, seed=3)
        return path

    prepare = PrepareTFRecordsOperator(task_id="prepare", input=data(), name="mine", label="y", shards=2)
    prepare >> tf_training(dataset=prepare.output, model="my_linear_model:build", ps=1, workers=1, steps=1500,
                           thresholds={"mse": {"max": 1.0}}, model_name="mine")
'''


def test_a_model_module_next_to_the_dag_trains_without_pythonpath(tmp_path, group_processes, migrated_airflow_db):
    dags = tmp_path / "my_dags"
    dags.mkdir()
    (dags / "my_linear_model.py").write_text(textwrap.dedent(MODEL))
    (dags / "my_dag.py").write_text(textwrap.dedent(DAG_FILE))
    env = airflow_env(tmp_path, dags)
    env.pop("PYTHONPATH", None)
    migrated_airflow_db(env)
    result = dags_test(env, "my_own_model")
    (tmp_path / "dag.log").write_text(result.stdout)
    assert dag_run_state(result.stdout) == "success", result.stdout[-5000:]

    run_dir = next((tmp_path / "storage" / "runs").iterdir())
    snapshots = list((run_dir / "code").glob("*/my_linear_model.py"))
    assert snapshots, f"the model module is snapshotted into {run_dir / 'code'}"
    assert json.loads((run_dir / "metrics.json").read_text())["blessed"] is True
    export = tmp_path / "storage" / "models" / "mine" / "1"
    assert predict(str(export), {"x": [0.0, 5.0]}) == pytest.approx([10.0, 20.0], abs=0.5)
    assert not group_processes(tmp_path / "groups"), "no process of the group is left"
