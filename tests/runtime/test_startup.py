"""A process of ours loads TensorFlow without the packages Keras would import for utilities no
task, evaluation or export calls; a user's model can still import them. A task starts where no
temporary directory is writable."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest

from airflow_tf.backends.local.processes import free_ports


@pytest.mark.parametrize("keras, loaded", [(False, []), (True, ["keras"])])
def test_a_task_starts_tensorflow_without_kerass_optional_packages_and_a_model_can_still_import_them(
        keras, loaded):
    # Keras would import these at start-up for plotting, scikit-learn wrappers and DataFrame input,
    # seconds of CPU for every ps and worker start (a restarted group starts them all again).
    code = (f"import sys; from airflow_tf.runtime.startup import import_tensorflow; import_tensorflow(keras={keras}); "
            "print(sorted(m for m in ('keras', 'sklearn', 'matplotlib', 'pandas') if sys.modules.get(m))); "
            "import matplotlib.pyplot; print('importable')")
    assert _fresh_python(code)[:2] == [str(loaded), "importable"]


def test_a_task_that_only_serves_starts_tensorflows_server_without_its_python_api_which_still_loads_when_used():
    # A ps runs graphs built by the workers: TensorFlow's runtime and gRPC server, not the tf.* API
    # (most of import tensorflow). Imported later in the same process, the API is all there.
    code = ("import sys; from airflow_tf.runtime.startup import import_tensorflow_server; "
            "server_lib = import_tensorflow_server(); "
            "print(sorted(m for m in ('keras', 'tensorflow._api.v2', 'tensorflow.python.ops.math_ops') "
            "if m in sys.modules)); "
            "server = server_lib.Server(server_lib.ClusterSpec({'ps': ['127.0.0.1:0']}), job_name='ps', "
            "task_index=0, start=True); print(server.target.startswith('grpc://127.0.0.1:')); "
            "import tensorflow as tf; print(int(tf.constant(2) + 1), tf.distribute.Server is server_lib.Server)")
    assert _fresh_python(code)[:3] == ["[]", "True", "3 True"]


def test_tensorflow_loads_with_no_garbage_collection_and_the_collector_is_left_as_it_was():
    # What loading makes all stays: collections while it loads (left alone, hundreds, a few of them
    # full) walk it for nothing, an eighth of a fork server's start.
    code = ("import gc; from airflow_tf.runtime import startup; runs = []; "
            "gc.callbacks.append(lambda phase, info: phase == 'start' and runs.append(info['generation'])); "
            "startup.import_tensorflow_server(); print(runs, gc.isenabled()); runs.clear(); "
            "startup.import_tensorflow(); print(runs, gc.isenabled()); "
            "gc.disable(); startup.import_tensorflow(); print(gc.isenabled())")
    server, whole, still_off = _fresh_python(code)[:3]
    # At most one collection of the youngest generation: the one the collector, on again, starts at once.
    for line in (server, whole):
        runs, enabled = line.rsplit(" ", 1)
        assert json.loads(runs) in ([], [0]) and enabled == "True", line
    assert still_off == "False", "a process that turned the collector off keeps it off"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only /tmp in a mount namespace needs root")
def test_a_ps_starts_and_stops_where_no_temporary_directory_is_writable(tmp_path):
    # A task keeps its temporary files in a directory of its own; on a read-only root filesystem
    # (no writable /tmp, /var/tmp or working directory) it starts without one: a ps needs none.
    port, other = free_ports(2)
    tf_config = json.dumps({"cluster": {"ps": [f"127.0.0.1:{port}"], "worker": [f"127.0.0.1:{other}"]},
                            "task": {"type": "ps", "index": 0}})
    runtime = shlex.join([sys.executable, "-m", "airflow_tf.runtime", "--dataset", str(tmp_path / "data"),
                          "--run-dir", str(tmp_path / "run"), "--steps", "10"])
    # Read-only in place, not hidden: the checkout and its environment may live under /tmp.
    script = (" && ".join(f"mount --bind {d} {d} && mount -o remount,bind,ro {d}" for d in ("/tmp", "/var/tmp"))
              + f" && cd /tmp && exec env -u TMPDIR TF_CONFIG={shlex.quote(tf_config)} {runtime}")
    ps = subprocess.Popen(["unshare", "--mount", "sh", "-c", script], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _listening(port):
            assert ps.poll() is None and time.monotonic() < deadline, ps.communicate(timeout=10)[0][-3000:]
            time.sleep(0.2)
    finally:
        ps.send_signal(signal.SIGTERM)
        output = ps.communicate(timeout=60)[0]
    assert ps.returncode == -signal.SIGTERM, output[-3000:]
    assert "airflow-tf task exit role=ps index=0 status=stopped signal=SIGTERM" in output, output[-3000:]


def _fresh_python(code: str) -> list[str]:
    """The lines ``python -c code`` printed in a new interpreter of this environment, which must succeed."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\n")


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
