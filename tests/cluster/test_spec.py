"""The group spec, names, TF_CONFIG and completion rules: pure Python, no TensorFlow."""

import json
import re

import pytest

from airflow_tf.cluster import (
    GroupSpec, GroupStatus, Phase, RoleSpec, SpecError, TaskStatus, TrainingConfig, cluster_def,
    dns1123_label, evaluate, group_outcome, group_name, is_retryable_exit, label_value, tf_config_json,
)
from airflow_tf.cluster.names import is_dns1123_label
from airflow_tf.deprecation import AirflowTFDeprecationWarning


def training(**kw):
    return TrainingConfig(dataset="/data/ds/1", run_dir="/runs/r", steps=100, **kw)


def test_hostile_dag_id_gives_valid_distinct_names():
    a = group_name("My_Model; rm -rf /", "train", "manual__2026-01-01")
    b = group_name("my-model-rm-rf", "train", "manual__2026-01-01")
    c = group_name("My_Model; rm -rf /", "train", "manual__2026-01-02")
    for name in (a, b, c):
        assert is_dns1123_label(name) and len(name) <= 46
    assert len({a, b, c}) == 3
    assert a == group_name("My_Model; rm -rf /", "train", "manual__2026-01-01"), "a retry must find the same group"
    assert dns1123_label("My_Model") != dns1123_label("my-model")
    run_label = label_value("manual__2026-01-01T00:00:00+00:00")
    assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", run_label) and "+" not in run_label
    assert len(label_value("x" * 100)) <= 63


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(roles={"ps": RoleSpec(1), "worker": RoleSpec(0)}), "at least one worker"),
        (dict(roles={"ps": RoleSpec(1), "worker": RoleSpec(-1)}), "roles.worker.replicas"),
        (dict(roles={"ps": RoleSpec(1), "worker": RoleSpec(1), "master": RoleSpec(1)}), "TensorFlow 2.21 rejects 'master'"),
        (dict(roles={"ps": RoleSpec(1), "worker": RoleSpec(1, restart_policy="Always")}), "restart_policy"),
        (dict(roles={"ps": RoleSpec(0), "worker": RoleSpec(1)}), "at least one ps"),
        (dict(backoff_limit=-1), "backoff_limit"),
        (dict(active_deadline_seconds=0), "active_deadline_seconds"),
        (dict(health_timeout=0), "health_timeout: must be a positive number of seconds or None"),
        (dict(health_timeout=float("inf")), "health_timeout: must be a positive number of seconds or None"),
    ],
)
def test_bad_specs_are_refused_with_the_field_named(kwargs, message):
    with pytest.raises(SpecError, match=message):
        GroupSpec(name="good-name", training=training(), **kwargs)


@pytest.mark.parametrize("limit", [-1, 1.5, True, "3"])
def test_group_backoff_limit_must_be_a_whole_number_or_none(limit):
    with pytest.raises(SpecError, match="group_backoff_limit: must be a whole number >= 0 or None"):
        GroupSpec(name="good-name", training=training(), group_backoff_limit=limit)
    assert GroupSpec(name="good-name", training=training()).group_backoff_limit is None


def test_name_that_is_not_a_dns_label_is_refused():
    with pytest.raises(SpecError, match="DNS-1123"):
        GroupSpec(name="Bad_Name", training=training())


def test_replicas_to_aggregate_above_worker_count_is_refused():
    with pytest.raises(SpecError, match="replicas_to_aggregate"):
        GroupSpec.for_training("g", training(sync=True, replicas_to_aggregate=3), workers=2)


def test_tf_config_has_integer_index_and_chief_not_master():
    spec = GroupSpec.for_training("g", training(), ps=2, workers=2, chief=1)
    cluster = cluster_def(spec, lambda role, i: f"{role}-{i}:2222")
    config = json.loads(tf_config_json(cluster, "chief", 0))
    assert config["task"] == {"type": "chief", "index": 0}
    assert config["cluster"] == {
        "chief": ["chief-0:2222"], "ps": ["ps-0:2222", "ps-1:2222"], "worker": ["worker-0:2222", "worker-1:2222"],
    }
    assert json.loads(tf_config_json(cluster, "worker", 1))["task"]["index"] == 1


def test_training_options_round_trip_through_runtime_arguments():
    config = training(sync=True, replicas_to_aggregate=1, model_kwargs={"hidden": [8]})
    assert TrainingConfig.from_args(config.to_args()) == config


def test_each_training_option_is_one_flag_with_its_declared_default_help_and_range():
    import argparse
    import dataclasses

    from airflow_tf.cluster.training import INTERNAL_OPTIONS, add_training_arguments

    parser = argparse.ArgumentParser()
    add_training_arguments(parser)
    flags = {action.dest: action for action in parser._actions if action.option_strings}
    for option in dataclasses.fields(TrainingConfig):
        action = flags[option.name]
        assert action.option_strings == ["--" + option.name.replace("_", "-")]
        # What the launch sets is a flag too, kept out of --help.
        doc = argparse.SUPPRESS if option.name in INTERNAL_OPTIONS else option.metadata["doc"].replace("``", "")
        assert action.help.replace("%%", "%") == doc, option.name
        if option.name not in ("dataset", "run_dir"):
            default = option.default_factory() if option.default_factory is not dataclasses.MISSING else option.default
            assert action.default == default, option.name
        assert tuple(action.choices or ()) == tuple(option.metadata.get("choices", ())), option.name
    with pytest.raises(ValueError, match=r"learning_rate: must be between 1e-12 and 1000, got 5000"):
        TrainingConfig.from_args(["--dataset", "/d", "--run-dir", "/r", "--steps", "1", "--learning-rate", "5000"])


@pytest.mark.parametrize("value", ["ture", "2", "maybe"])
def test_a_true_false_option_that_is_neither_is_refused_naming_it(value):
    from airflow_tf.cluster.training import parse_bool

    with pytest.raises(ValueError, match=rf"sync: expected true or false, got '{value}'"):
        training(sync=value)
    with pytest.raises(ValueError, match=rf"overwrite: expected true or false, got '{value}'"):
        parse_bool(value, "overwrite")
    assert training(sync="True").sync is True and training(sync="off").sync is False


def test_exit_code_rule_retries_only_signals():
    assert is_retryable_exit("ExitCode", -9) and is_retryable_exit("ExitCode", 137)
    assert not is_retryable_exit("ExitCode", 1)
    assert is_retryable_exit("OnFailure", 1) and not is_retryable_exit("Never", -9)


def _status(*phases, failure=None):
    tasks = [TaskStatus("ps", 0, "g-ps-0", Phase.RUNNING)]
    tasks += [TaskStatus("worker", i, f"g-worker-{i}", p, reason="exit code 1" if p is Phase.FAILED else None)
              for i, p in enumerate(phases)]
    return GroupStatus("g", tasks, failure=failure)


def test_completion_rules():
    assert not group_outcome(_status(Phase.SUCCEEDED, Phase.RUNNING)).done
    assert group_outcome(_status(Phase.SUCCEEDED, Phase.RUNNING), "ChiefOrWorker0").succeeded
    done = group_outcome(_status(Phase.SUCCEEDED, Phase.SUCCEEDED))
    assert done.done and done.succeeded
    failed = group_outcome(_status(Phase.SUCCEEDED, Phase.FAILED))
    assert failed.done and not failed.succeeded and failed.failed_task.name == "g-worker-1"
    assert failed.code == "TaskFailed" and "exit code 1" in failed.reason
    deadline = group_outcome(_status(Phase.RUNNING, Phase.RUNNING, failure="active deadline of 5s passed"))
    assert deadline.done and not deadline.succeeded and deadline.reason == "active deadline of 5s passed"
    with pytest.warns(AirflowTFDeprecationWarning, match="use airflow_tf.cluster.group_outcome"):
        assert evaluate(_status(Phase.SUCCEEDED, Phase.SUCCEEDED)) == done, "the old name still works"
    counts = _status(Phase.SUCCEEDED, Phase.RUNNING).counts()
    assert counts["worker"]["Succeeded"] == 1 and counts["worker"]["Running"] == 1 and counts["ps"]["Running"] == 1
    assert GroupStatus.from_dict(_status(Phase.FAILED).to_dict()) == _status(Phase.FAILED)


def test_progress_line_round_trips_and_the_last_line_wins():
    from airflow_tf.cluster.progress import describe, format_progress, parse_progress

    log = "\n".join([
        "INFO starting",
        format_progress(10, 1000, 1200.0, 3.5, 40.0),
        "INFO checkpoint written",
        format_progress(500, 1000, 5300.25, 0.42, None),
    ])
    progress = parse_progress(log)
    assert progress == {"global_step": 500, "target_step": 1000, "percent": 50.0,
                        "examples_per_sec": 5300.2, "loss": 0.42, "eta_seconds": None}
    assert describe(progress) == "global step 500/1000 (50.0%), 5300 examples/s, loss 0.42"
    assert parse_progress("nothing here") is None


def test_a_progress_line_cut_by_tensorflows_logging_is_skipped_and_stalls_are_shown():
    from airflow_tf.cluster.progress import describe, format_progress, parse_progress

    # Seen in a long run: TensorFlow's C++ logging wrote into the middle of the chief's line.
    cut = format_progress(900, 1000, 10.0, 0.5, 280.5) + "I0000 00:00:1795466152.632978 21348 grpc_state.cc:61] ..."
    log = "\n".join([format_progress(800, 1000, 10.0, 0.5, 20.0, stalls=1), cut])
    progress = parse_progress(log)
    assert progress["global_step"] == 800 and progress["stalls"] == 1, "the whole line before the cut one"
    assert describe(progress).endswith("1 stuck step(s) recovered (see the chief's log: 'stalled step recovered')")
    assert "stalls" not in format_progress(800, 1000, 10.0, 0.5, 20.0), "shown only once a stall happened"
