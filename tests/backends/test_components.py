"""Evaluation and export go through the Backend protocol (``run_component``), whichever backend
launched the group: the operators never ask which one it is. A local group's component runs in
the task's own process, as before; a Kubernetes group's runs as a Job (test_kubernetes_operators.py)."""

from __future__ import annotations

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException

from airflow_tf.backends import Backend, BackendError, get_backend
from airflow_tf.backends.base import GroupRef

LAUNCH = {"group": {"backend": "local", "name": "tf-sales", "options": {}}, "run_dir": "/nonexistent/runs/tf-sales",
          "dataset": "/nonexistent/data/sales/1", "training": {"dataset": "/nonexistent/data/sales/1",
                                                                "run_dir": "/nonexistent/runs/tf-sales", "steps": 10}}


def test_every_backend_implements_the_protocol_run_component_included(tmp_path):
    backends = [get_backend("local", state_dir=str(tmp_path)),
                get_backend("kubernetes", kubernetes_conn_id=None, namespace="ml")]
    for backend in backends:
        assert isinstance(backend, Backend), backend.name
        assert callable(backend.run_component), backend.name


def test_a_local_groups_component_runs_in_this_process_with_its_own_errors(tmp_path):
    backend = get_backend("local", state_dir=str(tmp_path))
    ref = GroupRef(backend="local", name="tf-sales")
    with pytest.raises(ValueError, match="missing dataset, training"):
        backend.run_component(ref, "evaluate", {"run_dir": "/r"})
    with pytest.raises(BackendError, match="component 'train' is not one of evaluate, export"):
        backend.run_component(ref, "train", {"run_dir": "/r", "dataset": "/d", "training": {}})


def test_a_refused_local_evaluation_fails_without_retries_as_before():
    from airflow_tf.operators import EvaluateModelOperator

    with pytest.raises(AirflowFailException, match=r"evaluation refused: thresholds\['mse'\]: expected"):
        EvaluateModelOperator(task_id="evaluate", launch=LAUNCH, thresholds={"mse": 1.0}).execute({})
    with pytest.raises(AirflowFailException, match="evaluation refused: compare_to_served=True needs model_name="):
        EvaluateModelOperator(task_id="evaluate2", launch=LAUNCH, compare_to_served=True).execute({})
