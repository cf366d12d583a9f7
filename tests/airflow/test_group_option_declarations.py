"""A group's options are declared once, as GroupOptions' fields: GroupSpec's defaults, the launch
operator's parameters (default, documentation) and the group flags of ``airflow-tf run`` and
``airflow-tf render`` (name, help, default) are made from or checked against them. A default or
a text changed on one side only, or an option one side lacks, fails here."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from types import SimpleNamespace

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_tf.cli import RENDER_GROUP_OPTIONS, RUN_GROUP_OPTIONS, _add_render, _add_run, _run_spec, main
from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.cluster.declarations import flag_help, flag_name, parameter_doc
from airflow_tf.cluster.group_options import LAUNCH_OPTIONS, OPTIONS, ROLE_COUNTS, GroupOptions, group_options_of
from airflow_tf.operators import LaunchTFClusterOperator

# A parameter that takes None for an option whose own default is empty (no variables).
NONE_FOR_EMPTY = ("pass_env",)


def disagreements(signature: inspect.Signature, names: tuple[str, ...]) -> list[str]:
    """How a signature's parameters differ from the group options ``names``: a missing option, or
    a default of another value or type."""
    found = []
    for name in names:
        if name not in signature.parameters:
            found.append(f"{name}: GroupOptions has it, the parameters do not")
            continue
        given = signature.parameters[name].default
        expected = None if name in NONE_FOR_EMPTY else OPTIONS[name].default
        if given != expected or type(given) is not type(expected):
            found.append(f"{name}: the parameter's default is {given!r}, GroupOptions' {expected!r}")
    return found


def test_the_launch_operators_group_parameters_have_group_options_defaults():
    assert disagreements(inspect.signature(LaunchTFClusterOperator.__init__), LAUNCH_OPTIONS) == []


def test_a_default_changed_on_one_side_or_an_option_a_side_lacks_is_reported():
    signature = inspect.signature(LaunchTFClusterOperator.__init__)
    drifted = signature.replace(parameters=[p.replace(default=4) if p.name == "workers" else p
                                            for p in signature.parameters.values() if p.name != "port"])
    assert disagreements(drifted, LAUNCH_OPTIONS) == ["workers: the parameter's default is 4, GroupOptions' 2",
                                                      "port: GroupOptions has it, the parameters do not"]


def test_a_group_spec_made_without_options_has_the_declared_defaults():
    spec = GroupSpec.for_training("g", TrainingConfig(dataset="/d", run_dir="/r", steps=10))
    for name in set(OPTIONS) - set(ROLE_COUNTS) - {"pass_env"}:
        assert getattr(spec, name) == OPTIONS[name].default, name
    assert spec.pass_env == list(GroupOptions().pass_env)
    assert (spec.replicas("ps"), spec.replicas("worker"), spec.replicas("chief")) == (
        GroupOptions().ps, GroupOptions().workers, GroupOptions().chief)
    assert GroupSpec(name="g", training=TrainingConfig(dataset="/d", run_dir="/r", steps=10)).replicas("worker") == 2


def test_every_group_option_reaches_the_group_spec_and_is_documented_there():
    spec_fields = {f.name for f in dataclasses.fields(GroupSpec)}
    for_training = inspect.signature(GroupSpec.for_training).parameters
    for name in OPTIONS:
        assert name in (for_training if name in ROLE_COUNTS else spec_fields), name
    assert set(LAUNCH_OPTIONS) | set(RUN_GROUP_OPTIONS) | set(RENDER_GROUP_OPTIONS) <= set(OPTIONS)
    doc = inspect.getdoc(GroupSpec) or ""
    assert "{group_options}" not in doc
    for option in dataclasses.fields(GroupOptions):
        assert option.metadata["doc"], f"GroupOptions.{option.name} has no documentation"
        if option.name not in ROLE_COUNTS:
            assert f":param {option.name}: {parameter_doc(option)}" in doc, option.name
    assert disagreements(inspect.signature(GroupSpec.for_training), ROLE_COUNTS) == []


def _parser(add) -> argparse.ArgumentParser:
    sub = argparse.ArgumentParser(prog="airflow-tf").add_subparsers()
    add(sub)
    return next(iter(sub.choices.values()))


@pytest.mark.parametrize(("add", "names"), [(_add_run, RUN_GROUP_OPTIONS), (_add_render, RENDER_GROUP_OPTIONS)])
def test_each_commands_group_flags_have_the_declared_name_help_and_default(add, names):
    flags = {action.option_strings[0]: action for action in _parser(add)._actions if action.option_strings}
    for name in names:
        action = flags[flag_name(OPTIONS[name])]
        assert action.help == flag_help(OPTIONS[name]).replace("``", ""), name
        default = OPTIONS[name].default
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            assert action.default == default and type(action.default) is type(default), name


def test_the_help_of_run_and_render_states_the_group_defaults():
    run_help = " ".join(_parser(_add_run).format_help().split())
    render_help = " ".join(_parser(_add_render).format_help().split())
    assert "--ps PS parameter-server tasks (default 1)" in run_help
    assert "--workers WORKERS worker tasks (default 2)" in render_help
    assert "restarts of each failed task before the group fails (default 3)" in run_help
    assert "--deadline SECONDS fail the group if it runs longer than this many seconds" in run_help
    assert "restart a training task with no progress for this long (default 300; 0 never)" in run_help
    assert "3 unanswered in a row restart it (default 5; 0 never)" in run_help
    assert "--port PORT gRPC port of every task (default 2222)" in render_help
    assert "--port" not in run_help and "--deadline" not in render_help


def test_run_flags_become_the_groups_options_and_0_means_never(tmp_path):
    args = _parser(_add_run).parse_args(["--dataset", str(tmp_path), "--steps", "10", "--workers", "3", "--deadline", "60",
                                         "--progress-timeout", "0", "--pass-env", "A", "--pass-env", "B"])
    assert group_options_of(args, "progress_timeout", "health_timeout") == {"progress_timeout": None,
                                                                           "health_timeout": 5.0}
    spec = _run_spec(args, "g", str(tmp_path / "run"))
    assert (spec.replicas("ps"), spec.replicas("worker"), spec.backoff_limit) == (1, 3, 3)
    assert (spec.active_deadline_seconds, spec.progress_timeout, spec.health_timeout) == (60.0, None, 5.0)
    assert spec.pass_env == ["A", "B"]


@pytest.mark.parametrize(("argv", "message"), [
    (["render", "--name", "g", "--image", "i", "--port", "70000"], "--port: must be a TCP port 1-65535, got 70000"),
    (["run", "--dataset", "/d", "--steps", "9", "--backoff-limit", "-1"],
     "  --backoff-limit: must be a whole number >= 0, got -1"),
    (["run", "--dataset", "/d", "--steps", "9", "--deadline", "-5"], "  --deadline: must be positive, got -5.0"),
])
def test_a_bad_group_flag_is_refused_naming_it(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)  # run's default run directory
    with pytest.raises(SystemExit) as exit_:
        code = main(argv)
        raise SystemExit(code)
    err = capsys.readouterr().err + str(exit_.value.code)
    assert message in err, err


@pytest.mark.parametrize(("name", "value", "message"), [
    ("workers", "0", "workers: expected a whole number >= 1, got '0'"),
    ("ps", 0, "ps: expected a whole number >= 1, got 0"),
    ("chief", "-1", "chief: expected a whole number >= 0, got '-1'"),
])
def test_the_launch_operator_refuses_a_task_count_out_of_bounds_naming_it(tmp_path, monkeypatch, name, value, message):
    monkeypatch.setenv("AIRFLOW_TF_STORAGE", str(tmp_path))
    with DAG("counts", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        launch = LaunchTFClusterOperator(task_id="launch", dataset=str(tmp_path / "ds"), steps=10, **{name: value})
    ti = SimpleNamespace(dag_id="counts", task_id="launch", run_id="manual__1", map_index=-1, try_number=1)
    with pytest.raises(ValueError) as refused:
        launch.build_spec({"ti": ti})
    assert str(refused.value) == message


def test_the_launch_operator_documents_each_group_option_once_as_declared():
    doc = inspect.getdoc(LaunchTFClusterOperator) or ""
    assert "{group_options}" not in doc
    for name in LAUNCH_OPTIONS:
        assert doc.count(f":param {name}:") == 1, name
        assert f":param {name}: {parameter_doc(OPTIONS[name])}" in doc, name
    assert ":param port: gRPC port of every task (default 2222); Kubernetes only" in doc
