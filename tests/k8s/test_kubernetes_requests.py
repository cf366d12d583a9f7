"""Every pod requests CPU and memory without any option set (``default_requests``), so the scheduler
and Kueue count a group as what it takes: in the manifests ``airflow-tf render`` prints, in a prepare
part's Job, and on the real plane, where a ClusterQueue with quota for exactly one group admits one
of two groups launched with no resource option and holds the other.

The Kueue test asserts on Kueue's Workload objects, not on pods: a plane whose kubelet the tests
play and one with a real node give the same admissions (the image cannot be pulled, so a real node
never ends an admitted group and frees its quota)."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest
import yaml

from airflow_tf.backends import get_backend
from airflow_tf.backends.kubernetes.default_requests import PART_REQUESTS, ROLE_REQUESTS
from airflow_tf.backends.kubernetes.jobs import render_group
from airflow_tf.backends.kubernetes.parts import KubernetesPartOptions, part_job
from airflow_tf.cli import main
from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.cluster.memory import quantity_value

from .plane import wait_for
from .test_kubernetes import SETTLE_SECONDS
from .test_kubernetes_kueue import QUEUE, quota  # noqa: F401 - the ClusterQueue and LocalQueue fixture

IMAGE = "registry.example/tf:2.21"  # never pulled: on a real node an admitted group's pods wait, holding the quota


def render(capsys, *flags: str) -> dict[str, dict]:
    """The container of each role's Job ``airflow-tf render`` prints, by role."""
    assert main(["render", "--name", "demo", "--image", IMAGE, *flags]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    return {d["spec"]["template"]["spec"]["containers"][0]["name"]: d["spec"]["template"]["spec"]["containers"][0]
            for d in documents if d["kind"] == "Job"}


def test_render_without_options_requests_each_roles_measured_default(capsys):
    containers = render(capsys)
    assert sorted(containers) == ["ps", "worker"]
    for role, container in containers.items():
        assert container["resources"] == {"requests": ROLE_REQUESTS[role]}, role
    assert quantity_value(ROLE_REQUESTS["ps"]["memory"]) >= 430 * 2**20, "at least the peak RSS a ps measured"
    assert quantity_value(ROLE_REQUESTS["worker"]["cpu"]) >= 0.36, "a worker's mean use of a core"
    group = sum(quantity_value(ROLE_REQUESTS[role]["cpu"]) for role in ("ps", "worker", "worker"))
    assert group <= 1.5, "a group of a ps and two workers fits a 2-core node (the local Kubernetes)"


def test_render_cpu_and_memory_flags_set_one_roles_requests_and_the_rest_keep_the_default(capsys):
    containers = render(capsys, "--cpu", "worker=3", "--memory", "worker=6Gi", "--memory", "ps=2Gi")
    assert containers["worker"]["resources"] == {"requests": {"cpu": "3", "memory": "6Gi"}}
    assert containers["ps"]["resources"] == {"requests": {"cpu": ROLE_REQUESTS["ps"]["cpu"], "memory": "2Gi"}}
    command = containers["ps"]["command"]
    assert command[command.index("--ps-memory-limit") + 1] == "2Gi", "the ps's tables are checked against its memory"


def test_a_ps_memory_limit_is_the_ps_memory_request_and_a_limit_is_not_undercut(capsys):
    containers = render(capsys, "--ps-memory-limit", "3Gi", "--worker-gpus", "1")
    assert containers["ps"]["resources"]["requests"]["memory"] == "3Gi"
    assert containers["worker"]["resources"] == {"limits": {"nvidia.com/gpu": "1"}, "requests": ROLE_REQUESTS["worker"]}
    group = GroupSpec.for_training("demo", TrainingConfig(dataset="/data/x/1", run_dir="/runs/demo", steps=10), image=IMAGE,
                                   role_options={"worker": {"resources": {"limits": {"memory": "300Mi"}},
                                                            "kubernetes": {"pod_template": {"spec": {"containers": [
                                                                {"name": "base",
                                                                 "resources": {"requests": {"cpu": "250m"}}}]}}}}})
    worker = next(o for o in render_group(group, "ml") if o["metadata"]["name"] == "demo-worker")
    resources = worker["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {"memory": "300Mi"}, "requests": {"cpu": "250m"}}, \
        "Kubernetes requests the limit, and the template's request stands: no default added under either"


@pytest.mark.parametrize(("flags", "message"), [
    (["--cpu", "worker=lots"], "argument --cpu: 'worker=lots': 'lots' is not a positive Kubernetes quantity"),
    (["--memory", "ps=-1Gi"], "argument --memory: 'ps=-1Gi': '-1Gi' is not a positive Kubernetes quantity"),
    (["--memory", "ps=0"], "argument --memory: 'ps=0': '0' is not a positive Kubernetes quantity"),
    (["--cpu", "2"], "argument --cpu: '2': expected ROLE=QUANTITY with ROLE one of chief, ps, worker, evaluator"),
    (["--cpu", "master=1"], "argument --cpu: 'master=1': expected ROLE=QUANTITY"),
])
def test_a_bad_cpu_or_memory_value_is_refused_naming_the_flag(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_:
        main(["render", "--name", "demo", "--image", IMAGE, *flags])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == "" and message in err, err


def test_a_request_for_a_role_the_group_lacks_names_the_flags(capsys):
    assert main(["render", "--name", "demo", "--image", IMAGE, "--memory", "chief=1Gi"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--cpu/--memory: 'chief' is not a role of this group (ps, worker)" in err, err


def test_a_prepare_part_requests_the_parts_default_unless_its_options_say_otherwise():
    def resources(**options):
        job = part_job(KubernetesPartOptions(image=IMAGE, namespace="ml", **options), "ml", plan="/data/.parts-1",
                       index=0, dataset="clicks", token=".parts-1")
        return job["spec"]["template"]["spec"]["containers"][0]["resources"]

    assert resources() == {"requests": PART_REQUESTS}
    assert resources(resources={"limits": {"memory": "4Gi"}}) == {
        "limits": {"memory": "4Gi"}, "requests": {"cpu": PART_REQUESTS["cpu"]}}


# -- on the real plane, with Kueue -----------------------------------------------------------------------
def _workloads(kube) -> dict[str, dict]:
    """Kueue's Workload of each JobSet, by the JobSet's name."""
    from kubernetes import client

    items = client.CustomObjectsApi(kube.plane.api).list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", kube.ns, "workloads")["items"]
    return {ref["name"]: w for w in items for ref in w["metadata"].get("ownerReferences") or []
            if ref["kind"] == "JobSet"}


def _admitted(workload: dict) -> bool:
    return any(c["type"] == "Admitted" and c["status"] == "True"
               for c in (workload.get("status") or {}).get("conditions") or [])


def _requested(workload: dict, resource: str) -> Decimal:
    """What a Workload asks of its queue: each pod set's count times its pods' requests."""
    return sum((quantity_value(str(c["resources"]["requests"][resource])) * p["count"]
                for p in workload["spec"]["podSets"] for c in p["template"]["spec"]["containers"]), Decimal(0))


@pytest.mark.slow  # Kueue's and JobSet's builds (once) and their reconcile loops
def test_a_queue_with_quota_for_one_default_group_admits_one_of_two_not_both(kube, kueue, quota):
    one_group = {resource: quantity_value(ROLE_REQUESTS["ps"][resource]) + 2 * quantity_value(
        ROLE_REQUESTS["worker"][resource]) for resource in ("cpu", "memory")}
    quota(f"{one_group['cpu'] * 1000:.0f}m")  # CPUs for one group of 1 ps + 2 workers; memory for many
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=str(kube.kubeconfig), namespace=kube.ns,
                          workload="jobset", pod_defaults={"queue_name": QUEUE})
    training = TrainingConfig(dataset="/data/linear/1", run_dir="/runs/x", steps=100)
    for name in ("tf-a", "tf-b"):  # no resources, no pod template: the defaults alone
        backend.launch(GroupSpec.for_training(name, training, ps=1, workers=2, image=IMAGE))

    def one_admitted() -> dict[str, dict] | None:
        workloads = _workloads(kube)
        return workloads if len(workloads) == 2 and any(map(_admitted, workloads.values())) else None

    workloads = wait_for(one_admitted, 60, "Kueue to make both groups' Workloads and admit one")
    for workload in workloads.values():
        assert {r: _requested(workload, r) for r in ("cpu", "memory")} == one_group, \
            "Kueue counts each group as its default requests"
    time.sleep(SETTLE_SECONDS)
    workloads = _workloads(kube)
    admitted = sorted(name for name, w in workloads.items() if _admitted(w))
    assert len(admitted) == 1, f"quota for one group admits exactly one, not both: {admitted}"
    held, = set(workloads) - set(admitted)
    conditions = {c["type"]: c for c in workloads[held]["status"]["conditions"]}
    assert conditions["QuotaReserved"]["status"] == "False"
    assert "insufficient" in conditions["QuotaReserved"]["message"].lower(), conditions["QuotaReserved"]
