"""One meaning per public name: a name that changed meaning keeps working, for one minor release,
as a shim that warns with the project's own ``AirflowTFDeprecationWarning`` (which users filter on)
and names its replacement; no module of the package warns with plain ``DeprecationWarning``."""

from __future__ import annotations

import ast
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
