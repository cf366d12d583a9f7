"""Parameters of the first release (0.1.0) that were replaced keep working until 0.3.0, with a
DeprecationWarning naming the replacement, pointing at the DAG file's line. (The first release's
DAG form runs end to end in test_dags.py.)"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_tf.operators import LaunchTFClusterOperator, TeardownTFClusterOperator
from airflow_tf.operators.common import AirflowTFDeprecationWarning


def _dag(dag_id: str = "deprecations") -> DAG:
    return DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))


def test_teardown_launch_task_id_warns_naming_launch_and_finds_the_launch_by_id():
    with _dag():
        launch = LaunchTFClusterOperator(task_id="launch", dataset="/data/ds", steps=10, backend="kubernetes",
                                         backend_options={"namespace": "ml"})
        with pytest.warns(AirflowTFDeprecationWarning, match=r"launch_task_id.*use launch=") as caught:
            teardown = TeardownTFClusterOperator(task_id="teardown", launch_task_id="launch")
    assert caught[0].filename == __file__, "the warning points at the DAG author's line"
    assert issubclass(caught[0].category, DeprecationWarning)
    assert teardown.launch_task_id == "launch"
    assert (teardown.backend, teardown.backend_options) == ("kubernetes", {"namespace": "ml"}), \
        "the launch's backend is found from its task id, as from the object"
    assert not teardown.launch_is_mapped
    del launch


def test_teardown_launch_task_id_of_a_mapped_launch_tears_down_every_map_index():
    with _dag():
        LaunchTFClusterOperator.partial(task_id="launch", dataset="/data/ds", steps=10).expand(learning_rate=[0.1, 0.2])
        with pytest.warns(AirflowTFDeprecationWarning):
            teardown = TeardownTFClusterOperator(task_id="teardown", launch_task_id="launch")
    assert teardown.launch_is_mapped


def test_teardown_launch_task_id_naming_another_task_than_launch_is_refused():
    with _dag():
        launch = LaunchTFClusterOperator(task_id="launch", dataset="/data/ds", steps=10)
        with pytest.warns(AirflowTFDeprecationWarning), pytest.raises(ValueError, match="another task than launch"):
            TeardownTFClusterOperator(task_id="teardown", launch=launch, launch_task_id="other")


def test_the_new_teardown_form_does_not_warn():
    with _dag():
        launch = LaunchTFClusterOperator(task_id="launch", dataset="/data/ds", steps=10)
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            TeardownTFClusterOperator(task_id="teardown", group=launch.output)


def test_launch_training_dict_warns_and_sets_each_option(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_TF_STORAGE", str(tmp_path))
    with _dag():
        with pytest.warns(AirflowTFDeprecationWarning, match=r"training=\{\.\.\.\}.*one parameter per option") as caught:
            launch = LaunchTFClusterOperator(task_id="launch", dataset=str(tmp_path / "ds"), workers=1,
                                             training={"steps": 42, "learning_rate": 0.3, "optimizer": "adam"})
    assert caught[0].filename == __file__
    spec = launch.build_spec({"ti": SimpleNamespace(dag_id="deprecations", task_id="launch", run_id="manual__1",
                                                    map_index=-1, try_number=1)})
    assert (spec.training.steps, spec.training.learning_rate, spec.training.optimizer) == (42, 0.3, "adam")


def test_launch_training_dict_with_an_unknown_or_twice_given_option_is_refused():
    with _dag():
        with pytest.warns(AirflowTFDeprecationWarning), pytest.raises(ValueError, match="unknown option.*stepz"):
            LaunchTFClusterOperator(task_id="a", dataset="/data/ds", training={"stepz": 3})
        with pytest.warns(AirflowTFDeprecationWarning), pytest.raises(ValueError, match="steps is given twice"):
            LaunchTFClusterOperator(task_id="b", dataset="/data/ds", steps=5, training={"steps": 3})


def test_kubernetes_part_options_at_their_old_path_warn_naming_the_new_one():
    with pytest.warns(AirflowTFDeprecationWarning, match="import it from airflow_tf.backends.kubernetes"):
        from airflow_tf.backends.kubernetes_parts import KubernetesPartOptions
    from airflow_tf.backends.kubernetes import KubernetesPartOptions as moved

    assert KubernetesPartOptions is moved
