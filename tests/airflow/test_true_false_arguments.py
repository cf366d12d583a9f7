"""Every true/false argument of every operator goes through one strict parser: the usual words
are understood whatever their case, and anything else is refused naming the argument, never
quietly taken as False (``overwrite="ture"`` must not keep an old version by accident)."""

from __future__ import annotations

import pendulum
import pytest
from airflow.sdk import DAG
from airflow.providers.common.compat.sdk import AirflowFailException

from airflow_tf.operators import (DatasetWindowOperator, EvaluateModelOperator, ExportSavedModelOperator,
                                  LaunchTFClusterOperator, PrepareTFRecordsOperator)
from airflow_tf.sensors import WorkerCompletionSensor

GROUP = {"backend": "local", "name": "g", "namespace": "default"}
# (operator, its other required arguments, the true/false argument, the attribute holding it)
ARGUMENTS = [
    (PrepareTFRecordsOperator, {"input": "/in.csv", "name": "ds"}, "overwrite", "overwrite"),
    (PrepareTFRecordsOperator, {"input": "/in.csv", "name": "ds"}, "allow_nan", "allow_nan"),
    (PrepareTFRecordsOperator, {"input": "/in.csv", "name": "ds"}, "cache", "cache"),
    (DatasetWindowOperator, {"name": "ds", "last": 3}, "overwrite", "overwrite"),
    (LaunchTFClusterOperator, {"dataset": "/ds"}, "isolate_network", "isolate_network"),
    (EvaluateModelOperator, {"launch": {}}, "compare_to_served", "compare_to_served"),
    (ExportSavedModelOperator, {"launch": {}, "model_name": "m"}, "force", "force"),
    (ExportSavedModelOperator, {"launch": {}, "model_name": "m"}, "warmup_requests", "warmup_requests"),
    (WorkerCompletionSensor, {"group": GROUP}, "deferrable", "deferrable"),
]


def _dag() -> DAG:
    return DAG("flags", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))


@pytest.mark.parametrize(("operator", "required", "argument", "attribute"), ARGUMENTS,
                         ids=[f"{o.__name__}.{a}" for o, _, a, _ in ARGUMENTS])
def test_a_typo_in_a_true_false_argument_fails_the_dag_naming_it(operator, required, argument, attribute):
    with _dag(), pytest.raises(ValueError, match=rf"^{argument}: expected true or false, got 'ture'"):
        operator(task_id="t", **required, **{argument: "ture"})


@pytest.mark.parametrize(("operator", "required", "argument", "attribute"), ARGUMENTS,
                         ids=[f"{o.__name__}.{a}" for o, _, a, _ in ARGUMENTS])
@pytest.mark.parametrize(("given", "meant"), [("True", True), ("yes", True), ("ON", True), ("1", True), (1, True),
                                              (True, True), ("false", False), ("No", False), ("off", False),
                                              ("0", False), (False, False)])
def test_the_usual_words_for_true_and_false_are_understood(operator, required, argument, attribute, given, meant):
    with _dag():
        task = operator(task_id="t", **required, **{argument: given})
    assert getattr(task, attribute) is meant


def test_a_templated_overwrite_that_renders_to_a_typo_fails_the_task_without_retries():
    with _dag():
        prepare = PrepareTFRecordsOperator(task_id="prepare", input="/in.csv", name="ds", output="/tmp/never",
                                           overwrite="{{ params.overwrite }}", retries=3)
    prepare.overwrite = "ture"  # as Airflow renders the template when the task runs
    with pytest.raises(AirflowFailException, match=r"overwrite: expected true or false, got 'ture'"):
        prepare.execute({})
