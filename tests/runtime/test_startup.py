"""A process of ours loads TensorFlow without the packages Keras would import for utilities no
task, evaluation or export calls; a user's model can still import them."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("keras, loaded", [(False, []), (True, ["keras"])])
def test_a_task_starts_tensorflow_without_kerass_optional_packages_and_a_model_can_still_import_them(
        keras, loaded):
    # Keras would import these at start-up for plotting, scikit-learn wrappers and DataFrame input,
    # seconds of CPU for every ps and worker start (a restarted group starts them all again).
    code = (f"import sys; from airflow_tf.runtime.startup import import_tensorflow; import_tensorflow(keras={keras}); "
            "print(sorted(m for m in ('keras', 'sklearn', 'matplotlib', 'pandas') if sys.modules.get(m))); "
            "import matplotlib.pyplot; print('importable')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == [str(loaded), "importable"]


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
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["[]", "True", "3 True"]
