"""``tf_training(approval=True)``: the approval sits between evaluation and export (after the
choice of a sweep), with what the person is shown; an Airflow without human-in-the-loop
operators refuses ``approval=True`` clearly and parses every other DAG. (Approving and
rejecting through the real scheduler and API server: tests/stack/test_approval_stack.py.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import timedelta

import pendulum
import pytest
from airflow.sdk import DAG
from airflow.sdk.definitions.mappedoperator import MappedOperator

from airflow_tf.cluster.results import EvaluationResult
from airflow_tf.cluster.review import review_body
from airflow_tf.task_groups import tf_training


def _dag(dag_id: str = "approval") -> DAG:
    return DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))


def test_approval_sits_between_evaluate_and_export():
    with _dag() as dag:
        tf_training(dataset="/data/ds", steps=10, model_name="m", approval=True,
                    approval_timeout=timedelta(minutes=5), on_approval_timeout="fail")
    tasks = {t.task_id: t for t in dag.tasks}
    approve = tasks["training.approve"]
    assert approve.upstream_task_ids == {"training.evaluate"}
    assert approve.downstream_task_ids == {"training.export"}
    assert approve.options == ["Approve", "Reject"]
    assert approve.response_timeout == timedelta(minutes=5) and approve.defaults is None, "fail: no default answer"


def test_no_answer_in_time_means_what_on_approval_timeout_says():
    answers = {}
    for on_timeout in ("reject", "approve"):
        with _dag(f"approval_{on_timeout}") as dag:
            tf_training(dataset="/data/ds", steps=10, model_name="m", approval=True, on_approval_timeout=on_timeout)
        answers[on_timeout] = dag.get_task("training.approve").defaults
    assert answers == {"reject": ["Reject"], "approve": ["Approve"]}
    with _dag("bad"), pytest.raises(ValueError, match="on_timeout: 'later' is not one of reject, approve, fail"):
        tf_training(dataset="/data/ds", steps=10, model_name="m", approval=True, on_approval_timeout="later")


def test_a_sweep_approves_the_chosen_run_showing_every_run():
    with _dag() as dag:
        tf_training(dataset="/data/ds", steps=10, model_name="m", approval=True,
                    expand={"learning_rate": [0.01, 0.1]}, select_by="mse")
    approve = dag.get_task("training.approve")
    assert approve.upstream_task_ids == {"training.evaluate", "training.select_best"}
    assert approve.downstream_task_ids == {"training.export"}
    assert not isinstance(approve, MappedOperator), "one approval, of the chosen run"
    assert approve.candidates is not None, "every run of the sweep is shown"


def test_approval_without_an_export_is_refused():
    with _dag(), pytest.raises(ValueError, match="approval=True needs model_name"):
        tf_training(dataset="/data/ds", steps=10, approval=True)


def test_the_person_sees_metrics_thresholds_served_model_and_the_sweep():
    chosen = EvaluationResult(
        run_dir="/runs/sweep-1", checkpoint="/runs/sweep-1/model.ckpt-500", metrics={"mse": 0.11, "mae": 0.27},
        blessed=True, global_step=500, dataset="/data/ds/1", examples=1000,
        checks=[{"metric": "mse", "rule": "max", "value": 0.11, "limit": 1.0, "passed": True},
                {"metric": "mse", "rule": "baseline", "direction": "lower_is_better", "value": 0.11, "limit": 0.2,
                 "passed": True}],
        baseline={"metric": "mse", "direction": "lower_is_better", "metrics": {"mse": 0.2, "mae": 0.4}, "version": 3})
    other = EvaluationResult(run_dir="/runs/sweep-0", checkpoint="c", metrics={"mse": 3.5, "mae": 1.5}, blessed=False)
    body = review_body("linear", chosen, [other, chosen])
    assert "| mse | 0.11 | max 1 | yes |" in body
    assert "| mse | 0.11 | served model 0.2 (lower is better) | yes |" in body
    assert "Served model (version 3)" in body and "| mae | 0.4 | 0.27 |" in body
    assert "`sweep-1` (this one) | yes | mae 0.27, mse 0.11 |" in body
    assert "`sweep-0` | no | mae 1.5, mse 3.5 |" in body


# Airflow before 3.1 has no human-in-the-loop operators: the provider's module is missing (or
# refuses to import). Simulated here by refusing that one import, as only Airflow 3.3 is installed.
WITHOUT_HITL = """
import sys
class NoHITL:
    def find_spec(self, name, path=None, target=None):
        if name == "airflow.providers.standard.operators.hitl":
            raise ImportError("No module named 'airflow.providers.standard.operators.hitl'")
sys.meta_path.insert(0, NoHITL())
import pendulum
from airflow.sdk import DAG
from airflow_tf.task_groups import tf_training
from airflow_tf.operators import EvaluateModelOperator, LaunchTFClusterOperator
with DAG("plain", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    tf_training(dataset="/data/ds", steps=10, model_name="m")
print("without approval: parsed")
with DAG("approved", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    tf_training(dataset="/data/ds", steps=10, model_name="m", approval=True)
"""


def test_an_airflow_without_human_in_the_loop_refuses_approval_naming_airflow_3_1():
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(WITHOUT_HITL)], capture_output=True, text=True,
                          timeout=300)
    assert "without approval: parsed" in done.stdout, done.stderr[-3000:]
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("airflow_tf.compat.AirflowFeatureUnavailable: Approval before export (approval=True) "
                           "needs Airflow 3.1 or newer"), last
    assert not last.startswith(("ImportError", "ModuleNotFoundError")), "a refusal, not a bare import error"
