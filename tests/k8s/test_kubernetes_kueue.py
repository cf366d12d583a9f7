"""Gang admission on the real plane: a group launched as ONE JobSet (``workload="jobset"``) under
the real JobSet v0.11.1 controller and Kueue v0.17.0, both built from their Go modules and started
by ``scripts/kube kueue`` on the session's plane, with their webhooks not registered. The pods
run on the real node from the training image, a loop doing what the test tells it
(tests/k8s/scripted.py): a JobSet Kueue holds is suspended and has no Job running, so no pod at all.

Shown here: two groups under a ClusterQueue quota for one run one after the other, never half each,
and the waiting group's status says it waits for the queue and Kueue's reason, and so does the
sensor's failure when its timeout ends the wait (polled and deferred); the two-Job form
with a queue is refused naming JobSet before anything is created; a group of a higher Kueue
WorkloadPriorityClass preempts a running lower one whole; a JobSet group's life cycle (launch,
re-attach, find, status, watch, logs, success, teardown) and its evaluation Job, through the
backend's service account, bound only to ``role.yaml``."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest
from airflow.providers.common.compat.sdk import AirflowSensorTimeout

from airflow_tf.backends import BackendError, get_backend
from airflow_tf.backends.kubernetes.labels import GROUP_LABEL
from airflow_tf.cluster import GroupSpec, Phase, TrainingConfig, group_outcome
from airflow_tf.sensors import WorkerCompletionSensor
from airflow_tf.triggers import WorkerCompletionTrigger

from .plane import REMOVAL_BOUND, wait_for
from .scripted import training_image
from .test_kubernetes import SETTLE_SECONDS, _granted, collect

pytestmark = pytest.mark.slow  # Kueue's and JobSet's builds (once) and their reconcile loops

QUEUE = "team-a"
FLAVOR = "airflow-tf-test"
TASK_CPU, GROUP_CPU = "100m", "300m"
"""What each task requests, and a quota for one group: what the real node (2 CPUs) has room for."""


def group(name: str, queue: str | None = QUEUE, priority: str | None = None) -> GroupSpec:
    """1 ps + 2 workers of :data:`TASK_CPU` each: a third of a quota of :data:`GROUP_CPU`."""
    training = TrainingConfig(dataset="/data/mnist/1", run_dir=f"/runs/{name}", steps=200)
    cpu = {"resources": {"requests": {"cpu": TASK_CPU, "memory": "64Mi"}}}
    options = {"ps": dict(cpu), "worker": dict(cpu)}
    settings = {**({"queue_name": queue} if queue else {}), **({"workload_priority_class": priority} if priority else {})}
    if settings:
        options = {role: {**o, "kubernetes": settings} for role, o in options.items()}
    return GroupSpec.for_training(name, training, ps=1, workers=2, image=training_image(),
                                  role_options=options)


@pytest.fixture
def backend(kube, kueue):
    return get_backend("kubernetes", kubernetes_conn_id=None, config_file=str(kube.kubeconfig), namespace=kube.ns,
                       workload="jobset")


@pytest.fixture
def kube_backend_fast(kube, kueue):
    """The backend polling a one-off Job every 50 ms."""
    return get_backend("kubernetes", kubernetes_conn_id=None, config_file=str(kube.kubeconfig), namespace=kube.ns,
                       workload="jobset", poll_interval=0.05)


@pytest.fixture
def quota(kube, kueue):
    """A ClusterQueue for this test's namespace only, and its LocalQueue ``team-a``; ``quota(cpu)``
    sets its CPUs (a quantity)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom = client.CustomObjectsApi(kube.plane.api)
    made = []

    def make(cpu: str, preemption: bool = False) -> None:
        try:
            custom.create_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "resourceflavors", {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}})
        except ApiException as e:
            if e.status != 409:
                raise
        custom.create_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": kube.ns},
            "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": kube.ns}},
                     "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                         "name": FLAVOR, "resources": [{"name": "cpu", "nominalQuota": cpu},
                                                       {"name": "memory", "nominalQuota": "100Gi"}]}]}],
                     **({"preemption": {"withinClusterQueue": "LowerPriority"}} if preemption else {})}})
        made.append(kube.ns)
        custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", kube.ns, "localqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": QUEUE},
            "spec": {"clusterQueue": kube.ns}})

        def active() -> bool:
            queue = custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", kube.ns)
            return any(c["type"] == "Active" and c["status"] == "True"
                       for c in (queue.get("status") or {}).get("conditions") or [])

        wait_for(active, 30, f"ClusterQueue {kube.ns} to be active")

    yield make
    for name in made:
        try:
            custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", name)
        except ApiException as e:
            if e.status != 404:
                raise


async def _all(events):
    return [event async for event in events]


def jobset(kube, name: str) -> dict | None:
    from kubernetes import client

    items = client.CustomObjectsApi(kube.plane.api).list_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", kube.ns, "jobsets")["items"]
    return next((j for j in items if j["metadata"]["name"] == name), None)


def pods_of(kube, name: str) -> list[str]:
    return [p["metadata"]["name"] for p in kube.objects("pods", f"{GROUP_LABEL}={name}")
            if not p["metadata"].get("deletionTimestamp")]


# -- gang admission --------------------------------------------------------------------------------------
def test_two_groups_under_a_quota_for_one_run_one_after_the_other_never_half_each(kube, scripted, quota, backend,
                                                                                  capsys):
    quota(GROUP_CPU)
    first = backend.launch(group("tf-a"))
    ps = scripted.pod("tf-a-ps-0", 0)  # admitted whole: its JobSet resumed, its ps pod made and placed
    second = backend.launch(group("tf-b"))

    # The second waits whole, and says so with Kueue's reason.
    def waiting():
        status = backend.status(second)
        return status if status.tasks and all("insufficient" in (t.reason or "") for t in status.tasks) else None

    status = wait_for(waiting, 30, "tf-b's status to say why Kueue holds it")
    assert sorted((t.role, t.index, t.phase) for t in status.tasks) == [
        ("ps", 0, Phase.PENDING), ("worker", 0, Phase.PENDING), ("worker", 1, Phase.PENDING)]
    reason = status.tasks[0].reason
    assert reason.startswith(f"JobSet tf-b is suspended: waiting for the queue {QUEUE} to admit the whole group (")
    assert "cpu" in reason, reason  # Kueue's own words: not enough CPU quota left in the ClusterQueue
    assert not group_outcome(status, second.success_policy).done
    # The sensor's task log says so.
    capsys.readouterr()
    assert WorkerCompletionSensor(task_id="wait", group=second.to_dict()).poke({}) is False
    assert f"group tf-b: workers done 0/2; no training progress yet; waiting: {reason[:60]}" in capsys.readouterr().out
    # A wait that never ends fails at its bound with Kueue's reason, polled and deferred alike.
    bound = f"did not finish within the sensor's timeout (1 s): workers done 0/2; no training progress yet; waiting: "
    with pytest.raises(AirflowSensorTimeout, match=re.escape(bound + reason[:60])):
        WorkerCompletionSensor(task_id="wait", group=second.to_dict(), timeout=1, poke_interval=0.5).execute({})
    trigger = WorkerCompletionTrigger(group=second.to_dict(), deadline=time.time() + 1,
                                      deadline_label="the sensor's timeout (1 s)")
    events = asyncio.run(asyncio.wait_for(_all(trigger.run()), 60))
    assert [e.payload["status"] for e in events] == ["timeout"]
    assert bound + reason[:60] in events[0].payload["reason"]

    # The first runs on: its ps ready, its workers start (startupPolicy InOrder) while the second
    # still has no pod at all, not even its ps.
    scripted.running(ps)
    for index in (0, 1):
        scripted.running(scripted.pod("tf-a-worker-0", index))
    time.sleep(SETTLE_SECONDS)
    assert jobset(kube, "tf-b")["spec"]["suspend"] is True
    assert pods_of(kube, "tf-b") == []
    assert all(t.phase is Phase.RUNNING for t in backend.status(first).tasks)

    # Torn down, the first frees the quota: the second is admitted whole and gets its pods.
    assert "jobset/tf-a" in backend.teardown(first)
    scripted.pod("tf-b-ps-0", 0, timeout=60)
    assert jobset(kube, "tf-b")["spec"]["suspend"] is False
    wait_for(lambda: not pods_of(kube, "tf-a"), 30, "tf-a's pods to be gone")
    status = backend.status(second)
    assert not any("queue" in (t.reason or "") for t in status.tasks), status

    # Every request the backend made is one role.yaml grants, the Workload read among them.
    used = {(c.api_group, c.resource, c.verb) for c in kube.calls()}
    assert used <= _granted()
    assert {("jobset.x-k8s.io", "jobsets", "create"), ("jobset.x-k8s.io", "jobsets", "delete"),
            ("kueue.x-k8s.io", "workloads", "list")} <= used


def test_a_queue_with_the_two_job_form_is_refused_naming_jobset_before_anything_is_made(kube, quota):
    quota(GROUP_CPU)
    jobs = get_backend("kubernetes", kubernetes_conn_id=None, config_file=str(kube.kubeconfig), namespace=kube.ns)
    with pytest.raises(BackendError, match=r"queue_name: 'team-a' needs workload='jobset': with workload='jobs' "
                                           r"every role is a Job of its own.*backend_options=\{'workload': 'jobset'\}"):
        jobs.launch(group("tf-a"))
    assert kube.objects("jobs") == [] and kube.objects("services") == []
    assert not [c for c in kube.calls() if c.verb == "create"]


@pytest.fixture
def priorities(kube, kueue):
    """Kueue WorkloadPriorityClasses ``<namespace>-low`` (100) and ``<namespace>-high`` (1000)."""
    from kubernetes import client

    custom = client.CustomObjectsApi(kube.plane.api)
    names = {"low": f"{kube.ns}-low", "high": f"{kube.ns}-high"}
    for level, value in (("low", 100), ("high", 1000)):
        custom.create_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
            "metadata": {"name": names[level]}, "value": value})
    yield names
    for name in names.values():
        custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", name)


def test_a_higher_priority_group_preempts_a_running_lower_one_whole(kube, scripted, quota, priorities, backend):
    """The lower group is suspended whole, its ps too, and says it was preempted; it waits for the
    queue again. (That, readmitted, it resumes from its checkpoint: test_node_kueue.py, on a node.)"""
    quota(GROUP_CPU, preemption=True)
    low = backend.launch(group("tf-low", priority=priorities["low"]))
    ps = scripted.pod("tf-low-ps-0", 0)
    scripted.running(ps)
    for index in (0, 1):
        scripted.running(scripted.pod("tf-low-worker-0", index))
    wait_for(lambda: all(t.phase is Phase.RUNNING for t in backend.status(low).tasks), 30, "tf-low to run")

    high = backend.launch(group("tf-high", priority=priorities["high"]))
    scripted.pod("tf-high-ps-0", 0, timeout=60)  # admitted in the lower group's place
    assert jobset(kube, "tf-low")["spec"]["suspend"] is True
    wait_for(lambda: not pods_of(kube, "tf-low"), 30, "every pod of tf-low, its ps too, to be gone")

    def preempted():
        status = backend.status(low)
        return status if status.tasks and all("Preempted" in (t.reason or "") for t in status.tasks) else None

    status = wait_for(preempted, 30, "tf-low's status to say Kueue preempted it")
    assert status.tasks[0].reason.startswith(
        f"JobSet tf-low is suspended: waiting for the queue {QUEUE} to admit the whole group (evicted by Kueue")
    assert not group_outcome(status, low.success_policy).done, "a preempted group waits; it has not failed"
    assert not any("queue" in (t.reason or "") for t in backend.status(high).tasks)


# -- a JobSet group's life cycle through the backend ------------------------------------------------------
def test_a_jobset_group_runs_to_success_through_the_backend(kube, scripted, backend):
    spec = group("tf-c", queue=None)
    scripted.unready.add("ps")  # Ready when the test says: until then, the workers' Job waits
    ref = backend.launch(spec)
    again = backend.launch(spec)  # a retried launch re-attaches
    assert (again.name, again.uid) == (ref.name, ref.uid) and ref.uid == jobset(kube, "tf-c")["metadata"]["uid"]
    assert len([c for c in kube.calls("create", "jobsets")]) == 1
    found = backend.find("tf-c")
    assert found is not None and found.uid == ref.uid and found.options["workload"] == "jobset"
    assert found.options["task_template"]["spec"]["containers"][0]["name"] == "worker"

    # startupPolicy InOrder: the workers' Job comes once the ps is ready.
    ps = scripted.pod("tf-c-ps-0", 0)
    status = backend.status(ref)
    workers = [t for t in status.tasks if t.role == "worker"]
    assert [t.name for t in workers] == ["tf-c-worker-0-0", "tf-c-worker-0-1"]
    assert all(t.phase is Phase.PENDING and "startupPolicy InOrder" in t.reason for t in workers)
    assert kube.objects("jobs", f"{GROUP_LABEL}=tf-c,airflow-tf/role=worker") == []
    scripted.ready(ps)
    names = [scripted.pod("tf-c-worker-0", index) for index in (0, 1)]
    for name in names:
        scripted.running(name)
    scripted.say(names[0], "step 100/200 loss 0.5\n")
    wait_for(lambda: backend.logs(ref, "worker", 0) == "step 100/200 loss 0.5\n", 10, "worker 0's log")
    running = wait_for(lambda: (s := backend.status(ref)) and all(t.phase is Phase.RUNNING for t in s.tasks) and s,
                       30, "every task of tf-c to run")
    assert {t.name for t in running.tasks} == {"tf-c-ps-0-0", "tf-c-worker-0-0", "tf-c-worker-0-1"}

    # The workers succeed: the JobSet completes (its success policy) and its controller stops the ps.
    statuses = collect(backend, ref, steps=[(0.5, lambda: [scripted.succeed(n) for n in names])], timeout=30)
    outcome = group_outcome(statuses[-1], ref.success_policy)
    assert outcome.done and outcome.succeeded, statuses[-1]
    wait_for(lambda: jobset(kube, "tf-c")["status"].get("terminalState") == "Completed", 30,
             "JobSet tf-c to be Completed")
    wait_for(lambda: not kube.objects("jobs", f"{GROUP_LABEL}=tf-c,airflow-tf/role=ps"), 30,
             "the JobSet controller to delete the ps Job")

    deleted = backend.teardown(ref)
    assert deleted[0] == "jobset/tf-c"
    assert jobset(kube, "tf-c") is None
    wait_for(lambda: kube.gone("jobs", f"{GROUP_LABEL}=tf-c") and kube.gone("pods", f"{GROUP_LABEL}=tf-c"), REMOVAL_BOUND,
             "tf-c's Jobs and pods to be gone")
    assert backend.status(ref).exists is False


def test_evaluation_of_a_jobset_group_runs_on_the_template_its_launch_recorded(kube, scripted, kube_backend_fast):
    """After the teardown, from the lead trainer's pod template in the reference: one Job, not queued."""
    ref = kube_backend_fast.launch(group("tf-d", queue=None))
    kube_backend_fast.teardown(ref)
    request = {"run_dir": "/runs/tf-d", "dataset": "/data/mnist/1", "training": {"steps": 10}}
    made = []

    def play():
        name = wait_for(lambda: next((p["metadata"]["name"] for p in kube.objects("pods", "airflow-tf/component=evaluate")
                                      if p["spec"].get("nodeName")), None), 60, "the evaluation pod")
        made.append(kube.get("jobs", "tf-d-evaluate"))
        scripted.succeed(name, message='{"blessed":true,"metrics":{"mse":0.5}}', wait=False)

    runner = threading.Thread(target=play)
    runner.start()
    result = kube_backend_fast.run_component(ref, "evaluate", request, timeout=120)
    runner.join()
    assert result == {"blessed": True, "metrics": {"mse": 0.5}}
    container = made[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == training_image() and container["name"] == "evaluate"
    assert container["resources"]["requests"]["cpu"] == TASK_CPU, "the worker's own resources"
    assert "kueue.x-k8s.io/queue-name" not in made[0]["metadata"]["labels"]
    assert made[0]["spec"].get("suspend") in (None, False)
