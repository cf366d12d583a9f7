"""Every option of every backend is checked (type and range) before anything is made, and a wrong one
is refused naming where it came from (``[airflow_tf] backend_options``, the task's argument, the
class), the key, the value and what is expected: ``{"network_policy": "false"}`` is not taken as
true, nor ``{"poll_interval": 0}`` as a tight loop against the API server."""

from __future__ import annotations

import json
import re

import pytest

from airflow_tf.backends import BackendError, BackendOptionError, check_backend_options, get_backend
from airflow_tf.backends.kubernetes import KubernetesBackend
from airflow_tf.backends.kubernetes.backend import OPTIONS as KUBERNETES_OPTIONS
from airflow_tf.backends.local import OPTIONS as LOCAL_OPTIONS
from airflow_tf.backends.local import LocalBackend
from airflow_tf.operators.common import resolved_backend

CONFIG = "[airflow_tf] backend_options / $AIRFLOW_TF_BACKEND_OPTIONS"
ARGUMENT = "backend_options (the task's argument)"

# (backend, key, a wrong value, what the message says is expected)
WRONG = [
    ("kubernetes", "kubernetes_conn_id", "", "a non-empty string, or null"),
    ("kubernetes", "kubernetes_conn_id", 7, "a non-empty string, or null"),
    ("kubernetes", "namespace", "Team_A", "a Kubernetes namespace name"),
    ("kubernetes", "namespace", "a" * 64, "a Kubernetes namespace name"),
    ("kubernetes", "in_cluster", "true", "true or false (a boolean, not a string or a number), or null"),
    ("kubernetes", "config_file", ["~/.kube/config"], "a path (a non-empty string), or null"),
    ("kubernetes", "cluster_context", {}, "a non-empty string, or null"),
    ("kubernetes", "cluster_domain", "cluster.local.", "a DNS domain such as cluster.local"),
    ("kubernetes", "network_policy", "false", "true or false (a boolean, not a string or a number)"),
    ("kubernetes", "network_policy", 0, "true or false"),
    ("kubernetes", "network_policy", None, "true or false"),
    ("kubernetes", "workload", "JobSet", "a workload form, one of 'jobs'"),
    ("kubernetes", "pod_defaults", ["volumes"], "an object (a dict), or null"),
    ("kubernetes", "image", "not an image!", "a container image reference"),
    ("kubernetes", "ttl_seconds_after_finished", -1, "a whole number of seconds >= 0, or null"),
    ("kubernetes", "ttl_seconds_after_finished", "3600", "a whole number of seconds >= 0, or null"),
    ("kubernetes", "ps_max_lifetime_seconds", 0, "a whole number of seconds >= 1"),
    ("kubernetes", "ps_max_lifetime_seconds", 1.5, "a whole number of seconds >= 1"),
    ("kubernetes", "progress_interval", float("inf"), "a number of seconds > 0 (finite)"),
    ("kubernetes", "progress_interval", "60", "a number of seconds > 0 (finite)"),
    ("kubernetes", "poll_interval", 0, "a number of seconds > 0 (finite)"),
    ("kubernetes", "poll_interval", -5, "a number of seconds > 0 (finite)"),
    ("kubernetes", "poll_interval", True, "a number of seconds > 0 (finite)"),
    ("kubernetes", "task_template", "pod.yaml", "an object (a dict), or null"),
    ("kubernetes", "unreachable_toleration_seconds", -1, "a whole number of seconds >= 0, or null"),
    ("kubernetes", "unreachable_toleration_seconds", "30", "a whole number of seconds >= 0, or null"),
    ("kubernetes", "spread_over_nodes", "no", "true or false (a boolean, not a string or a number)"),
    ("kubernetes", "disruption_budget", 1, "true or false (a boolean, not a string or a number)"),
    ("local", "state_dir", "", "a path (a non-empty string), or null"),
    ("local", "state_dir", 3, "a path (a non-empty string), or null"),
]


def test_every_option_of_every_backend_has_a_wrong_value_here():
    covered = {(backend, key) for backend, key, _, _ in WRONG}
    assert covered == {("kubernetes", key) for key in KUBERNETES_OPTIONS} | {("local", key) for key in LOCAL_OPTIONS}


@pytest.mark.parametrize(("backend", "key", "value", "expected"), WRONG,
                         ids=[f"{b}-{k}-{v!r}" for b, k, v, _ in WRONG])
def test_a_wrong_value_is_refused_naming_the_setting_the_key_and_what_is_expected(backend, key, value, expected):
    with pytest.raises(BackendOptionError) as caught:
        check_backend_options(backend, {key: value}, CONFIG)
    assert str(caught.value).startswith(f"{CONFIG}: {key}: got {value!r}; expected {expected}"), str(caught.value)
    # The same check, whichever way the backend is made.
    with pytest.raises(BackendOptionError, match=f"^backend_options: {key}: got "):
        get_backend(backend, **{key: value})
    with pytest.raises(BackendOptionError, match=f"^{(KubernetesBackend if backend == 'kubernetes' else LocalBackend).__name__}: {key}: got "):
        (KubernetesBackend if backend == "kubernetes" else LocalBackend)(**{key: value})


def test_the_pod_defaults_are_checked_as_a_roles_pod_settings_are():
    with pytest.raises(BackendOptionError) as caught:
        check_backend_options("kubernetes", {"pod_defaults": {"run_as_user": 0, "shm_size": "lots"}}, ARGUMENT)
    message = str(caught.value)
    assert message.startswith(f"{ARGUMENT}: pod_defaults: invalid Kubernetes settings:"), message
    assert "pod_defaults.shm_size: 'lots' is not a Kubernetes quantity" in message
    assert "pod_defaults.run_as_user: must be a positive numeric id (pods never run as root)" in message


def test_every_problem_is_reported_at_once():
    with pytest.raises(BackendOptionError) as caught:
        check_backend_options("kubernetes", {"poll_interval": 0, "network_policy": "false", "namespce": "ml"}, CONFIG)
    lines = str(caught.value).splitlines()
    assert lines[0] == f"{CONFIG}: 3 invalid options of the kubernetes backend:"
    assert [line.strip().split(": ")[1] for line in lines[1:]] == ["'namespce'", "poll_interval", "network_policy"]


def test_good_values_are_kept():
    options = {"namespace": "team-a", "network_policy": False, "poll_interval": 2, "progress_interval": 0.5,
               "ttl_seconds_after_finished": None, "ps_max_lifetime_seconds": 60, "in_cluster": True,
               "workload": "jobset", "pod_defaults": {"run_as_user": 1001}, "image": "registry.example/tf:2.21"}
    assert check_backend_options("kubernetes", options, ARGUMENT) == {**options, "poll_interval": 2.0}
    backend = get_backend("kubernetes", kubernetes_conn_id=None, **options)
    assert (backend.poll_interval, backend.network_policy, backend.namespace) == (2.0, False, "team-a")


@pytest.fixture
def deployment(monkeypatch):
    for name in ("AIRFLOW_TF_BACKEND", "AIRFLOW_TF_BACKEND_OPTIONS", "AIRFLOW_TF_STATE_DIR",
                 "AIRFLOW__AIRFLOW_TF__BACKEND", "AIRFLOW__AIRFLOW_TF__BACKEND_OPTIONS", "AIRFLOW__AIRFLOW_TF__STATE_DIR"):
        monkeypatch.delenv(name, raising=False)

    def configure(backend: str, options: dict) -> None:
        monkeypatch.setenv("AIRFLOW__AIRFLOW_TF__BACKEND", backend)
        monkeypatch.setenv("AIRFLOW__AIRFLOW_TF__BACKEND_OPTIONS", json.dumps(options))
    return configure


def test_the_deployments_options_are_refused_naming_the_setting(deployment):
    deployment("kubernetes", {"namespace": "ml", "poll_interval": 0})
    with pytest.raises(ValueError, match=re.escape(f"{CONFIG}: poll_interval: got 0; expected a number of seconds > 0")):
        resolved_backend(None, None)
    deployment("kubernetes", {"network_policy": "false"})
    with pytest.raises(ValueError, match=re.escape(f"{CONFIG}: network_policy: got 'false'; expected true or false")):
        resolved_backend(None, None)
    deployment("local", {"state_dir": 5})
    with pytest.raises(ValueError, match=re.escape(f"{CONFIG}: state_dir: got 5; expected a path")):
        resolved_backend(None, None)


def test_a_dags_own_options_are_refused_naming_the_argument(deployment):
    deployment("kubernetes", {"namespace": "ml"})
    with pytest.raises(ValueError, match=re.escape(f"{ARGUMENT}: progress_interval: got 0.0; expected a number")):
        resolved_backend(None, {"progress_interval": 0.0})
    with pytest.raises(ValueError, match=re.escape(f"{ARGUMENT}: 'namespace': the local backend has no such option")):
        resolved_backend("local", {"namespace": "ml"})
    # Refused before anything is made, and never worth a retry: a ValueError as well as a BackendError.
    assert issubclass(BackendOptionError, ValueError) and issubclass(BackendOptionError, BackendError)


def test_a_namespace_per_team_from_one_setting(deployment):
    """Airflow's multi-team mode: ``{team}`` in the namespace is the team of the task's DAG."""
    deployment("kubernetes", {"namespace": "ml-{team}", "kubernetes_conn_id": "kubernetes_default"})
    assert resolved_backend(None, None, "vision") == ("kubernetes", {"namespace": "ml-vision",
                                                                     "kubernetes_conn_id": "kubernetes_default"})
    assert resolved_backend(None, {"namespace": "{team}"}, "nlp")[1] == {"namespace": "nlp"}
    with pytest.raises(ValueError, match=re.escape(f"{CONFIG}: namespace: 'ml-{{team}}' holds {{team}}, but this "
                                                   "task's DAG belongs to no team")):
        resolved_backend(None, None, None)
    with pytest.raises(ValueError, match=re.escape(f"{CONFIG}: namespace: 'ml-{{team}}' with the task's team "
                                                   "'Vision_Team' is 'ml-Vision_Team', not a Kubernetes namespace")):
        resolved_backend(None, None, "Vision_Team")
    # The backend itself takes only a namespace: the placeholder is the operators' to fill in.
    with pytest.raises(BackendOptionError, match=r"still holds \{team\}"):
        KubernetesBackend(kubernetes_conn_id=None, namespace="ml-{team}")


def test_a_dag_naming_its_backend_is_refused_while_it_is_parsed():
    from airflow_tf.operators import LaunchTFClusterOperator

    with pytest.raises(BackendOptionError, match=re.escape("backend_options: network_policy: got 'false'; expected")):
        LaunchTFClusterOperator(task_id="launch", dataset="/data/d/1", backend="kubernetes",
                                backend_options={"namespace": "ml", "network_policy": "false"})
    with pytest.raises(BackendOptionError, match=re.escape("backend_options: 'namespace': the local backend has no")):
        LaunchTFClusterOperator(task_id="launch", dataset="/data/d/1", backend="local", backend_options={"namespace": "ml"})
    # Known only when the task runs: checked then, by resolved_backend.
    LaunchTFClusterOperator(task_id="launch", dataset="/data/d/1", backend="kubernetes",
                            backend_options={"namespace": "ml", "poll_interval": "{{ params.poll }}"})
