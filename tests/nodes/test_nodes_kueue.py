"""Kueue preemption with real training: the package's plane of real nodes (``nodes_plane``:
``scripts/kube up --nodes 3 --kueue``, pods from the training image in a namespace enforcing Pod
Security ``restricted``) with Kueue and JobSet. A group of a higher WorkloadPriorityClass
preempts a training one; the lower group is suspended whole and, once readmitted, resumes from
its newest checkpoint to its final step. The test's queue objects are its own, removed after it:
Kueue admits only the Jobs and JobSets that name its LocalQueue, so the other tests' groups on the
plane (which name none) run beside it unqueued."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_tf.backends import get_backend
from airflow_tf.backends.wait import wait_for_group
from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.data import prepare_dataset
from airflow_tf.data.samples import write_linear_regression_csv
from airflow_tf.demo import DEMO_NAMESPACE, kubernetes_env

from .host import plane_env
from k8s.plane import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="a kubelet and containerd run as root")]

QUEUE = "training"
# Half a CPU per task: a group (1 ps + 2 workers) is 1.5 CPUs, the ClusterQueue's whole quota.
TASK = {"requests": {"cpu": "500m", "memory": "1Gi"}}


@contextlib.contextmanager
def _kueue_objects(custom) -> Iterator[dict[str, str]]:
    """A flavor, a ClusterQueue of 1.5 CPUs that preempts lower priorities, its LocalQueue, and
    WorkloadPriorityClasses low and high; deleted afterwards, each gone before the next test."""
    group, version = "kueue.x-k8s.io", "v1beta2"
    made: list[tuple[str, str, str | None]] = []

    def make(plural: str, body: dict, namespace: str | None = None) -> None:
        body = {"apiVersion": f"{group}/{version}", **body}
        if namespace:
            custom.create_namespaced_custom_object(group, version, namespace, plural, body)
        else:
            custom.create_cluster_custom_object(group, version, plural, body)
        made.append((plural, body["metadata"]["name"], namespace))

    def gone(plural: str, name: str, namespace: str | None) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            if namespace:
                custom.get_namespaced_custom_object(group, version, namespace, plural, name)
            else:
                custom.get_cluster_custom_object(group, version, plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    try:
        make("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": "node"}})
        make("clusterqueues", {"kind": "ClusterQueue", "metadata": {"name": "training"}, "spec": {
            "namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": "node", "resources": [
                {"name": "cpu", "nominalQuota": "1500m"}, {"name": "memory", "nominalQuota": "100Gi"}]}]}]}})
        make("localqueues", {"kind": "LocalQueue", "metadata": {"name": QUEUE}, "spec": {"clusterQueue": "training"}},
             DEMO_NAMESPACE)
        for name, value in (("low", 100), ("high", 1000)):
            make("workloadpriorityclasses", {"kind": "WorkloadPriorityClass", "metadata": {"name": name},
                                             "value": value})

        def active() -> bool:
            queue = custom.get_cluster_custom_object(group, version, "clusterqueues", "training")
            return any(c["type"] == "Active" and c["status"] == "True"
                       for c in (queue.get("status") or {}).get("conditions") or [])

        wait_for(active, 60, "the ClusterQueue to be active")
        yield {"low": "low", "high": "high"}
    finally:
        # The queue before its ClusterQueue, the ClusterQueue before its flavor (Kueue's finalizers
        # hold each while something still uses it).
        for plural, name, namespace in reversed(made):
            if namespace:
                custom.delete_namespaced_custom_object(group, version, namespace, plural, name)
            else:
                custom.delete_cluster_custom_object(group, version, plural, name)
            wait_for(lambda p=plural, n=name, ns=namespace: gone(p, n, ns), 120, f"{plural}/{name} deleted",
                     interval=1)


def _checkpoint_step(run_dir: Path) -> int:
    try:
        found = re.search(r'^model_checkpoint_path: "model\.ckpt-(\d+)"', (run_dir / "checkpoint").read_text(), re.M)
    except OSError:
        return 0
    return int(found.group(1)) if found else 0


# The package's plane may start in it (importing the training image: minutes under load), then two
# groups trained one after the other, with the resume.
@pytest.mark.timeout(2400)
def test_a_preempted_group_resumes_from_its_checkpoint_to_its_final_step(nodes_plane):
    from kubernetes import client, config

    directory, storage = nodes_plane
    # Its input and dataset in a folder of their own (the demo DAG's runs prepare linear_regression too);
    # its runs where the pods may make folders: storage/runs, below the group-writable storage root.
    files = storage / "kueue"
    settings = plane_env(directory)
    kubernetes_env(directory)  # the namespace and the claim of the storage folder
    api = config.new_client_from_config(config_file=settings["KUBECONFIG"])
    write_linear_regression_csv(files / "incoming" / "seed.csv", rows=5000, seed=0)
    dataset = prepare_dataset(files / "incoming" / "seed.csv", files / "datasets", "linear_regression",
                              label="y", eval_fraction=0.2, shards=2)["dataset_uri"]
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=settings["KUBECONFIG"],
                          namespace=DEMO_NAMESPACE, workload="jobset", image=settings["AIRFLOW_TF_KUBE_IMAGE"],
                          poll_interval=2.0, pod_defaults={"volumes": [
                              {"claim": settings["AIRFLOW_TF_KUBE_STORAGE_VOLUME"], "mount_path": str(storage)}]})

    def spec(name: str, priority: str, steps: int) -> GroupSpec:
        training = TrainingConfig(dataset=dataset, run_dir=str(storage / "runs" / name), model="linear_regression",
                                  steps=steps, batch_size=64, learning_rate=0.01, checkpoint_every_secs=2)
        kube = {"queue_name": QUEUE, "workload_priority_class": priority}
        return GroupSpec.for_training(name, training, ps=1, workers=2, role_options={
            role: {"resources": TASK, "kubernetes": kube} for role in ("ps", "worker")})

    with _kueue_objects(client.CustomObjectsApi(api)) as priorities, contextlib.ExitStack() as groups:
        # Preempted with its newest checkpoint between steps 1,000 and 5,100 in the runs seen
        # (how far it gets while Kueue evicts it depends on the machine's load); every step past
        # the preemption is CPU the other tests wait for.
        low_steps = 8000
        low_spec = spec("tf-low", priorities["low"], low_steps)
        low = backend.launch(low_spec)
        groups.callback(backend.teardown, low)
        low_run = Path(low_spec.training.run_dir)
        wait_for(lambda: _checkpoint_step(low_run) > 500, 240, "a checkpoint of tf-low past step 500")

        high = backend.launch(spec("tf-high", priorities["high"], 500))
        groups.callback(backend.teardown, high)

        def preempted():
            status = backend.status(low)
            return status if any("Preempted" in (t.reason or "") for t in status.tasks) else None

        # Its pods stop (the workers within their 30 s grace); then its status says why it waits.
        wait_for(preempted, 180, "tf-low's status to say Kueue preempted it", interval=1.0)
        at_preemption = _checkpoint_step(low_run)
        assert at_preemption < low_steps - 1000, f"tf-low reached step {at_preemption} before its preemption: raise low_steps"
        print(f"tf-low preempted with its newest checkpoint at step {at_preemption}")
        outcome, _ = wait_for_group(backend, high, timeout=300, interval=2.0)
        assert outcome.succeeded, outcome.reason
        backend.teardown(high)

        # Readmitted: its pods come back and the chief restores the newest checkpoint.
        outcome, status = wait_for_group(backend, low, timeout=600, interval=2.0)
        assert outcome.succeeded, outcome.reason
        chief_log = backend.logs(low, "worker", 0)
        resumed = [int(step) for step in re.findall(r"session ready global_step=(\d+)", chief_log)]
        assert resumed and resumed[0] >= at_preemption > 500, chief_log[-3000:]
        assert status.progress["global_step"] >= low_steps, status.progress
        assert _checkpoint_step(low_run) >= low_steps
