"""A Kubernetes group's logs on a real node (the package's plane, ``scripts/kube up DIR --nodes 1``, the
training image loaded): the chief's log followed through the API as it is written (``log_since``: timestamps and
``sinceSeconds``), every line once, in order, while the chief runs; and the teardown keeping every
pod's log in the run directory, bounded by ``[airflow_tf] kept_log_bytes``, before the pods go.

The package's plane has the real node (tests/k8s/conftest.py)."""

from __future__ import annotations

import os
import time

import pytest

from airflow_tf.backends import get_backend
from airflow_tf.backends.follow import LogFollower
from airflow_tf.cluster import GroupSpec, TrainingConfig, group_outcome
from airflow_tf.operators import TeardownTFClusterOperator

from .plane import REMOVAL_BOUND, wait_for
from .scripted import training_image
from .test_real_nodes import storage

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="a kubelet and containerd run as root")]

KEPT_LOG_BYTES = 3000


def test_the_chief_log_is_followed_live_and_every_pod_log_is_kept_bounded_before_teardown(
        plane, kube, linear_dataset, tmp_path, monkeypatch):
    dataset, runs, pod_defaults = storage(kube, linear_dataset, tmp_path)
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=str(kube.kubeconfig),
                          namespace=kube.ns, pod_defaults=pod_defaults)
    config = TrainingConfig(dataset=dataset, run_dir="/runs/linear", steps=3000, batch_size=32, learning_rate=0.1,
                            checkpoint_every_secs=1.0, log_every_secs=0.25)
    ref = backend.launch(GroupSpec.for_training("linear", config, ps=1, workers=1, image=training_image()))
    follower = LogFollower(backend, ref, "chief")
    followed: list[str] = []
    while_running: list[str] = []
    deadline = time.monotonic() + 900
    while True:
        status = backend.status(ref)
        outcome = group_outcome(status)
        name, lines = follower.read(status, drain=outcome.done)
        followed += lines
        if not outcome.done:
            while_running += lines
        if outcome.done:
            break
        assert time.monotonic() < deadline, "the group did not finish in 900 s"
        time.sleep(1.0)
    assert outcome.succeeded, outcome
    assert name == f"{ref.name}-worker-0"
    # Read in many pieces while the chief ran, the lines are the chief's log, each once, in order.
    assert any("airflow-tf progress global_step=" in line and "target_step=3000" in line and
               "global_step=3000 " not in line for line in while_running), while_running[-20:]
    assert followed == backend.logs(ref, "worker", 0).splitlines()

    monkeypatch.setenv("AIRFLOW_TF_KEPT_LOG_BYTES", str(KEPT_LOG_BYTES))
    ps_last = backend.logs(ref, "ps", 0).splitlines()[-1]  # the ps runs until the teardown deletes it
    teardown = TeardownTFClusterOperator(task_id="teardown", group={"group": ref.to_dict(),
                                                                    "run_dir": str(runs / "linear")})
    assert teardown.execute({})
    kept = runs / "linear" / "logs" / f"kubernetes-{ref.uid}"
    assert {p.name for p in kept.iterdir()} == {f"{ref.name}-worker-0.log", f"{ref.name}-ps-0.log"}
    worker = (kept / f"{ref.name}-worker-0.log").read_text()
    assert len(worker.encode()) <= KEPT_LOG_BYTES and worker.startswith("[airflow-tf: the first ")
    assert worker.splitlines()[-1] == followed[-1], "the end of the chief's log is kept"
    ps = (kept / f"{ref.name}-ps-0.log").read_text()
    assert len(ps.encode()) <= KEPT_LOG_BYTES and ps_last in ps
    wait_for(lambda: kube.gone("pods"), REMOVAL_BOUND, "the group's pods to be gone")
