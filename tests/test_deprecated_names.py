"""One meaning per public name: a name that changed meaning keeps working, for one minor release,
as a shim that warns with the project's own ``AirflowTFDeprecationWarning`` (which users filter on)
and names its replacement; no module of the package warns with plain ``DeprecationWarning``."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

from airflow_tf.cluster import GroupStatus, Phase, TaskStatus, group_outcome, task_failure_reason
from airflow_tf.deprecation import AirflowTFDeprecationWarning

PACKAGE = Path(__file__).resolve().parents[1] / "airflow_tf"


def test_backends_wait_describe_failure_is_group_failure_message_with_the_projects_warning():
    from airflow_tf.backends.wait import describe_failure, group_failure_message

    args = ("g", "g-worker-1 failed: exit code 1", "g-worker-1", "a\nb\nTraceback: boom\n")
    with pytest.warns(AirflowTFDeprecationWarning, match=r"describe_failure is deprecated .* use "
                      r"airflow_tf.backends.wait.group_failure_message") as caught:
        old = describe_failure(*args)
    assert old == group_failure_message(*args) and old.endswith("    Traceback: boom")
    assert caught[0].filename == __file__, "the warning points at the caller's line"


def test_cluster_evaluate_is_group_outcome_with_the_projects_warning():
    from airflow_tf.cluster import evaluate

    status = GroupStatus("g", [TaskStatus("worker", 0, "g-worker-0", Phase.SUCCEEDED)])
    with pytest.warns(AirflowTFDeprecationWarning, match="use airflow_tf.cluster.group_outcome"):
        assert evaluate(status) == group_outcome(status)


def test_a_tasks_failure_reason_is_its_exit_and_last_log_line():
    assert task_failure_reason(137, "loading\n  OOM: out of memory  \n\n") == \
        "exit code 137 (SIGKILL); last log line: OOM: out of memory"
    assert task_failure_reason(-15, None) == "killed by SIGTERM"


def test_no_module_warns_with_plain_deprecation_warning():
    plain = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("warnings.warn", "warn"):
                category = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "category"), None)
                if category is not None and ast.unparse(category).endswith(("DeprecationWarning", "FutureWarning")) \
                        and ast.unparse(category) != "AirflowTFDeprecationWarning":
                    plain.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert plain == [], "warn with airflow_tf.deprecation.deprecated() (AirflowTFDeprecationWarning) instead"


def test_the_parts_of_a_parallel_prepare_are_importable_from_their_old_module_with_a_warning():
    from airflow_tf.data import parts

    with pytest.warns(AirflowTFDeprecationWarning, match=r"data.partitioned.plan_parts is deprecated .* use "
                      r"airflow_tf.data.parts.plan_parts"):
        from airflow_tf.data.partitioned import plan_parts
    assert plan_parts is parts.plan_parts
    with pytest.raises(ImportError):
        from airflow_tf.data.partitioned import no_such_name  # noqa: F401


# -- min/max_shard_bytes: the embedding tables' pieces are slices ("shard" is a training file) -------------
SHARD_TO_SLICE = [("min_shard_bytes", "min_slice_bytes", 4096), ("max_shard_bytes", "max_slice_bytes", 2**30)]


@pytest.mark.parametrize(("old", "new", "value"), SHARD_TO_SLICE)
def test_the_old_training_option_name_sets_the_slice_option_with_the_projects_warning(old, new, value):
    from airflow_tf.cluster import TrainingConfig

    with pytest.warns(AirflowTFDeprecationWarning, match=rf"TrainingConfig\({old}=\.\.\.\) is deprecated .* use {new}=") \
            as caught:
        config = TrainingConfig(dataset="/d", run_dir="/r", steps=5, **{old: value})
    assert caught[0].filename == __file__, "the warning points at the caller's line"
    assert config == TrainingConfig(dataset="/d", run_dir="/r", steps=5, **{new: value})
    assert old not in config.to_dict() and config.to_args()[-4:].count(str(value)) == 1
    with pytest.raises(ValueError, match=rf"{old} is the deprecated name of {new}; give {new} only"), \
            pytest.warns(AirflowTFDeprecationWarning):
        TrainingConfig(dataset="/d", run_dir="/r", steps=5, **{old: value, new: value + 1})


@pytest.mark.parametrize(("old", "new", "value"), SHARD_TO_SLICE)
def test_the_old_attribute_reads_and_writes_the_slice_option_with_the_warning(old, new, value):
    """Code that read ``config.min_shard_bytes`` gets the value in force, never a silent None."""
    import dataclasses

    from airflow_tf.cluster import TrainingConfig

    config = TrainingConfig(dataset="/d", run_dir="/r", steps=5, **{new: value})
    with pytest.warns(AirflowTFDeprecationWarning, match=rf"TrainingConfig\.{old} is deprecated .* use "
                                                         rf"TrainingConfig\.{new}") as caught:
        assert getattr(config, old) == value
    assert caught[0].filename == __file__
    with pytest.warns(AirflowTFDeprecationWarning):
        setattr(config, old, value * 2)
    assert getattr(config, new) == value * 2
    # The old name is no field: a copy with a change keeps the value and warns of nothing.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(dataclasses.replace(config, steps=6), new) == value * 2


@pytest.mark.parametrize(("old", "new", "value"), SHARD_TO_SLICE)
def test_the_old_flag_reaches_the_same_setting_in_a_task_and_in_airflow_tf_render(old, new, value, capsys):
    """A task started by an earlier release's launcher is given the old flag; ``airflow-tf
    render`` passes the new one to the tasks it writes."""
    from airflow_tf.cli import main
    from airflow_tf.cluster import TrainingConfig

    flag, new_flag = "--" + old.replace("_", "-"), "--" + new.replace("_", "-")
    base = ["--dataset", "/d", "--run-dir", "/r", "--steps", "5"]
    with pytest.warns(AirflowTFDeprecationWarning, match=rf"{flag} is deprecated .* use {new_flag}"):
        config = TrainingConfig.from_args([*base, flag, str(value)])
    assert config == TrainingConfig.from_args([*base, new_flag, str(value)])
    assert getattr(config, new) == value
    with pytest.raises(ValueError, match=rf"{flag} is the deprecated name of {new_flag}; give {new_flag} only"), \
            pytest.warns(AirflowTFDeprecationWarning):
        TrainingConfig.from_args([*base, flag, str(value), new_flag, str(value + 1)])

    other = "--max-slice-bytes" if old == "min_shard_bytes" else "--min-slice-bytes"
    render = ["render", "--name", "demo", "--image", "registry.example/tf:2.21", other, "4096"]
    with pytest.warns(AirflowTFDeprecationWarning, match=rf"{flag} is deprecated"):
        assert main([*render, flag, str(value)]) == 0
    manifests = capsys.readouterr().out
    assert f"- {new_flag}\n" in manifests and f"- '{value}'\n" in manifests and flag not in manifests


def test_a_dict_written_before_the_rename_is_read_with_the_warning():
    """A launch result in XCom or a local group's saved spec from an earlier release names the old keys."""
    from airflow_tf.cluster import GroupSpec, TrainingConfig

    spec = GroupSpec.for_training("g", TrainingConfig(dataset="/d", run_dir="/r", steps=5, max_slice_bytes=2**30))
    saved = spec.to_dict()
    saved["training"]["max_shard_bytes"] = saved["training"].pop("max_slice_bytes")
    with pytest.warns(AirflowTFDeprecationWarning, match=r"max_shard_bytes=\.\.\.\) is deprecated .* use "
                      r"max_slice_bytes="):
        assert GroupSpec.from_dict(saved) == spec
    with pytest.raises(ValueError, match=r"unknown training option\(s\): shard_bytes"):
        TrainingConfig.from_dict({"dataset": "/d", "run_dir": "/r", "steps": 5, "shard_bytes": 1})


@pytest.mark.parametrize(("old", "new", "value"), SHARD_TO_SLICE)
def test_the_launch_operator_takes_the_old_name_as_parameter_and_training_key(old, new, value, tmp_path, monkeypatch):
    from types import SimpleNamespace

    import pendulum
    from airflow.sdk import DAG

    from airflow_tf.operators import LaunchTFClusterOperator

    monkeypatch.setenv("AIRFLOW_TF_STORAGE", str(tmp_path))
    ti = SimpleNamespace(dag_id="renamed", task_id="launch", run_id="manual__1", map_index=-1, try_number=1)
    with DAG("renamed", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        LaunchTFClusterOperator(task_id="imported_first", dataset="/d", steps=5)
        with pytest.warns(AirflowTFDeprecationWarning, match=rf"LaunchTFClusterOperator\({old}=\.\.\.\) is "
                          rf"deprecated .* use {new}="):
            launch = LaunchTFClusterOperator(task_id="launch", dataset=str(tmp_path / "ds"), steps=5, **{old: value})
        with pytest.warns(AirflowTFDeprecationWarning, match=rf"{old}=\.\.\.\) is deprecated .* use {new}="):
            in_training = LaunchTFClusterOperator(task_id="in_training", dataset=str(tmp_path / "ds"),
                                                  training={"steps": 5, old: value})
        with pytest.raises(ValueError, match=rf"{old} is the deprecated name of {new}; give {new} only"), \
                pytest.warns(AirflowTFDeprecationWarning):
            LaunchTFClusterOperator(task_id="both", dataset="/d", steps=5, **{old: value, new: value + 1})
    assert getattr(launch.build_spec({"ti": ti}).training, new) == value
    assert getattr(in_training, new) == value


def _defined_names() -> dict[str, list[str]]:
    """Each public function or class defined at a module's top level, with the modules defining it;
    a deprecation shim (it calls ``deprecated``) and a module's ``main`` (its entry point) left out."""
    defined: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) or node.name.startswith("_"):
                continue
            shim = any(isinstance(call, ast.Call) and ast.unparse(call.func) == "deprecated" for call in ast.walk(node))
            if not shim and node.name != "main":
                defined.setdefault(node.name, []).append(str(path.relative_to(PACKAGE.parent)))
    return defined


def test_no_public_name_is_defined_in_two_modules():
    twice = {name: paths for name, paths in _defined_names().items() if len(paths) > 1}
    assert twice == {}, "one name, one meaning: rename one of them (through deprecated() if it is public API)"
