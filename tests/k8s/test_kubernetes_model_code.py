"""A model module kept next to a DAG reaches a Kubernetes group's pods through the run
directory on shared storage, without rebuilding the training image: the launch snapshots it,
every pod is told where the snapshot is, and the runtime imports the model from there first.

The pods are the real Job controller's (the control plane of test_kubernetes.py); the runtime's
import runs for real in a fresh interpreter that has no path to the DAG folder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.cluster.model_code import snapshot_model_code

from .plane import wait_for
from .scripted import ABSENT_IMAGE  # what the pods run is not under test here: they wait for it
from .test_kubernetes import backend, kubeconfig  # noqa: F401  (fixtures)

MODEL = textwrap.dedent('''
    import keras

    def build():
        return keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
''')


@pytest.fixture
def snapshot(tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "my_models.py").write_text(MODEL)
    run_dir = tmp_path / "storage" / "runs" / "sales"
    code = snapshot_model_code("my_models:build", str(run_dir), [str(dags)])
    assert code is not None, "a module next to the DAG is not installed: it must be snapshotted"
    return run_dir, code


def test_every_pod_of_the_group_is_pointed_at_the_snapshot_on_shared_storage(kube, backend, snapshot):
    run_dir, code = snapshot
    assert os.path.commonpath([code.path, run_dir]) == str(run_dir), "the snapshot lives in the run directory"
    training = TrainingConfig(dataset="/data/sales/1", run_dir=str(run_dir), steps=100,
                              model="my_models:build", code_dir=code.path)
    spec = GroupSpec.for_training("tf-sales", training, ps=1, workers=2, image=ABSENT_IMAGE)
    backend.launch(spec)

    pods = wait_for(lambda: len(p := kube.objects("pods")) == 3 and p, 30, "the Job controller's three pods")
    for pod in pods:
        container = pod["spec"]["containers"][0]
        argv = [*container.get("command", []), *container.get("args", [])]
        assert argv[argv.index("--code-dir") + 1] == code.path, pod["metadata"]["name"]
        assert argv[argv.index("--model") + 1] == "my_models:build"


@pytest.mark.slow
def test_the_runtime_imports_the_model_from_the_snapshot_without_any_path_to_the_dag(snapshot, tmp_path):
    _, code = snapshot
    probe = ("import inspect, sys\n"
             "from airflow_tf.runtime.models import model_function\n"
             f"build = model_function('my_models:build', {code.path!r})\n"
             "print(inspect.getfile(build)); print(build().count_params())\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    where, params = result.stdout.split()[-2:]
    assert where.startswith(code.path), f"imported from {where}, not from the snapshot"
    assert params == "2", "the seed's Dense(1) on one input: a weight and a bias"


def test_the_launch_returns_the_hash_of_the_code_it_snapshotted_and_none_for_a_built_in_model(
        kube, kubeconfig, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from airflow.sdk import DAG

    from airflow_tf.cluster.model_code import code_hash
    from airflow_tf.operators import LaunchTFClusterOperator

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "my_models.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(dags))  # the DAG folder, where Airflow finds the DAG's own modules
    monkeypatch.setenv("AIRFLOW_TF_STORAGE", str(tmp_path / "storage"))
    options = {"kubernetes_conn_id": None, "config_file": kubeconfig, "namespace": kube.ns}
    with DAG("sales", schedule=None):
        own = LaunchTFClusterOperator(task_id="own", dataset="/data/sales/1", model="my_models:build", steps=10,
                                      backend="kubernetes", backend_options=options, image=ABSENT_IMAGE)
        builtin = LaunchTFClusterOperator(task_id="builtin", dataset="/data/sales/1", steps=10, backend="kubernetes",
                                          backend_options=options, image=ABSENT_IMAGE)

    def context(task_id):
        return {"ti": SimpleNamespace(dag_id="sales", task_id=task_id, run_id="manual__1", map_index=-1, try_number=1)}

    result = own.execute(context("own"))
    code_dir = result["training"]["code_dir"]
    assert code_dir.startswith(result["run_dir"]), "the snapshot lives in the run directory"
    assert result["code_hash"] == code_hash(code_dir), "the XCom names the code every task imports"
    result = builtin.execute(context("builtin"))
    assert result["code_hash"] is None and result["training"]["code_dir"] is None
