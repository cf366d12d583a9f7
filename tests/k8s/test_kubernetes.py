"""The Kubernetes backend against a real control plane: kube-apiserver, kube-controller-manager
and kube-scheduler of Kubernetes v1.37 on etcd (``scripts/kube``; tests/k8s/conftest.py).

The pods run on the real node from the training image, their command a loop that does what the
test tells it (tests/k8s/scripted.py): exit with a code, print lines, write a termination
message, run out of memory; the kubelet reports it, and the Job controller, the garbage
collector, the TTL controller and the scheduler decide the rest. The backend runs as a service
account bound only to the shipped ``airflow_tf/rbac/role.yaml``, so the real authorizer refuses
anything outside it; its requests are read back from the API server's audit log."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import socket
import threading
import time

import pytest
import yaml
from .plane import REMOVAL_BOUND, ROLE_FILE, wait_for
from .scripted import ABSENT_IMAGE, original_command, scripted_manifests, training_image

from airflow_tf.backends import BackendError, backend_for, get_backend
from airflow_tf.backends.kubernetes.jobs import render_group
from airflow_tf.backends.kubernetes.status import assess
from airflow_tf.backends.kubernetes.labels import GROUP_LABEL, ROLE_LABEL
from airflow_tf.backends.kubernetes.manifests import PEERS_ANSWERED_CHECK
from airflow_tf.backends.kubernetes.nodes import moves, moving
from airflow_tf.backends.kubernetes.status import INDEX_LABEL
from airflow_tf.cluster import GroupSpec, OutcomeCode, Phase, TrainingConfig, group_outcome, group_name
from airflow_tf.cluster.progress import format_progress

SETTLE_SECONDS = 1.5
"""How long a test lets the controllers act before it checks that something did NOT happen."""


def _granted() -> set[tuple[str, str, str]]:
    role = yaml.safe_load(ROLE_FILE.read_text())
    assert role["kind"] == "Role"
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


@pytest.fixture
def kubeconfig(kube) -> str:
    """The backend's kubeconfig: its service account, bound only to role.yaml, in the test's namespace."""
    return str(kube.kubeconfig)


@pytest.fixture
def backend(kube, kubeconfig):
    yield get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=kube.ns)
    if kube.plane.private:
        assert not [c for c in kube.calls(resource="pods") if c.verb in ("create", "delete")], \
            "pods are made, restarted and removed by the Job controller, never by the backend"


def make_spec(name: str = "tf-mnist", workers: int = 2, **options) -> GroupSpec:
    training = TrainingConfig(dataset="/data/mnist/1", run_dir=f"/runs/{name}", steps=200)
    options.setdefault("image", training_image())
    return GroupSpec.for_training(name, training, ps=1, workers=workers, **options)


def _contains(actual, expected, where="spec") -> bool:
    """Whether ``actual`` holds every field of ``expected`` with the same value (the API server
    adds its defaults around them); AssertionError naming the first field that differs."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: {actual!r} is not a mapping"
        return all(_contains(actual.get(key), value, f"{where}.{key}") for key, value in expected.items())
    if isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{where}: {actual!r} != {expected!r}"
        return all(_contains(a, e, f"{where}[{i}]") for i, (a, e) in enumerate(zip(actual, expected)))
    # The API drops empty strings (an env var set to ""): the same value on the way back.
    assert actual == expected or (expected == "" and actual is None), f"{where}: {actual!r} != {expected!r}"
    return True


def pod(scripted, role, index, group="tf-mnist", **wait):
    """The current pod of a task, once the Job controller made it and the scheduler placed it
    (pods are named <job>-<index>-<random>)."""
    return scripted.pod(f"{group}-{role}", index, **wait)


def tasks_of(kube, selector=f"{GROUP_LABEL}=tf-mnist"):
    """(role, index) of every pod not being deleted, as the Job controller labelled them."""
    return sorted((p["metadata"]["labels"][ROLE_LABEL], int(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]))
                  for p in kube.objects("pods", selector) if not p["metadata"].get("deletionTimestamp"))


def outcome_when_done(backend, ref, timeout=30.0):
    """The group's outcome once it is done (the controllers act a moment after each change)."""
    return wait_for(lambda: (o := group_outcome(backend.status(ref), ref.success_policy)).done and o,
                    timeout, f"group {ref.name} to be done")


def collect(backend, ref, steps=(), timeout=5.0, until_done=True):
    """Statuses yielded by watch() while ``steps`` (delay, action) change the pods; the actions
    run in a thread of their own, beside the watching process."""

    async def run():
        failures = []

        def drive():
            try:
                for delay, action in steps:
                    time.sleep(delay)
                    action()
            except Exception as e:  # noqa: BLE001 - raised in the test's thread below
                failures.append(e)

        driver = threading.Thread(target=drive)
        driver.start()
        seen = []
        async for status in backend.watch(ref, timeout=timeout):
            seen.append(status)
            if until_done and group_outcome(status, ref.success_policy).done:
                break
        await asyncio.get_running_loop().run_in_executor(None, driver.join)
        if failures:
            raise failures[0]
        return seen

    return asyncio.run(run())


# -- launch ----------------------------------------------------------------------------------
def test_launch_creates_one_indexed_job_per_role_owned_by_the_root(kube, scripted, backend):
    spec = make_spec(labels={"dag_id": "train_mnist", "task_id": "launch", "run_id": "manual__2026-05-01T00:00:00+00:00",
                             "try_number": "1"})
    ref = backend.launch(spec)

    assert (ref.backend, ref.name, ref.namespace) == ("kubernetes", "tf-mnist", kube.ns)
    # What airflow-tf render prints, but for the command the scripted pods run instead.
    expected = {o["metadata"]["name"]: scripted_manifests(o) for o in render_group(spec, kube.ns)}
    jobs = {j["metadata"]["name"]: j for j in kube.objects("jobs")}
    assert sorted(jobs) == ["tf-mnist-ps", "tf-mnist-worker"]
    root = jobs["tf-mnist-worker"]
    for name, job in jobs.items():
        assert _contains(job["spec"], expected[name]["spec"]), "what airflow-tf render prints, with the API's defaults"
        assert job["spec"]["completionMode"] == "Indexed"
        labels = job["metadata"]["labels"]
        assert labels[GROUP_LABEL] == "tf-mnist" and labels["dag_id"] == "train_mnist"
        assert labels["run_id"].startswith("manual__2026-05-01T00") and "+" not in labels["run_id"]
    assert "ownerReferences" not in root["metadata"]
    service, = kube.objects("services")
    for owned in (jobs["tf-mnist-ps"], service):
        assert owned["metadata"]["ownerReferences"][0]["uid"] == root["metadata"]["uid"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True

    # The Job controller made the pods: hostname <job>-<index> under the Service, the index in the env.
    worker1 = kube.get("pods", pod(scripted, "worker", 1))
    assert tasks_of(kube) == [("ps", 0), ("worker", 0), ("worker", 1)]
    assert (worker1["spec"]["hostname"], worker1["spec"]["subdomain"]) == ("tf-mnist-worker-1", "tf-mnist")
    env = {e["name"]: e for e in worker1["spec"]["containers"][0]["env"]}
    assert env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['batch.kubernetes.io/job-completion-index']", "the Job controller's"
    assert worker1["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1"
    tf_config = json.loads(env["TF_CONFIG"]["value"])
    ns = kube.ns
    assert tf_config["cluster"] == {"ps": [f"tf-mnist-ps-0.tf-mnist.{ns}.svc:2222"],
                                    "worker": [f"tf-mnist-worker-0.tf-mnist.{ns}.svc:2222",
                                               f"tf-mnist-worker-1.tf-mnist.{ns}.svc:2222"]}
    assert tf_config["task"] == {"type": "worker"}
    from airflow_tf.runtime.task import task_from_env

    assert task_from_env({"TF_CONFIG": env["TF_CONFIG"]["value"], "JOB_COMPLETION_INDEX": "1"}).index == 1, \
        "the runtime takes its index from JOB_COMPLETION_INDEX"
    found = backend.find("tf-mnist")
    # The same group; its task template is the stored one, with the API server's defaults.
    assert (found.name, found.namespace, found.uid, found.labels, found.success_policy) == (
        ref.name, ref.namespace, ref.uid, ref.labels, ref.success_policy)
    assert backend.find("tf-other") is None


def test_the_rendered_group_passes_the_api_servers_validation(kube):
    """What ``airflow-tf render ... | kubectl apply --dry-run=server -f -`` checks: every object,
    GPUs, volumes and a NetworkPolicy included, is accepted and nothing is stored."""
    spec = make_spec(chief=1, role_options=GPU_WORKERS)
    plane = kube.plane
    create = {"Job": plane.batch.create_namespaced_job, "Service": plane.core.create_namespaced_service,
              "NetworkPolicy": plane.networking.create_namespaced_network_policy}
    objects = render_group(spec, kube.ns, network_policy=True, pod_defaults={
        "volumes": [{"claim": "tf-runs", "mount_path": "/runs"}]})
    assert sorted(o["kind"] for o in objects) == ["Job", "Job", "Job", "NetworkPolicy", "Service"]
    for obj in objects:
        create[obj["kind"]](kube.ns, obj, dry_run="All")
    assert kube.objects("jobs") == [] and kube.objects("services") == []


def test_retried_launch_reattaches_and_creates_nothing(kube, scripted, backend):
    first = backend.launch(make_spec())
    uids = {j["metadata"]["uid"] for j in kube.objects("jobs")}
    before = len(kube.calls("create"))
    again = get_backend("kubernetes", **first.options, namespace=kube.ns).launch(make_spec())
    assert again == first
    assert len(kube.calls("create")) == before, "a retried launch must not create anything"
    assert {j["metadata"]["uid"] for j in kube.objects("jobs")} == uids

    # A launch interrupted half-way is completed, not duplicated, and owned by the same root.
    kube.remove("jobs", "tf-mnist-ps")
    wait_for(lambda: kube.get("jobs", "tf-mnist-ps") is None and ("ps", 0) not in tasks_of(kube), 30,
             "the ps Job and its pod to be gone")
    backend.launch(make_spec())
    created = kube.calls("create")[before:]
    assert [c.resource for c in created] == ["jobs"]
    wait_for(lambda: tasks_of(kube).count(("ps", 0)) == 1, 30, "one new ps pod")
    assert kube.get("jobs", "tf-mnist-ps")["metadata"]["ownerReferences"][0]["name"] == "tf-mnist-worker"


def test_connection_from_airflow_connection_env(kube, scripted, kubeconfig, monkeypatch):
    # The provider's default connection, defined the way Airflow reads it from the environment.
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": kubeconfig, "namespace": kube.ns}}))
    backend = get_backend("kubernetes")
    ref = backend.launch(make_spec())
    assert ref.namespace == kube.ns and len(kube.objects("jobs")) == 2
    scripted.running(pod(scripted, "worker", 0))
    seen = collect(backend_for(ref), ref, timeout=1.0, until_done=False)  # the async hook, same connection
    assert seen[-1].task("worker", 0).phase is Phase.RUNNING


def test_unreachable_api_server_is_a_clear_error(tmp_path):
    with socket.socket() as s:  # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}]}))
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=str(config), namespace="ml")
    with pytest.raises(BackendError, match=r"cannot reach the Kubernetes API at http://127\.0\.0\.1:\d+"):
        backend.launch(make_spec())


# -- status --------------------------------------------------------------------------------------
GPU_WORKERS = {"worker": {"resources": {"limits": {"nvidia.com/gpu": 1}}}}
NO_GPU = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


def _unschedulable_spec(timeout):
    return make_spec(role_options={"worker": {"resources": {"limits": {"nvidia.com/gpu": 1}},
                                              "kubernetes": {"schedule_timeout_seconds": timeout}}})


SCENARIO_MEMORY = "100Mi"
"""The workers' memory limit in the scenarios: the shell loop fits, a 1 GiB allocation does not."""


def _scenario_spec(worker_image=None):
    worker = {"resources": {"limits": {"memory": SCENARIO_MEMORY}}, "kubernetes": {"schedule_timeout_seconds": 60}}
    return make_spec(role_options={"worker": {**worker, **({"image": worker_image} if worker_image else {})}})


_RUNNING = OutcomeCode.RUNNING
SCENARIOS = {
    # name: (the group, what happens to its pods, done, succeeded, the outcome's code(s), words its
    # reason must contain for people: the task, the limit, what to change)
    "running": (_scenario_spec, lambda k: [k.running(pod(k, "ps", 0)), k.running(pod(k, "worker", 0)),
                                           k.running(pod(k, "worker", 1))], False, False, {_RUNNING},
                ["workers done 0/2"]),
    "one_succeeded": (_scenario_spec, lambda k: [k.running(pod(k, "worker", 0)), k.succeed(pod(k, "worker", 1))],
                      False, False, {_RUNNING}, ["workers done 1/2"]),
    "succeeded": (_scenario_spec, lambda k: [k.running(pod(k, "ps", 0)), k.succeed(pod(k, "worker", 0)),
                                             k.succeed(pod(k, "worker", 1))],
                  True, True, {OutcomeCode.SUCCEEDED}, ["all 2 training task(s) succeeded"]),
    "program_error": (_scenario_spec, lambda k: k.fail(pod(k, "worker", 1), exit_code=2), True, False,
                      {OutcomeCode.TASK_FAILED},
                      ["tf-mnist-worker-1", "exit code 2", "a program error, not retried (podFailurePolicy)",
                       "Container worker for pod {ns}/tf-mnist-worker-1-"]),
    # The workers' image is in no registry: the node's pull is refused (ErrImagePull, then ImagePullBackOff).
    "image_pull": (lambda: _scenario_spec(worker_image=ABSENT_IMAGE), lambda k: None, True, False,
                   {OutcomeCode.IMAGE_PULL}, ["pod tf-mnist-worker-", "the image cannot be pulled", ABSENT_IMAGE]),
    # Not on the node, and never to be pulled: waiting cannot help.
    "image_never_pulled": (lambda: make_spec(role_options={"ps": {"image": ABSENT_IMAGE, "kubernetes": {
                               "image_pull_policy": "Never"}}}), lambda k: None, True, False,
                           {OutcomeCode.IMAGE_PULL}, ["pod tf-mnist-ps-0-", "image_pull_policy is Never"]),
    # The real scheduler's verdict: the node has no GPU.
    "unschedulable_waiting": (lambda: _unschedulable_spec(600), lambda k: None, False, False, {_RUNNING},
                              ["workers done 0/2"]),
    "unschedulable_timeout": (lambda: _unschedulable_spec(2), lambda k: None, True, False,
                              {OutcomeCode.UNSCHEDULABLE},
                              ["pod tf-mnist-worker-", "more than 2s", f"the scheduler says: {NO_GPU}"]),
    "oom": (_scenario_spec, lambda k: k.oom(pod(k, "worker", 0)), True, False, {OutcomeCode.OUT_OF_MEMORY},
            ["pod tf-mnist-worker-0-", f"limit {SCENARIO_MEMORY}", "resources.limits.memory"]),
    "evicted_is_replaced": (_scenario_spec, lambda k: k.evict(pod(k, "ps", 0)), False, False, {_RUNNING},
                            ["workers done 0/2"]),
    # Whichever Job the garbage collector lets go of last, the group is reported deleted: not
    # found once both are gone, a trainer's Job deleted while the ps's remains.
    "worker_job_deleted": (_scenario_spec, lambda k: k.remove_jobs_orphaning_pods(), True, False,
                           {OutcomeCode.GROUP_NOT_FOUND, OutcomeCode.GROUP_DELETED}, []),
    "ps_job_deleted_outside": (_scenario_spec, lambda k: [k.remove_job("tf-mnist-ps"), k.succeed(pod(k, "worker", 0)),
                                                          k.succeed(pod(k, "worker", 1))], True, True,
                               {OutcomeCode.SUCCEEDED}, ["all 2 training task(s) succeeded"]),
    "ps_being_torn_down": (_scenario_spec, lambda k: [k.succeed(pod(k, "worker", 0)), k.succeed(pod(k, "worker", 1)),
                                                      k.terminating(pod(k, "ps", 0))], True, True,
                           {OutcomeCode.SUCCEEDED}, ["all 2 training task(s) succeeded"]),
}


class _Scene:
    """The pods of a scenario, plus the two deletions a user makes with kubectl."""

    def __init__(self, kube, scripted):
        self.kube, self.scripted = kube, scripted

    def __getattr__(self, name):
        return getattr(self.scripted, name)

    def remove_job(self, name):
        self.kube.remove("jobs", name)

    def remove_jobs_orphaning_pods(self):
        self.kube.remove("jobs", "tf-mnist-ps", propagation="Orphan")
        self.kube.remove("jobs", "tf-mnist-worker", propagation="Orphan")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("path", ["status", "watch"])
def test_pod_states_give_the_right_outcome(kube, scripted, backend, scenario, path):
    spec, act, done, succeeded, codes, words = SCENARIOS[scenario]
    ref = backend.launch(spec())
    act(_Scene(kube, scripted))
    if path == "status":
        if done:
            outcome = outcome_when_done(backend, ref)
        else:  # what the node reported shows a moment later: wait for the words, then check it stays so
            wait_for(lambda: all(w.format(ns=kube.ns) in group_outcome(backend.status(ref), ref.success_policy).reason
                                 for w in words), 30, f"the outcome to say {words}")
            time.sleep(SETTLE_SECONDS)
            outcome = group_outcome(backend.status(ref), ref.success_policy)
    else:
        seen = collect(backend, ref, timeout=30.0 if done else SETTLE_SECONDS, until_done=done)
        outcome = group_outcome(seen[-1], ref.success_policy)
    assert (outcome.done, outcome.succeeded) == (done, succeeded), outcome
    assert outcome.code in codes, outcome
    for word in words:
        word = word.format(ns=kube.ns)
        assert word in outcome.reason, f"{word!r} not in {outcome.reason!r}"


def test_unschedulable_pod_is_failed_when_its_timeout_passes_during_the_watch(kube, scripted, backend):
    # The scheduler's words depend on the nodes: here, the one real node, with no GPU.
    # 8 s: long enough that even on a loaded machine the watch sees the pod wait before it fails.
    ref = backend.launch(_unschedulable_spec(8))
    seen = collect(backend, ref, timeout=40.0)
    outcome = group_outcome(seen[-1])
    assert outcome.done and not outcome.succeeded and outcome.code is OutcomeCode.UNSCHEDULABLE
    assert f"the scheduler says: {NO_GPU}" in outcome.reason
    assert [s for s in seen if not group_outcome(s).done], "the pod was first reported as waiting for a node"
    assert len(kube.calls("list", "events")) >= 1


@pytest.mark.slow  # the Job controller's 10 s backoff before it replaces a failed pod
def test_a_retryable_failure_is_restarted_by_kubernetes_not_by_the_backend(kube, scripted, backend):
    ref = backend.launch(make_spec(backoff_limit=1))
    first = pod(scripted, "worker", 0)
    scripted.running(first)
    creates = len(kube.calls("create"))
    scripted.fail(first, exit_code=137)  # killed by a signal: the ExitCode policy retries

    # The Job controller replaces the pod (after its backoff); status() only reads.
    second = pod(scripted, "worker", 0, other_than=first, timeout=60)
    # Which task was replaced, and why: what the sensor's log and the Training view show (while the
    # replacement's container is being created, its waiting reason is shown instead).
    replaced = [f"tf-mnist-worker-0 restarted 1 time(s), last: pod {first} ended (exit code 137 (SIGKILL)); "
                f"Job tf-mnist-worker replaced it"]
    status = wait_for(lambda: (s := backend.status(ref)).replacements() == replaced and s, 60, "the restart to show")
    assert status.task("worker", 0).phase in (Phase.PENDING, Phase.RUNNING), "the replacement, starting or started"
    assert not group_outcome(status).done
    assert len(kube.calls("create")) == creates, "the backend created nothing after the launch"
    assert {c.verb for c in kube.calls() if c.resource in ("pods", "jobs")} <= {"create", "get", "list", "watch"}

    # The budget is per task (backoffLimitPerIndex): worker 0 has spent its one restart.
    scripted.fail(second, exit_code=143)
    outcome = outcome_when_done(backend, ref)
    assert not outcome.succeeded
    # Whichever the status read first: the pod's spent restarts, or the Job's verdict on them.
    assert "tf-mnist-worker-0" in outcome.reason and "exit code 143" in outcome.reason
    assert "its restarts are spent (backoffLimitPerIndex)" in outcome.reason or \
        "MaxFailedIndexesExceeded" in outcome.reason, outcome.reason


def test_a_user_error_fails_the_group_at_once_with_its_reason(kube, scripted, backend):
    ref = backend.launch(make_spec(backoff_limit=5))
    scripted.running(pod(scripted, "worker", 0))
    failing = pod(scripted, "worker", 1)
    log_text = "Traceback (most recent call last):\n  ...\nmodel refused: expected a Keras model\n"
    scripted.fail(failing, exit_code=2, log=log_text)  # the runtime's CONFIG_ERROR: no restart would help
    outcome = outcome_when_done(backend, ref)
    assert not outcome.succeeded
    assert outcome.failed_task.name == "tf-mnist-worker-1" and outcome.code is OutcomeCode.TASK_FAILED
    assert "exit code 2" in outcome.reason and "podFailurePolicy" in outcome.reason
    # The cause, carried by the pod's status (terminationMessagePolicy), not a traceback frame.
    assert "last log line: model refused: expected a Keras model" in outcome.reason
    reasons = wait_for(lambda: [c["reason"] for c in (kube.get("jobs", "tf-mnist-worker").get("status") or {}).get(
        "conditions") or []], 30, "the worker Job's conditions")
    assert "PodFailurePolicy" in reasons
    wait_for(lambda: not [p for p in kube.objects("pods", f"{ROLE_LABEL}=worker") if p["status"]["phase"] == "Running"],
             30, "Kubernetes to stop the other worker")
    assert backend.logs(ref, "worker", 1) == log_text, "through the API server, from the node's kubelet"


def test_a_worker_stopped_because_its_job_failed_is_not_named_as_the_failure():
    """The Job controller deletes the running pods of a Job that failed; for a moment the stopped
    worker shows as failed by SIGTERM. The task that failed first is still the one named."""
    jobs = [o for o in render_group(make_spec(backoff_limit=5), "ml") if o["kind"] == "Job"]
    worker_job = next(j for j in jobs if j["metadata"]["name"] == "tf-mnist-worker")
    worker_job["status"] = {"conditions": [{
        "type": "Failed", "status": "True", "reason": "PodFailurePolicy",
        "message": "Container worker for pod ml/tf-mnist-worker-1-b failed with exit code 2 matching FailJob rule"}]}

    def worker_pod(index, exit_code, **meta):
        return {"metadata": {"name": f"tf-mnist-worker-{index}-b", "creationTimestamp": "2026-11-26T09:59:00Z",
                             "labels": {GROUP_LABEL: "tf-mnist", ROLE_LABEL: "worker",
                                        "batch.kubernetes.io/job-completion-index": str(index)}, **meta},
                "status": {"phase": "Failed", "containerStatuses": [
                    {"name": "worker", "state": {"terminated": {"exitCode": exit_code}}}]}}

    pods = [worker_pod(0, 143, deletionTimestamp="2026-11-26T10:00:01Z"), worker_pod(1, 2)]
    status = assess("tf-mnist", jobs, pods, dt.datetime(2026, 11, 26, 10, 0, 2, tzinfo=dt.UTC))
    outcome = group_outcome(status)
    assert outcome.failed_task.name == "tf-mnist-worker-1" and "exit code 2" in outcome.reason
    assert status.task("worker", 0).reason.startswith("stopped by Kubernetes: a program error, not retried")


def _assessed_alone(worker_status: dict, job_condition: dict | None = None):
    """The outcome of a group whose worker-0 pod's status is ``worker_status`` (its Job failed with
    ``job_condition``), read as the backend reads it, without an API server."""
    jobs = [o for o in render_group(make_spec(workers=1), "ml") if o["kind"] == "Job"]
    if job_condition is not None:
        next(j for j in jobs if j["metadata"]["name"] == "tf-mnist-worker")["status"] = {
            "conditions": [{"type": "Failed", "status": "True", **job_condition}]}
    pods = [] if worker_status is None else [{
        "metadata": {"name": "tf-mnist-worker-0-a", "creationTimestamp": "2026-11-26T09:59:00Z",
                     "labels": {GROUP_LABEL: "tf-mnist", ROLE_LABEL: "worker",
                                "batch.kubernetes.io/job-completion-index": "0"}},
        "spec": {"containers": [{"name": "worker"}]}, "status": worker_status}]
    return group_outcome(assess("tf-mnist", jobs, pods, dt.datetime(2026, 11, 26, 10, 0, 2, tzinfo=dt.UTC)))


def _waiting(reason):
    return {"phase": "Pending", "containerStatuses": [{"name": "worker", "state": {"waiting": {"reason": reason}}}]}


@pytest.mark.parametrize("worker_status, job_condition, code", [
    (_waiting("ImagePullBackOff"), None, OutcomeCode.IMAGE_PULL),
    (_waiting("InvalidImageName"), None, OutcomeCode.IMAGE_PULL),
    (_waiting("CreateContainerConfigError"), None, OutcomeCode.CONFIG_MISSING),
    ({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                          "lastTransitionTime": "2026-11-26T09:00:00Z", "message": "0/1 nodes"}]},
     None, OutcomeCode.UNSCHEDULABLE),
    ({"phase": "Failed", "containerStatuses": [
        {"name": "worker", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]},
     None, OutcomeCode.OUT_OF_MEMORY),
    ({"phase": "Failed", "reason": "DeadlineExceeded"}, None, OutcomeCode.DEADLINE_EXCEEDED),
    (None, {"reason": "DeadlineExceeded"}, OutcomeCode.DEADLINE_EXCEEDED),
    ({"phase": "Failed", "containerStatuses": [{"name": "worker", "state": {"terminated": {"exitCode": 143}}}]},
     {"reason": "DeadlineExceeded"}, OutcomeCode.DEADLINE_EXCEEDED),
    ({"phase": "Failed", "containerStatuses": [{"name": "worker", "state": {"terminated": {"exitCode": 2}}}]},
     {"reason": "PodFailurePolicy", "message": "exit code 2 matching FailJob rule"}, OutcomeCode.TASK_FAILED),
    (None, {"reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"},
     OutcomeCode.GROUP_FAILED),
])
def test_each_kind_of_kubernetes_failure_gives_its_code(worker_status, job_condition, code):
    outcome = _assessed_alone(worker_status, job_condition)
    assert (outcome.done, outcome.succeeded, outcome.code) == (True, False, code), outcome


def test_a_trainers_job_deleted_outside_airflow_tf_is_group_deleted():
    ps_job = next(o for o in render_group(make_spec(), "ml") if o["kind"] == "Job" and
                  o["metadata"]["name"] == "tf-mnist-ps")
    outcome = group_outcome(assess("tf-mnist", [ps_job], [], dt.datetime(2026, 11, 26, tzinfo=dt.UTC)))
    assert outcome.done and outcome.code is OutcomeCode.GROUP_DELETED, outcome
    assert group_outcome(assess("tf-mnist", [], [], dt.datetime(2026, 11, 26, tzinfo=dt.UTC))).code \
        is OutcomeCode.GROUP_NOT_FOUND


@pytest.mark.slow  # the Job controller's 10 s backoff before it replaces a failed pod
def test_watch_sees_a_parameter_server_replaced_after_eviction_and_the_group_goes_on(kube, scripted, backend):
    ref = backend.launch(make_spec(backoff_limit=0))
    evicted = []

    def evict():
        evicted.append(pod(scripted, "ps", 0))
        scripted.evict(evicted[0])  # as a node drain does: through the Eviction API

    steps = [(0.2, lambda: scripted.running(pod(scripted, "ps", 0))),
             (0.2, evict),
             (0.2, lambda: scripted.running(pod(scripted, "ps", 0, other_than=evicted[0], timeout=60))),
             (0.2, lambda: scripted.succeed(pod(scripted, "worker", 0))),
             (0.2, lambda: scripted.succeed(pod(scripted, "worker", 1)))]
    seen = collect(backend, ref, steps, timeout=90.0)
    assert group_outcome(seen[-1]).succeeded, "a disruption does not count against backoffLimitPerIndex 0"
    # The Eviction API deletes the pod it evicts: the ps's Job replaced it with another.
    assert kube.get("pods", evicted[0]) is None
    assert [p["metadata"]["name"] for p in kube.objects("pods", f"{ROLE_LABEL}=ps")] != evicted


# -- watching --------------------------------------------------------------------------------------
def test_waiting_uses_a_watch_not_a_poll(kube, scripted, backend):
    ref = backend.launch(make_spec())
    scripted.say(pod(scripted, "worker", 0), format_progress(50, 200, 900.0, 0.25, 3.0) + "\n")
    for role, index in (("ps", 0), ("worker", 1)):
        pod(scripted, role, index)  # every pod made and placed before the watch starts
    start = time.time()
    steps = [(0.3, lambda: scripted.running(pod(scripted, "ps", 0))),
             (0.3, lambda: scripted.running(pod(scripted, "worker", 0))),
             (0.3, lambda: scripted.running(pod(scripted, "worker", 1))),
             (1.0, lambda: scripted.succeed(pod(scripted, "worker", 1))),
             (1.0, lambda: scripted.succeed(pod(scripted, "worker", 0)))]
    seen = collect(backend, ref, steps, timeout=30.0)

    assert group_outcome(seen[-1]).succeeded
    assert [group_outcome(s).reason for s in seen if group_outcome(s).code is OutcomeCode.RUNNING][-1] == "workers done 1/2"
    assert any(s.progress and s.progress["global_step"] == 50 for s in seen), "progress from worker 0's log"
    watches = kube.calls("watch", "pods", since=start)
    lists = kube.calls("list", "pods", since=start)
    assert len(watches) == 1, "one watch request follows all five changes"
    assert watches[0].query.get("resourceVersion"), "the watch resumes from the listed resource version"
    assert len(lists) == 1, "the pods are listed once, then watched"
    assert len(kube.calls("get", "pods/log", since=start)) <= 2


def test_watch_recovers_from_an_expired_resource_version(kube, scripted, backend):
    ref = backend.launch(make_spec())
    workers = [pod(scripted, "worker", 0), pod(scripted, "worker", 1)]

    compacted = []

    def finish_and_compact():
        for name in workers:
            scripted.succeed(name)
        # What the API server does every few minutes: every older version is gone.
        compacted.append(kube.plane.compact_etcd())

    async def run():
        seen = []
        async for status in backend.watch(ref, timeout=30.0):
            seen.append(status)
            if len(seen) == 1:  # the watch is about to resume from a version that is gone
                await asyncio.get_running_loop().run_in_executor(None, finish_and_compact)
            if group_outcome(status).done:
                break
        return seen

    before = time.time()
    assert group_outcome(asyncio.run(run())[-1]).succeeded
    watch = kube.calls("watch", "pods", since=before)[0]  # a real node's pod changes may start more after it
    assert int(watch.query["resourceVersion"]) < compacted[0], "the watch asked for a compacted version"
    assert len(kube.calls("list", "pods", since=before)) == 2, "listed at the start and once after the 410"


def test_trigger_fires_with_the_failed_pod_and_its_log(kube, scripted, backend):
    from airflow_tf.triggers.worker_completion import WorkerCompletionTrigger

    ref = backend.launch(make_spec())
    trigger = WorkerCompletionTrigger(ref.to_dict())
    classpath, kwargs = trigger.serialize()
    trigger = WorkerCompletionTrigger(**kwargs)  # as the triggerer rebuilds it
    failing = pod(scripted, "worker", 1)
    scripted.say(failing, "Traceback (most recent call last):\nValueError: bad feature 'x3'\n")

    async def run():
        async def crash():
            await asyncio.sleep(0.3)
            await asyncio.get_running_loop().run_in_executor(None, lambda: scripted.fail(failing, exit_code=1))

        crashing = asyncio.create_task(crash())
        event = await asyncio.wait_for(trigger.run().__anext__(), timeout=60)
        await crashing
        return event

    payload = asyncio.run(run()).payload
    assert payload["status"] == "failed"
    assert payload["failed_task"]["name"] == "tf-mnist-worker-1"
    assert "exit code 1" in payload["reason"] and "bad feature 'x3'" in payload["log_tail"]


# -- logs and teardown -----------------------------------------------------------------------
def test_logs_return_the_tail_and_nothing_before_the_container_starts(kube, scripted, backend):
    ref = backend.launch(make_spec())
    assert backend.logs(ref, "worker", 0) == ""
    worker = pod(scripted, "worker", 0)
    assert backend.logs(ref, "worker", 0) == "", "placed on the node, nothing printed yet"
    scripted.say(worker, "".join(f"line {i}\n" for i in range(10)))
    wait_for(lambda: backend.logs(ref, "worker", 0, tail_lines=2) == "line 8\nline 9\n", 10,
             "the last two lines, through the API server from the kubelet")
    assert backend.logs(ref, "worker", 0).count("\n") == 10


def test_teardown_of_ps_leaves_finished_workers_then_all_leaves_nothing(kube, scripted, kubeconfig):
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=kube.ns,
                          network_policy=True)
    ref = backend.launch(make_spec())
    other = backend.launch(make_spec(name="tf-other"))
    assert len(kube.objects("networkpolicies")) == 2
    scripted.succeed(pod(scripted, "worker", 0))
    scripted.succeed(pod(scripted, "worker", 1))
    pod(scripted, "ps", 0)

    deleted = backend_for(ref).teardown(ref, roles=["ps"])
    assert deleted == ["job/tf-mnist-ps"]
    wait_for(lambda: tasks_of(kube) == [("worker", 0), ("worker", 1)], 30, "the ps pod to go with its Job")
    assert outcome_when_done(backend, ref).succeeded, "finished workers still count after the ps are gone"

    deleted = backend_for(ref).teardown(ref)
    assert deleted[0] == "job/tf-mnist-worker", "the root first"
    for kind in ("jobs", "pods", "services", "networkpolicies"):
        wait_for(lambda: kube.gone(kind, f"{GROUP_LABEL}=tf-mnist"), REMOVAL_BOUND, f"the group's {kind} to be gone")
        assert kube.objects(kind, f"{GROUP_LABEL}=tf-other")
    assert backend.teardown(ref) == [], "a second teardown finds nothing and does not fail"
    assert not backend.status(ref).exists
    assert backend.status(other).exists


def test_deleting_the_root_removes_every_object_of_the_group(kube, scripted, kubeconfig):
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=kube.ns,
                          network_policy=True)
    backend.launch(make_spec(chief=1))
    root = kube.get("jobs", "tf-mnist-chief")
    assert root["metadata"]["annotations"]["airflow-tf/root"] == "true"
    wait_for(lambda: len(tasks_of(kube)) == 4, 30, "the group's four pods")
    kube.remove("jobs", "tf-mnist-chief")  # kubectl delete job tf-mnist-chief
    for kind in ("jobs", "pods", "services", "networkpolicies"):
        wait_for(lambda: kube.gone(kind), REMOVAL_BOUND, f"the garbage collector to remove the group's {kind}")


def test_a_group_whose_airflow_vanished_is_removed_by_kubernetes_after_its_ttl(kube, scripted, kubeconfig):
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=kube.ns,
                          ttl_seconds_after_finished=4)
    backend.launch(make_spec())
    scripted.running(pod(scripted, "ps", 0))
    scripted.succeed(pod(scripted, "worker", 0))
    scripted.succeed(pod(scripted, "worker", 1))
    # No teardown ever comes. The parameter server runs on until the root's TTL passes.
    wait_for(lambda: "Complete" in [c["type"] for c in (kube.get("jobs", "tf-mnist-worker").get("status") or {}).get(
        "conditions") or []], 30, "the root Job to complete")
    finished = time.monotonic()
    assert tasks_of(kube) == [("ps", 0), ("worker", 0), ("worker", 1)]
    for kind in ("jobs", "pods", "services"):
        wait_for(lambda: kube.gone(kind), REMOVAL_BOUND, f"the TTL controller and garbage collector to remove the {kind}")
    assert time.monotonic() - finished >= 2, "not before the TTL"


def test_parameter_servers_of_workers_that_never_finish_are_bounded_by_their_deadline(kube, scripted, kubeconfig):
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=kube.ns,
                          ps_max_lifetime_seconds=3)
    ref = backend.launch(make_spec())
    scripted.running(pod(scripted, "ps", 0))
    scripted.running(pod(scripted, "worker", 0))  # hangs forever; Airflow is gone
    assert kube.get("jobs", "tf-mnist-ps")["spec"]["activeDeadlineSeconds"] == 3
    wait_for(lambda: tasks_of(kube, f"{ROLE_LABEL}=ps") == [], 30, "the ps pod to be stopped at its deadline")
    assert outcome_when_done(backend, ref).code is OutcomeCode.DEADLINE_EXCEEDED


def test_group_deadline_fails_the_group(kube, scripted, backend):
    ref = backend.launch(make_spec(active_deadline_seconds=10))
    assert not group_outcome(backend.status(ref)).done
    assert {j["spec"]["activeDeadlineSeconds"] for j in kube.objects("jobs")} == {10}
    # Its pods run on (scripted: they wait to be told), past the deadline.
    outcome = outcome_when_done(backend, ref, timeout=60)
    assert not outcome.succeeded
    assert outcome.code is OutcomeCode.DEADLINE_EXCEEDED and "(10s)" in outcome.reason


def test_a_queue_with_the_jobs_form_is_refused_before_anything_is_created(kube, kubeconfig):
    """Kueue would admit the two Jobs one by one (half a group); a queued group must be one JobSet."""
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=kube.ns,
                          pod_defaults={"queue_name": "team-a"})
    with pytest.raises(BackendError, match=r"queue_name: 'team-a' needs workload='jobset'"):
        backend.launch(make_spec())
    assert kube.objects("jobs") == [] and kube.calls("create") == []


def test_hostile_dag_id_launches_with_valid_labels_and_the_original_in_annotations(kube, scripted, backend):
    dag_id = "My_Model; rm -rf /"
    name = group_name(dag_id, "train", "manual__2026-01-01")
    ref = backend.launch(make_spec(name=name, labels={"dag_id": dag_id, "run_id": "manual__2026-01-01"}))
    jobs = kube.objects("jobs", f"{GROUP_LABEL}={name}")
    assert len(jobs) == 2
    wait_for(lambda: len(tasks_of(kube, f"{GROUP_LABEL}={name}")) == 3, 30, "the group's three pods")
    for job in jobs:
        assert job["metadata"]["annotations"]["airflow-tf/dag_id"] == dag_id
        assert ";" not in job["metadata"]["labels"]["dag_id"] and " " not in job["metadata"]["labels"]["dag_id"]
    assert backend.teardown(ref)
    wait_for(lambda: kube.gone("pods"), REMOVAL_BOUND, "the group's pods to be gone")


# -- evaluation and export on the cluster ----------------------------------------------------------
REQUEST = {"run_dir": "/runs/tf-mnist", "dataset": "/data/mnist/1", "training": {"steps": 10}}


def test_evaluation_runs_as_a_job_on_the_training_image_and_its_failure_names_the_pod(kube, scripted, kubeconfig,
                                                                                      tmp_path):
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=kube.ns,
                          poll_interval=0.05, pod_defaults={"volumes": [{"claim": "tf-runs", "mount_path": "/runs"}]})
    kube.volume_claim("tf-runs", tmp_path)
    ref = backend.launch(make_spec())
    backend.teardown(ref)  # evaluation runs after the teardown, from what the launch recorded
    jobs, played = [], set()

    def play(outcome):
        # The first evaluation's pod may still be on its way out when the second one's comes.
        name = wait_for(lambda: next((p["metadata"]["name"] for p in kube.objects("pods", "airflow-tf/component=evaluate")
                                      if p["spec"].get("nodeName") and p["metadata"]["name"] not in played
                                      and not p["metadata"].get("deletionTimestamp")), None), 60, "the evaluation pod")
        played.add(name)
        jobs.append(kube.get("jobs", "tf-mnist-evaluate"))  # as created, before it is deleted
        outcome(name)

    runner = threading.Thread(target=play, args=(lambda name: scripted.succeed(
        name, log="evaluated 100 examples\n", message='{"blessed":true,"metrics":{"mse":0.5}}', wait=False),))
    runner.start()
    result = backend_for(ref).run_component(ref, "evaluate", REQUEST, timeout=120)
    runner.join()
    assert result == {"blessed": True, "metrics": {"mse": 0.5}}, "the result is the pod's termination message"
    container = jobs[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == training_image()
    command = original_command(jobs[0])
    assert command[:5] == ["python", "-m", "airflow_tf.serving", "evaluate", "--request"]
    assert json.loads(command[5]) == REQUEST
    assert command[6:] == ["--result-file", "/dev/termination-log"]
    assert (container["terminationMessagePath"], container["terminationMessagePolicy"]) == (
        "/dev/termination-log", "FallbackToLogsOnError")
    assert container["volumeMounts"] == [{"name": "volume-0", "mountPath": "/runs"}]
    assert "TF_CONFIG" not in {e["name"] for e in container.get("env") or []}
    assert jobs[0]["spec"]["backoffLimit"] == 0 and len(kube.calls("create", "jobs")) == 3
    wait_for(lambda: kube.gone("jobs"), 30, "the finished evaluation Job to be deleted")

    # No termination message: the kubelet gives the end of its log instead (FallbackToLogsOnError).
    runner = threading.Thread(target=play, args=(
        lambda name: scripted.fail(name, exit_code=1, log="evaluated 100 examples\n", wait=False),))
    runner.start()
    with pytest.raises(BackendError, match=r"(?s)evaluate Job tf-mnist-evaluate failed \(pod tf-mnist-evaluate-\w+: "
                                           r"exit code 1, phase Failed\).*evaluated 100 examples"):
        backend_for(ref).run_component(ref, "evaluate", REQUEST, timeout=120)
    runner.join()


def test_a_component_that_is_not_evaluate_or_export_is_refused_before_any_job(kube, scripted, backend):
    ref = backend.launch(make_spec())
    with pytest.raises(BackendError, match="group tf-mnist: component 'train' is not one of evaluate, export"):
        backend.run_component(ref, "train", REQUEST)
    assert [j["metadata"]["name"] for j in kube.objects("jobs")] == ["tf-mnist-ps", "tf-mnist-worker"]


# -- RBAC, by the API server's authorizer ----------------------------------------------------------
def test_rbac_role_grants_exactly_what_the_backend_uses(kube, scripted, kubeconfig):
    """A whole life cycle touches every rule of the Role; the authorizer refuses anything else."""
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=kube.ns,
                          network_policy=True, disruption_budget=True)
    ref = backend.launch(make_spec(role_options={"worker": {"resources": {"limits": {"nvidia.com/gpu": 1}},
                                                            "kubernetes": {"schedule_timeout_seconds": 1}}}))
    lost = _pod_stuck_on_a_lost_node(kube, ref.name)
    scripted.running(pod(scripted, "ps", 0))
    _a_ps_cut_off_from_its_group(kube, ref.name)
    wait_for(lambda: backend.status(ref) and moves(kube.get("jobs", f"{ref.name}-ps")) and not moving(
        kube.get("jobs", f"{ref.name}-ps")), 90, "the backend to move the ps Job off the cut-off node")
    time.sleep(1.5)  # past the worker's schedule timeout: status reads the scheduler's events
    assert outcome_when_done(backend, ref)
    wait_for(lambda: backend.status(ref) and kube.get("pods", lost) is None, 30,
             f"the backend to release pod {lost}, stuck on a lost node")
    collect(backend, ref, timeout=15.0, until_done=False)  # long enough to open a watch, on a busy machine too
    backend.logs(ref, "ps", 0)
    backend.teardown(ref)
    used = {(c.api_group, c.resource, c.verb) for c in kube.calls()}
    # The jobsets and workloads rules serve workload="jobset" (test_kubernetes_kueue.py checks them).
    assert used == {grant for grant in _granted() if grant[0] not in ("jobset.x-k8s.io", "kueue.x-k8s.io")}


def _pod_stuck_on_a_lost_node(kube, group: str) -> str:
    """A pod of the group as the taint eviction controller leaves it on a lost node: bound to a
    node no kubelet serves (none will confirm its deletion), marked DisruptionTarget
    (DeletionByTaintManager) and deleted with a grace period, so it stays Terminating until the
    backend releases it (marks it Failed and deletes it at once)."""
    from kubernetes import client

    name = f"{group}-ps-0-lost"
    kube.plane.core.create_namespaced_pod(kube.ns, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {GROUP_LABEL: group, ROLE_LABEL: "ps"}},
        "spec": {"nodeName": "node-lost", "containers": [{"name": "ps", "image": ABSENT_IMAGE, "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"}}}]}})
    # Deleted first: the disruption controller resets the condition of a pod not being deleted.
    kube.plane.core.delete_namespaced_pod(name, kube.ns, body=client.V1DeleteOptions(grace_period_seconds=1))
    kube.plane.core.patch_namespaced_pod_status(name, kube.ns, {"status": {"conditions": [{
        "type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
        "lastTransitionTime": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "message": "Taint manager: deleting due to NoExecute taint"}]}})
    assert kube.get("pods", name)["metadata"].get("deletionTimestamp"), "no kubelet confirms the deletion"
    return name


def _a_ps_cut_off_from_its_group(kube, group: str) -> None:
    """Two pods of the group's ps Job as a cut node's kubelet and another's would report them,
    standing in for a cut network this one-node plane cannot have (tests/nodes cuts one for real):
    both run, bound to nodes no kubelet serves; the one that was Ready turned not Ready 30 s ago (no
    other task answered its question), the other is Ready. The backend suspends the ps Job and
    resumes it without the cut node."""
    now = dt.datetime.now(dt.timezone.utc)

    def stamp(seconds_ago: int) -> str:
        return (now - dt.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")

    for name, node, ready in ((f"{group}-ps-0-cut", "node-cut", False), (f"{group}-ps-0-peer", "node-peer", True)):
        kube.plane.core.create_namespaced_pod(kube.ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {GROUP_LABEL: group, ROLE_LABEL: "ps",
                                                  "batch.kubernetes.io/job-name": f"{group}-ps",
                                                  INDEX_LABEL: "0"}},
            "spec": {"nodeName": node, "containers": [{
                "name": "ps", "image": ABSENT_IMAGE,
                "readinessProbe": {"exec": {"command": ["python", "-c", PEERS_ANSWERED_CHECK]}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                    "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}}]}})
        kube.plane.core.patch_namespaced_pod_status(name, kube.ns, {"status": {
            "phase": "Running",
            "conditions": [{"type": kind, "status": "True" if ready else "False", "lastTransitionTime": stamp(30)}
                           for kind in ("Ready", "ContainersReady")],
            "containerStatuses": [{"name": "ps", "image": ABSENT_IMAGE, "imageID": "", "ready": ready,
                                   "restartCount": 0, "started": True,
                                   "state": {"running": {"startedAt": stamp(60)}}}]}})


def _allowed(kube, verb, resource, group) -> bool:
    """What the API server's authorizer answers for the backend's service account."""
    from kubernetes import client

    review = client.AuthorizationV1Api(kube.plane.api).create_subject_access_review({
        "spec": {"user": kube.user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{kube.ns}"],
                 "resourceAttributes": {"namespace": kube.ns, "verb": verb, "resource": resource, "group": group}}})
    return review.status.allowed


def test_a_call_outside_the_role_is_refused_naming_the_rule_and_role_yaml(kube, scripted, backend):
    ref = backend.launch(make_spec())
    # An administrator's narrower copy of the Role: without "delete" on Jobs.
    role_name = yaml.safe_load(ROLE_FILE.read_text())["metadata"]["name"]
    role = kube.plane.rbac.read_namespaced_role(role_name, kube.ns)
    for rule in role.rules:
        if "jobs" in rule.resources:
            rule.verbs = [v for v in rule.verbs if v != "delete"]
    kube.plane.rbac.replace_namespaced_role(role_name, kube.ns, role)
    wait_for(lambda: not _allowed(kube, "delete", "jobs", "batch"), 10, "the narrower Role to take effect")
    with pytest.raises(BackendError) as refused:
        backend.teardown(ref)
    message = str(refused.value)
    for words in ("delete jobs tf-mnist-worker", f"in namespace {kube.ns}", "HTTP 403",
                  'cannot delete resource "jobs" in API group "batch"', "airflow_tf/rbac/role.yaml"):
        assert words in message, f"{words!r} not in {message!r}"
    assert len(kube.objects("jobs")) == 2, "nothing was deleted"
