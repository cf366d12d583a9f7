"""The launch operator's training options are TrainingConfig's fields: every field a DAG author
sets is an explicit (templated) parameter, with TrainingConfig's default and documentation.
A default changed on one side only, or a new field the operator does not take, fails here."""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import pendulum
from airflow.sdk import DAG

from airflow_tf.cluster import TrainingConfig
from airflow_tf.operators import LaunchTFClusterOperator

# Set by the launch itself (dataset and run_dir from the operator's own parameters, code_dir by the snapshot).
NOT_PARAMETERS = ("dataset", "run_dir", "code_dir")


def disagreements(signature: inspect.Signature) -> list[str]:
    """How the operator's parameters differ from TrainingConfig's fields: a missing option, or
    a default of another value or type (``model_kwargs=None`` stands for the empty dict)."""
    parameters = signature.parameters
    found = []
    for option in dataclasses.fields(TrainingConfig):
        if option.name in NOT_PARAMETERS:
            continue
        if option.name not in parameters:
            found.append(f"{option.name}: TrainingConfig has it, the operator does not take it")
            continue
        given = parameters[option.name].default
        if option.default is dataclasses.MISSING:
            expected, given = option.default_factory(), {} if given is None else given  # type: ignore[misc]
        else:
            expected = option.default
        if given != expected or type(given) is not type(expected):
            found.append(f"{option.name}: the operator's default is {given!r}, TrainingConfig's {expected!r}")
    return found


def test_the_operators_training_defaults_are_training_configs():
    assert disagreements(inspect.signature(LaunchTFClusterOperator.__init__)) == []


def test_a_default_changed_on_one_side_or_a_field_the_operator_lacks_is_reported():
    signature = inspect.signature(LaunchTFClusterOperator.__init__)
    drifted = signature.replace(parameters=[p.replace(default=0.02) if p.name == "learning_rate" else p
                                            for p in signature.parameters.values() if p.name != "seed"])
    assert disagreements(drifted) == ["learning_rate: the operator's default is 0.02, TrainingConfig's 0.01",
                                      "seed: TrainingConfig has it, the operator does not take it"]
    retyped = signature.replace(parameters=[p.replace(default=10) if p.name == "checkpoint_every_secs" else p
                                            for p in signature.parameters.values()])
    assert disagreements(retyped) == ["checkpoint_every_secs: the operator's default is 10, TrainingConfig's 10.0"]


def test_a_launch_given_no_training_option_trains_with_training_configs_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_TF_STORAGE", str(tmp_path))
    with DAG("defaults", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        launch = LaunchTFClusterOperator(task_id="launch", dataset=str(tmp_path / "ds"), steps=10)
    spec = launch.build_spec({"ti": SimpleNamespace(dag_id="defaults", task_id="launch", run_id="manual__1",
                                                    map_index=-1, try_number=1)})
    assert spec.training == TrainingConfig(dataset=str(tmp_path / "ds"), run_dir=spec.training.run_dir, steps=10)


def test_every_training_option_is_templated_and_documented_as_training_config_documents_it():
    doc = inspect.getdoc(LaunchTFClusterOperator) or ""
    for option in dataclasses.fields(TrainingConfig):
        if option.name in NOT_PARAMETERS:
            continue
        assert option.name in LaunchTFClusterOperator.template_fields, option.name
        assert option.metadata["doc"], f"TrainingConfig.{option.name} has no documentation"
        assert f":param {option.name}: {option.metadata['doc']}." in doc, option.name
    assert "{training_options}" not in doc
