"""The health question (``python -m airflow_tf.runtime.health``), asked as the Kubernetes probe
and the local supervisor ask it, of a real TensorFlow server: live, it answers at once; frozen
(SIGSTOP: the kernel still accepts its connections), it does not, and the question ends at its
deadline with exit status 1; continued, it answers again."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from airflow_tf.backends.kubernetes.manifests import health_probes
from airflow_tf.cluster import GroupSpec, TrainingConfig

pytestmark = pytest.mark.slow

SERVER = textwrap.dedent("""
    import sys, time
    import tensorflow as tf
    address = sys.argv[1]
    tf.distribute.Server(tf.train.ClusterSpec({"ps": [address]}), job_name="ps", task_index=0, start=True)
    print("serving", flush=True)
    while True:
        time.sleep(1)
    """)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(command: list[str]) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, time.monotonic() - started


def test_the_probe_answers_for_a_live_server_and_fails_at_its_deadline_for_a_frozen_one():
    port = free_port()
    group = GroupSpec.for_training("probed", TrainingConfig(dataset="/d", run_dir="/r", steps=1), port=port,
                                   image="x:1", health_timeout=2)
    probe = health_probes(group, "ps")["liveness_probe"]
    command = probe["exec"]["command"]
    server = subprocess.Popen([sys.executable, "-c", SERVER, f"127.0.0.1:{port}"], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    try:
        assert server.stdout is not None and server.stdout.readline() == "serving\n"
        code, out, _ = ask(command)
        answer = re.fullmatch(rf"127\.0\.0\.1:{port} answered in (\d+\.\d+) s\n", out)
        assert code == 0 and answer and float(answer[1]) < 1.0, out  # milliseconds when idle
        os.kill(server.pid, signal.SIGSTOP)
        code, out, took = ask(command)
        assert code == 1 and out.strip() == f"127.0.0.1:{port} no answer within 2 s", out
        assert took < probe["timeoutSeconds"], "the question ends before the kubelet gives up on the probe"
        os.kill(server.pid, signal.SIGCONT)
        code, out, _ = ask(command)
        assert code == 0, out
    finally:
        server.kill()
        server.wait()


def test_the_probe_keeps_the_peers_file_while_another_task_answers_and_removes_it_when_none_does(tmp_path):
    """A Kubernetes task's liveness probe also asks the group's other tasks (its TF_CONFIG); the
    readiness probe reads the file it keeps. Here the ps peer is a real server, nothing listens on
    worker 1's port (the question waits for it to its deadline) and the task itself is worker 0,
    whose TF_CONFIG is the Indexed Job's (no index: JOB_COMPLETION_INDEX has it) and names it by
    an address of its own, never asked."""
    port, closed = free_port(), free_port()
    group = GroupSpec.for_training("probed", TrainingConfig(dataset="/d", run_dir="/r", steps=1), port=port,
                                   image="x:1", health_timeout=2)
    command = health_probes(group, "worker", peers=True)["liveness_probe"]["exec"]["command"]
    answered = tmp_path / "peers-answered"
    command[command.index("--peers-answered") + 1] = str(answered)
    own = f"worker-0.probed:{port}"
    env = dict(os.environ, JOB_COMPLETION_INDEX="0", TF_CONFIG=json.dumps({
        "cluster": {"ps": [f"localhost:{port}"], "worker": [own, f"127.0.0.1:{closed}"]}, "task": {"type": "worker"}}))
    server = subprocess.Popen([sys.executable, "-c", SERVER, f"127.0.0.1:{port}"], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))

    def probe() -> tuple[int, str]:
        done = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=120, env=env)
        return done.returncode, done.stdout

    try:
        assert server.stdout is not None and server.stdout.readline() == "serving\n"
        code, out = probe()
        assert code == 0 and answered.exists(), out
        assert f"localhost:{port} answered in" in out and f"127.0.0.1:{closed} no answer within 2 s" in out, out
        assert out.count(f"127.0.0.1:{port} ") == 1 and own not in out, "the task itself is asked once, on loopback"
        os.kill(server.pid, signal.SIGSTOP)
        code, out = probe()
        assert code == 1 and not answered.exists(), out
        os.kill(server.pid, signal.SIGCONT)
        code, out = probe()
        assert code == 0 and answered.exists(), out
    finally:
        server.kill()
        server.wait()


def test_a_bad_tf_config_fails_the_peers_question_naming_it_without_a_traceback(monkeypatch, capsys, tmp_path):
    from airflow_tf.runtime import health

    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"ps": ["a:1"]}, "task": {"type": "boss"}}))
    with pytest.raises(SystemExit) as ended:
        health.main(["127.0.0.1:1", "--timeout", "1", "--peers-answered", str(tmp_path / "answered")])
    assert ended.value.code == 2
    error = capsys.readouterr().err
    assert "--peers-answered reads the group from TF_CONFIG" in error and "task type 'boss'" in error, error
    assert not (tmp_path / "answered").exists()
