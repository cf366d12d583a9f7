"""The Kubernetes backend's groups training for real on the package's real node (conftest.py:
``scripts/kube up DIR --nodes 1`` starts the plane with a kubelet v1.37 and containerd v2.4, runc
and CNI bridge networking, the built training image loaded into it, and CoreDNS as the cluster
DNS; its fixture checks that ``down`` leaves nothing on the machine). The group's pods run the
runtime from that image in a namespace enforcing Pod Security Admission ``restricted`` and reach
each other by the headless Service's names."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from airflow_tf.backends import get_backend
from airflow_tf.backends.kubernetes.labels import ROLE_LABEL
from airflow_tf.cluster import GroupSpec, TrainingConfig, group_outcome

from .plane import KUBE_SCRIPT, REMOVAL_BOUND, wait_for
from .scripted import kubectl, training_image
from .test_kubernetes import outcome_when_done

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="a kubelet and containerd run as root")]

POD_USER = 1000  # the training image's USER, and the backend's run_as_user


def readable(root: Path) -> None:
    """Open the dataset to the pods' user (pytest's folders are root's alone)."""
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))


def storage(kube, linear_dataset: str, tmp_path: Path) -> tuple[str, Path, dict]:
    """The dataset and a run folder as claims on host folders; returns the dataset's path in the pods,
    the run folder on the host and the backend's pod_defaults mounting both."""
    data = Path(linear_dataset).parent
    readable(data)
    runs = tmp_path / "runs"
    runs.mkdir()
    os.chown(runs, POD_USER, POD_USER)
    kube.volume_claim("tf-data", data)
    kube.volume_claim("tf-runs", runs)
    volumes = [{"claim": "tf-data", "mount_path": "/data"}, {"claim": "tf-runs", "mount_path": "/runs"}]
    return f"/data/{Path(linear_dataset).name}", runs, {"volumes": volumes}


def test_a_group_trains_from_the_training_image_on_a_real_node(plane, kube, linear_dataset, tmp_path):
    dataset, runs, pod_defaults = storage(kube, linear_dataset, tmp_path)
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=str(kube.kubeconfig),
                          namespace=kube.ns, pod_defaults=pod_defaults)
    config = TrainingConfig(dataset=dataset, run_dir="/runs/linear", steps=200, batch_size=32, learning_rate=0.1,
                            checkpoint_every_secs=1.0, log_every_secs=0.5)
    ref = backend.launch(GroupSpec.for_training("linear", config, ps=1, workers=1, image=training_image()))
    outcome = outcome_when_done(backend, ref, timeout=600)
    pods = {p["metadata"]["labels"][ROLE_LABEL]: p for p in kube.objects("pods")}
    assert outcome.succeeded, (outcome, {role: p.get("status") for role, p in pods.items()})
    progress = json.loads((runs / "linear" / "progress.json").read_text())
    assert progress["done"] and progress["global_step"] >= 200, progress
    written = [p for p in (runs / "linear").rglob("*") if p.is_file()]
    assert written and {p.stat().st_uid for p in written} == {POD_USER}, "the tasks wrote as uid 1000"

    ps = pods["ps"]
    assert ps["spec"]["containers"][0]["image"] == training_image()
    assert ps["spec"]["nodeName"] == "node-1" or not plane.private
    # The ps still runs (the teardown stops it): what the container is, seen through the API server.
    assert kubectl(plane.admin_kubeconfig, "-n", kube.ns, "exec", ps["metadata"]["name"], "--", "id", "-u").strip() == "1000"
    log = kubectl(plane.admin_kubeconfig, "-n", kube.ns, "logs", ps["metadata"]["name"])
    assert log == backend.logs(ref, "ps", 0) and log.strip(), "kubectl logs reads the container's log via the kubelet"
    # The cluster DNS answers the group's names from inside a pod: the ps's own, as TF_CONFIG gives it.
    name = f"{ps['spec']['hostname']}.{ps['spec']['subdomain']}.{kube.ns}.svc"
    resolved = kubectl(plane.admin_kubeconfig, "-n", kube.ns, "exec", ps["metadata"]["name"], "--", "python", "-c",
                       f"import socket; print(socket.gethostbyname({name!r}))").strip()
    assert resolved == ps["status"]["podIP"]
    assert backend.teardown(ref)
    wait_for(lambda: kube.gone("pods"), REMOVAL_BOUND, "the group's pods to be gone")


def test_a_ps_short_of_memory_is_oomkilled_and_the_status_names_the_limit(plane, kube, linear_dataset,
                                                                           tmp_path):
    dataset, _, pod_defaults = storage(kube, linear_dataset, tmp_path)
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=str(kube.kubeconfig),
                          namespace=kube.ns, pod_defaults=pod_defaults)
    config = TrainingConfig(dataset=dataset, run_dir="/runs/small", steps=200, batch_size=32)
    spec = GroupSpec.for_training("small", config, ps=1, workers=1, image=training_image(), role_options={
        "ps": {"resources": {"requests": {"memory": "40Mi"}, "limits": {"memory": "40Mi"}}}})
    ref = backend.launch(spec)
    # The ps restarts on failure (its Job's policy): each time, its status says why it ended.
    ps = wait_for(lambda: next((t for t in backend.status(ref).role_tasks("ps") if "OOMKilled" in (t.reason or "")),
                               None), 300, "the ps to be OOMKilled")
    assert ps.reason.startswith("OOMKilled: pod small-ps-0-") and "limit 40Mi" in ps.reason, ps.reason
    assert ps.reason.endswith("raise roles.ps.resources.limits.memory") and ps.exit_code == 137, ps
    pod, = kube.objects("pods", f"{ROLE_LABEL}=ps")
    terminated = [s.get("lastState", {}).get("terminated") or s["state"].get("terminated")
                  for s in pod["status"]["containerStatuses"]]
    assert terminated[0]["reason"] == "OOMKilled", "the kubelet's own verdict"
    assert not group_outcome(backend.status(ref), ref.success_policy).succeeded
    backend.teardown(ref)


def test_nodes_must_be_a_count_from_one(tmp_path):
    for bad in ("0", "-1", "51"):
        result = subprocess.run([str(KUBE_SCRIPT), "up", str(tmp_path / bad), "--nodes", bad], capture_output=True,
                                text=True)
        assert result.returncode != 0 and f"--nodes {bad}: give a number of nodes from 1 to 50" in result.stderr
        assert not (tmp_path / bad).exists()
