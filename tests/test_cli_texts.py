"""What a newcomer reads from ``airflow-tf``: its version, its help, and errors in the words they
typed (the flag, not the library's parameter; where bad JSON went wrong and what was expected).
Quick: nothing runs but the parsing and the checks of the options."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from airflow_tf.cli import main
from airflow_tf.cluster.training import argument_parser

ROOT = Path(__file__).resolve().parents[1]
RENDER = ["render", "--name", "demo", "--image", "registry.example/tf:2.21"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``airflow-tf ARGV`` (in this process)."""
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
        if isinstance(exit_.code, str):
            print(exit_.code, file=__import__("sys").stderr)
    out, err = capsys.readouterr()
    return code, out, err


def test_version_prints_the_package_version(capsys):
    code, out, _ = run(capsys, "--version")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert code == 0 and out == f"airflow-tf {version}\n"


def test_the_top_level_help_says_what_the_tool_does_in_plain_text(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert "Train TensorFlow models on a parameter-server/worker group without Airflow" in out
    assert "``" not in out and "rooms below" not in out and "only parses arguments" not in out
    assert "--version" in out


def test_demo_has_a_description_and_the_launchs_code_dir_is_not_offered(capsys):
    code, out, _ = run(capsys, "demo", "--help")
    assert code == 0 and "Run the example DAG tf_linear_regression" in out
    for command in ("run", "render"):
        code, out, _ = run(capsys, command, "--help")
        assert code == 0 and "--code-dir" not in out and "--model-kwargs" in out, command
    # Still a flag: the launch passes it to every task.
    assert argument_parser().parse_args(["--dataset", "/d", "--run-dir", "/r", "--code-dir", "/r/code"]).code_dir == "/r/code"


@pytest.mark.parametrize(("argv", "message"), [
    ([*RENDER, "--model-kwargs", "{units: 3}"],
     "argument --model-kwargs: '{units: 3}' is not JSON (Expecting property name enclosed in double quotes at "
     "character 2); expected a JSON object, e.g. '{\"hidden_units\": [64, 32]}'"),
    ([*RENDER, "--model-kwargs", "[3]"], "argument --model-kwargs: '[3]' is JSON but not a JSON object"),
    (["evaluate", "--run-dir", "r", "--thresholds", '{"mse": {"max": 1.0}'],
     "argument --thresholds: '{\"mse\": {\"max\": 1.0}' is not JSON (Expecting ',' delimiter at character 21); "
     "expected an object of metric bounds"),
    (["export", "--run-dir", "r", "--model-name", "m", "--metrics", "@/nonexistent/metrics.json"],
     "argument --metrics: cannot read /nonexistent/metrics.json: No such file or directory; expected an evaluation "
     "result object"),
])
def test_bad_json_names_the_flag_where_it_went_wrong_and_what_was_expected(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and message in err, err
    assert "invalid loads value" not in err


@pytest.mark.parametrize(("argv", "said", "not_said"), [
    ([*RENDER, "--queue-name", "team-a"],
     ["--queue-name: 'team-a' needs --workload jobset: with --workload jobs every role",
      "Set --workload jobset, or drop --queue-name"],
     ["queue_name", "backend_options", "workload="]),
    ([*RENDER, "--workload", "jobset", "--workload-priority-class", "high"],
     ["--workload-priority-class: 'high' needs --queue-name"], ["workload_priority_class", "queue_name"]),
    ([*RENDER, "--shm-size", "1X"], ["  --shm-size: '1X' is not a Kubernetes quantity"], ["roles.", "shm_size"]),
    ([*RENDER, "--service-account", "Bad_SA"], ["  --service-account: 'Bad_SA' is not a valid service account name"],
     ["roles.", "service_account"]),
    ([*RENDER, "--data-claim", "BAD"], ["  --data-claim/--runs-claim: 'BAD' is not a Kubernetes object name"],
     ["roles.", "volumes"]),
    ([*RENDER, "--workers", "0"], ["  --workers: a group needs at least one worker"], ["roles.worker"]),
    ([*RENDER, "--mode", "coordinator", "--sync"],
     ["  --sync: coordinator mode updates the parameters asynchronously only; drop --sync or use --mode between_graph"],
     ["sync=True", "mode='between_graph'"]),
    (["run", "--dataset", "/nowhere", "--learning-rate", "-1"], ["  --learning-rate: must be between"],
     ["learning_rate"]),
])
def test_errors_name_the_flag_the_user_typed(capsys, argv, said, not_said):
    code, out, err = run(capsys, *argv)
    assert code != 0 and out == ""
    for text in said:
        assert text in err, err
    for text in not_said:
        assert text not in err, err
