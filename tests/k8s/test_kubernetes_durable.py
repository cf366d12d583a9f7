"""Durable re-attach on Kubernetes, on the real control plane (test_kubernetes.py): the launch records the root Job's
uid in the task state store; its retry re-attaches to that group and creates nothing; a group of
the same name it did not create (another run's, or one recreated by someone else) is refused,
naming it; without a task state store (Airflow before 3.3) a retry re-attaches by name.

The launch's ``execute`` is called directly with the context entries it reads. The task state
store stands in for Airflow 3.3's (``context["task_state_store"]``: ``get``/``set`` of JSON values
kept across the tries of one task instance), a dict here: the real one, through Airflow's task
runner, is exercised with the local backend in tests/airflow/test_dags.py."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException
from .scripted import training_image
from .test_kubernetes import backend, kubeconfig, make_spec  # noqa: F401 (fixtures)

from airflow_tf import compat
from airflow_tf.backends.kubernetes.labels import GROUP_LABEL, ROOT_ANNOTATION
from airflow_tf.operators.launch import GROUP_RECORD_KEY

# Durable re-attach keeps the group's uid in the task state store, which Airflow has from 3.3;
# on older Airflow the launch logs that a retry re-attaches by name alone. CI's whole suite runs
# this file on 3.3; its run on the oldest lock (Airflow 3.1) reports it skipped.
pytestmark = pytest.mark.skipif(not compat.has_task_state_store(),
                                reason="needs Airflow 3.3's task state store")

RUN_ID = "manual__2026-11-23T00:00:00+00:00"
NAME = "tf-durable"


class TaskStateStore:
    """What the launch uses of Airflow's TaskStateStoreAccessor: JSON values by key."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value, *, retention=None):
        assert value is not None
        self.values[key] = value


def _launch(kubeconfig, namespace):
    from airflow.sdk import DAG

    from airflow_tf.operators import LaunchTFClusterOperator

    with DAG("train_k8s", schedule=None):
        return LaunchTFClusterOperator(
            task_id="launch", dataset="/data/mnist/1", backend="kubernetes", image=training_image(),
            backend_options={"kubernetes_conn_id": None, "config_file": kubeconfig, "namespace": namespace},
            group_name=NAME, steps=100)


def _context(store, try_number=1):
    ti = SimpleNamespace(dag_id="train_k8s", task_id="launch", run_id=RUN_ID, map_index=-1, try_number=try_number)
    context = {"ti": ti}
    if store is not None:
        context["task_state_store"] = store
    return context


def _root_uid(kube) -> str:
    [root] = [j for j in kube.objects("jobs", f"{GROUP_LABEL}={NAME}")
              if (j["metadata"].get("annotations") or {}).get(ROOT_ANNOTATION) == "true"]
    return root["metadata"]["uid"]


def test_a_retry_reattaches_to_the_root_job_it_recorded(kube, scripted, kubeconfig, backend):
    store, launch = TaskStateStore(), _launch(kubeconfig, kube.ns)
    first = launch.execute(_context(store))
    record = store.values[GROUP_RECORD_KEY]
    assert record["name"] == NAME and record["uid"] == first["group"]["uid"]
    assert record["uid"] == _root_uid(kube), "the root Job's uid"
    jobs = {j["metadata"]["uid"] for j in kube.objects("jobs", f"{GROUP_LABEL}={NAME}")}

    again = _launch(kubeconfig, kube.ns).execute(_context(store, try_number=2))
    assert again["reattached"] and again["group"]["uid"] == record["uid"]
    assert {j["metadata"]["uid"] for j in kube.objects("jobs", f"{GROUP_LABEL}={NAME}")} == jobs, \
        "nothing created again"


def test_a_same_named_group_it_did_not_create_is_refused(kube, scripted, kubeconfig, backend):
    # Another run (or deployment) started a group under this name first.
    theirs = backend.launch(make_spec(name=NAME))
    store = TaskStateStore()
    with pytest.raises(AirflowFailException, match=rf"launch refused: training group {NAME} \(kubernetes backend, "
                       rf"namespace {kube.ns}, uid {theirs.uid}\) already exists, but this launch \(dag train_k8s, run "
                       rf"{re.escape(RUN_ID)}, task launch, map index -1\) did not create it"):
        _launch(kubeconfig, kube.ns).execute(_context(store))
    assert GROUP_RECORD_KEY not in store.values, "nothing recorded: nothing was created"


def test_a_group_recreated_by_someone_else_under_its_name_is_refused(kube, scripted, kubeconfig, backend):
    store, launch = TaskStateStore(), _launch(kubeconfig, kube.ns)
    ours = launch.execute(_context(store))["group"]["uid"]
    backend.teardown(backend.find(NAME))
    theirs = backend.launch(make_spec(name=NAME)).uid
    assert theirs != ours
    with pytest.raises(AirflowFailException, match=rf"has uid {theirs}, this launch .* created uid {ours}"):
        _launch(kubeconfig, kube.ns).execute(_context(store, try_number=2))


def test_a_retry_whose_first_try_was_lost_before_recording_the_uid_reattaches(kube, scripted, kubeconfig, backend):
    """The first try recorded its intent, created the group and was lost before recording the uid."""
    store = TaskStateStore()
    store.set(GROUP_RECORD_KEY, {"name": NAME, "uid": None})
    created = backend.launch(make_spec(name=NAME))
    result = _launch(kubeconfig, kube.ns).execute(_context(store, try_number=2))
    assert result["reattached"] and store.values[GROUP_RECORD_KEY]["uid"] == created.uid


def test_without_a_task_state_store_a_retry_reattaches_by_name(kube, scripted, kubeconfig, backend):
    """Airflow before 3.3: today's behaviour."""
    backend.launch(make_spec(name=NAME))
    assert _launch(kubeconfig, kube.ns).execute(_context(None))["reattached"]
