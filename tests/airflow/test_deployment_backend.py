"""The deployment's backend (``[airflow_tf] backend`` / ``backend_options``) for trainings that
name none, read when a task runs."""

from __future__ import annotations

import pytest

from airflow_tf.operators.common import resolved_backend


@pytest.fixture(autouse=True)
def no_deployment_settings(monkeypatch):
    for name in ("AIRFLOW_TF_BACKEND", "AIRFLOW_TF_BACKEND_OPTIONS", "AIRFLOW_TF_STATE_DIR",
                 "AIRFLOW__AIRFLOW_TF__BACKEND", "AIRFLOW__AIRFLOW_TF__BACKEND_OPTIONS", "AIRFLOW__AIRFLOW_TF__STATE_DIR"):
        monkeypatch.delenv(name, raising=False)


def test_without_settings_a_training_that_names_no_backend_runs_locally():
    assert resolved_backend(None, None) == ("local", {})


def test_the_deployment_backend_and_its_options_apply_to_trainings_that_name_none(monkeypatch):
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TF__BACKEND", "kubernetes")
    monkeypatch.setenv("AIRFLOW_TF_BACKEND_OPTIONS", '{"namespace": "ml", "image": "registry.example.com/t:1"}')
    assert resolved_backend(None, None) == ("kubernetes", {"namespace": "ml", "image": "registry.example.com/t:1"})
    # A DAG's own options win, whole; so does a backend it names.
    assert resolved_backend(None, {"namespace": "team-a"}) == ("kubernetes", {"namespace": "team-a"})
    assert resolved_backend("local", None) == ("local", {})


def test_the_local_state_dir_still_comes_from_its_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_TF_STATE_DIR", str(tmp_path))
    assert resolved_backend(None, None) == ("local", {"state_dir": str(tmp_path)})


@pytest.mark.parametrize(("variable", "value", "words"), [
    ("AIRFLOW_TF_BACKEND", "kubernets", "'kubernets' is not one of local, kubernetes"),
    ("AIRFLOW_TF_BACKEND_OPTIONS", '{"namespace": ', "$AIRFLOW_TF_BACKEND_OPTIONS is not JSON"),
    ("AIRFLOW_TF_BACKEND_OPTIONS", '["ml"]', "expected a JSON object, got list"),
])
def test_a_bad_setting_fails_naming_it(monkeypatch, variable, value, words):
    monkeypatch.setenv("AIRFLOW_TF_BACKEND", "kubernetes")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=words.replace("$", r"\$").replace("(", r"\(")):
        resolved_backend(None, None)


def test_a_misspelt_option_fails_naming_the_setting_the_key_and_the_backends_options(monkeypatch):
    from airflow_tf.backends import BackendError, get_backend

    monkeypatch.setenv("AIRFLOW_TF_BACKEND", "kubernetes")
    monkeypatch.setenv("AIRFLOW_TF_BACKEND_OPTIONS", '{"namespace": "ml", "worklaod": "jobset"}')
    with pytest.raises(ValueError, match=r"^\[airflow_tf\] backend_options / \$AIRFLOW_TF_BACKEND_OPTIONS: 'worklaod': "
                                         r"the kubernetes backend has no such option; its options are: "
                                         r"kubernetes_conn_id \(.*\); namespace \(.*workload"):
        resolved_backend(None, None)
    with pytest.raises(BackendError, match=r"^backend_options: 'namespace': the local backend has no such option; "
                                           r"its options are: state_dir \(where groups keep their state and logs\)$"):
        get_backend("local", namespace="ml")
