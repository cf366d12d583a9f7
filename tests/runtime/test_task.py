"""``python -m airflow_tf.runtime`` as a task sees it: options, TF_CONFIG, and refusals that
happen before TensorFlow starts (each one line, exit code 2, which is not retried)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from airflow_tf.cluster import TrainingConfig
from airflow_tf.runtime.errors import TaskConfigError
from airflow_tf.runtime.task import task_from_env

CLUSTER = {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}


def runtime(*args: str, tf_config: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return subprocess.run([sys.executable, "-m", "airflow_tf.runtime", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def worker(index: int = 0, cluster: dict = CLUSTER) -> dict:
    return {"cluster": cluster, "task": {"type": "worker", "index": index}}


def test_help_works_without_tf_config():
    result = runtime("--help")
    assert result.returncode == 0, result.stderr
    assert "TF_CONFIG" in result.stdout and "--dataset" in result.stdout and "--sync" in result.stdout


def test_missing_tf_config_is_one_clear_line(tmp_path):
    result = runtime("--dataset", str(tmp_path), "--run-dir", str(tmp_path), "--steps", "5")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("airflow_tf.runtime: error: TF_CONFIG is not set")


def test_bad_options_name_the_option(tmp_path):
    result = runtime("--dataset", str(tmp_path), "--run-dir", str(tmp_path), "--steps", "0", tf_config=worker())
    assert result.returncode == 2
    assert "steps: must be between 1 and" in result.stderr and "got 0" in result.stderr


def test_dataset_without_success_marker_is_refused_before_training(tmp_path):
    dataset = tmp_path / "datasets" / "linear" / "1"
    (dataset / "train").mkdir(parents=True)
    (dataset / "schema.json").write_text('{"features": [{"name": "x", "dtype": "float32"}], "label": null}')
    result = runtime("--dataset", str(dataset), "--run-dir", str(tmp_path / "run"), "--steps", "5",
                     tf_config=worker())
    assert result.returncode == 2
    (line,) = [line for line in result.stderr.splitlines() if "error" in line]
    assert line.startswith("airflow_tf.runtime: error: dataset") and str(dataset) in line and "_SUCCESS" in line
    assert "re-run the prepare step" in line
    assert "status=refused" in result.stdout
    assert not (tmp_path / "run").exists(), "nothing is written for a refused task"


@pytest.mark.parametrize("tf_config, message", [
    ("not json", "not valid JSON"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "master", "index": 0}}', r"'master' is not one of .*\(use 'chief'\)"),
    ('{"cluster": {"ps": ["a:1"], "worker": ["a:2"]}, "task": {"type": "worker", "index": 1}}', "worker:1 is not in the cluster"),
    ('{"cluster": {"worker": ["a:2"]}, "task": {"type": "worker", "index": 0}}', 'no "ps" job'),
    ('{"cluster": {"ps": "a:1"}, "task": {"type": "ps", "index": 0}}', "list of"),
    ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": "0"}}', "whole number"),
])
def test_malformed_tf_config_is_refused_saying_what_is_wrong(tf_config, message):
    with pytest.raises(TaskConfigError, match=message):
        task_from_env({"TF_CONFIG": tf_config})


def test_the_chief_is_chief_0_or_else_worker_0_and_shards_follow_the_trainers():
    plain = task_from_env({"TF_CONFIG": json.dumps(worker(1))})
    assert not plain.is_chief and plain.trainer_index == 1 and plain.device == "/job:worker/task:1"
    assert task_from_env({"TF_CONFIG": json.dumps(worker(0))}).is_chief

    with_chief = dict(CLUSTER, chief=["127.0.0.1:4"])
    chief = task_from_env({"TF_CONFIG": json.dumps({"cluster": with_chief, "task": {"type": "chief", "index": 0}})})
    first_worker = task_from_env({"TF_CONFIG": json.dumps(worker(0, with_chief))})
    assert chief.is_chief and chief.trainer_index == 0
    assert not first_worker.is_chief and first_worker.trainer_index == 1 and len(first_worker.trainers) == 3

    # TensorFlow leaves the evaluator out of the cluster it trains with.
    evaluator = task_from_env({"TF_CONFIG": json.dumps({"cluster": CLUSTER, "task": {"type": "evaluator"}})})
    assert evaluator.type == "evaluator" and not evaluator.is_chief


def test_an_evaluator_exits_at_once(tmp_path):
    config = TrainingConfig(dataset=str(tmp_path), run_dir=str(tmp_path), steps=1)
    result = runtime(*config.to_args(), tf_config={"cluster": CLUSTER, "task": {"type": "evaluator", "index": 0}})
    assert result.returncode == 0, result.stderr
    assert "evaluator: nothing to do here" in result.stdout


@pytest.mark.slow
def test_a_ps_serves_until_sigterm_then_logs_its_exit_and_dies_of_the_signal(tmp_path):
    import signal
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = {"ps": [f"127.0.0.1:{port}"], "worker": ["127.0.0.1:1"]}
    config = TrainingConfig(dataset=str(tmp_path), run_dir=str(tmp_path), steps=1)
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}}))
    ps = subprocess.Popen([sys.executable, "-m", "airflow_tf.runtime", *config.to_args()], env=env,
                          stdout=subprocess.PIPE, text=True)
    try:
        lines = []
        while not any("serving at" in line for line in lines):
            line = ps.stdout.readline()
            assert line, f"the ps exited before serving: {lines}"
            lines.append(line)
        assert "role=ps index=0" in lines[0], "the first line names the task"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the gRPC server accepts connections
        ps.send_signal(signal.SIGTERM)
        assert ps.wait(timeout=30) == -signal.SIGTERM
        assert "airflow-tf task exit role=ps index=0 status=stopped signal=SIGTERM" in ps.stdout.read()
    finally:
        ps.kill()
        ps.wait()


class _OpError(Exception):
    """Stands in for a TensorFlow OpError: the reason reads its ``message`` attribute."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def test_a_failure_reason_is_tensorflows_cause_without_logs_frames_or_request_dumps():
    # As TensorFlow 2.21 reported a step whose RunGraph request was delivered twice (a long run).
    message = (
        "Graph execution error:\n\n=====================\nCANCELLED: From /job:worker/replica:0/task:0:\n"
        "RecvFromRemoteAsync is cancelled.\n\t [[{{node linear_regression_2/linear_1/Cast/ReadVariableOp_S49}}]]\n"
        "Recent warning and error logs:\n  W0000 00:00:1795385804.285718   29773 local_rendezvous.cc:412] "
        "Local rendezvous is aborting with status: ABORTED: Cleanup 29268989599338807\n"
        "ABORTED: From /job:ps/replica:0/task:0:\nThe same RunGraph (Worker) request was received twice. "
        'goo.gle/debugstr   graph_handle: "0000000000000008" step_id: 64400341697762656 request_id: 1337\n'
        "====================="
    )
    from airflow_tf.runtime.errors import ModelError, failure_reason

    assert failure_reason(_OpError(message)) == (
        "_OpError: CANCELLED: From /job:worker/replica:0/task:0: RecvFromRemoteAsync is cancelled. "
        "ABORTED: From /job:ps/replica:0/task:0: The same RunGraph (Worker) request was received twice."
    )
    assert failure_reason(ModelError("checkpoint x has no weight 'model/000_kernel'")) == \
        "checkpoint x has no weight 'model/000_kernel'"
    assert len(failure_reason(RuntimeError("x" * 5000))) == 500


def test_tasks_open_grpc_channels_without_grpcs_own_retries():
    from airflow_tf.runtime.task import grpc_default_options

    assert grpc_default_options(None) == "grpc.enable_retries=0"
    assert grpc_default_options("grpc.keepalive_time_ms=60000") == "grpc.keepalive_time_ms=60000,grpc.enable_retries=0"
    assert grpc_default_options("grpc.enable_retries=1") == "grpc.enable_retries=1", "the user's choice wins"


def test_threads_per_op_follow_the_role_and_the_cores_the_trainers_share(monkeypatch):
    """Unset, a ps runs one thread per op and a trainer its share of the cores its container may
    use among the trainers on its machine (the local backend says how many); set, as given."""
    from airflow_tf.data import cpus
    from airflow_tf.runtime.task import TRAINERS_ON_THIS_MACHINE, Task, intra_op_threads

    monkeypatch.setattr(cpus, "usable_cpus", lambda: 8)
    ps, trainer = Task("ps", 0, CLUSTER), Task("worker", 1, CLUSTER)
    unset = TrainingConfig(dataset="/d", run_dir="/r", steps=1)
    assert intra_op_threads(ps, unset, {}) == 1
    assert intra_op_threads(trainer, unset, {}) == 8, "a pod has its cores to itself"
    assert intra_op_threads(trainer, unset, {TRAINERS_ON_THIS_MACHINE: "3"}) == 2
    assert intra_op_threads(trainer, unset, {TRAINERS_ON_THIS_MACHINE: "16"}) == 1
    for given in (0, 3):
        assert intra_op_threads(ps, TrainingConfig(dataset="/d", run_dir="/r", steps=1, intra_op_threads=given),
                                {TRAINERS_ON_THIS_MACHINE: "2"}) == given
    with pytest.raises(TaskConfigError, match=f"{TRAINERS_ON_THIS_MACHINE}='two': expected a positive whole number"):
        intra_op_threads(trainer, unset, {TRAINERS_ON_THIS_MACHINE: "two"})

