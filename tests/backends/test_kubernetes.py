"""The Kubernetes backend against a Kubernetes API emulator on loopback.

No cluster runs on the test machines, so the API server is the emulator in
kube_emulator.py, with the Job controller and garbage collector the backend relies on;
everything on the client side is real: the provider's KubernetesHook and
AsyncKubernetesHook, the kubernetes and kubernetes_asyncio clients, HTTP, watches. Every
request a test makes is checked against the shipped RBAC Role when the test ends, and no
test sees the backend create or delete a pod: pods are the Job controller's."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import yaml
from kube_emulator import KubeEmulator

import airflow_tf
from airflow_tf.backends import BackendError, backend_for, get_backend
from airflow_tf.backends.kubernetes_manifests import GROUP_LABEL, ROLE_LABEL, render_group
from airflow_tf.cluster import GroupSpec, Phase, TrainingConfig, group_outcome, group_name
from airflow_tf.cluster.progress import format_progress

NS = "ml"
ROLE = Path(airflow_tf.__file__).parent / "rbac" / "role.yaml"


def _granted() -> set[tuple[str, str, str]]:
    role = yaml.safe_load(ROLE.read_text())
    assert role["kind"] == "Role"
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


@pytest.fixture
def emulator():
    emu = KubeEmulator().start()
    yield emu
    emu.stop()
    granted = _granted()
    used = {(r.api_group, r.resource, r.verb) for r in emu.requests}
    assert used <= granted, f"requests not granted by {ROLE.name}: {sorted(used - granted)}"
    assert not [r for r in emu.requests if r.resource == "pods" and r.verb in ("create", "delete")], \
        "pods are made, restarted and removed by the Job controller, never by the backend"


@pytest.fixture
def kubeconfig(emulator, tmp_path) -> str:
    return str(emulator.write_kubeconfig(tmp_path / "kubeconfig"))


@pytest.fixture
def backend(kubeconfig):
    return get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=NS)


def make_spec(name: str = "tf-mnist", workers: int = 2, **options) -> GroupSpec:
    training = TrainingConfig(dataset="/data/mnist/1", run_dir=f"/runs/{name}", steps=200)
    options.setdefault("image", "registry.example/tf:2.21")
    return GroupSpec.for_training(name, training, ps=1, workers=workers, **options)


def pod(emu, role, index, group="tf-mnist"):
    """The current pod of a task (the Job controller names pods <job>-<index>-<random>)."""
    return emu.pod(NS, f"{group}-{role}", index)


def tasks_of(emu, selector=f"{GROUP_LABEL}=tf-mnist"):
    """(role, index) of every pod, as the Job controller labelled them."""
    return sorted((p["metadata"]["labels"][ROLE_LABEL], int(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]))
                  for p in emu.objects("pods", NS, selector))


def collect(backend, ref, steps=(), timeout=5.0, until_done=True):
    """Statuses yielded by watch() while ``steps`` (delay, action) change the pods."""

    async def run():
        async def drive():
            for delay, action in steps:
                await asyncio.sleep(delay)
                action()

        driver = asyncio.create_task(drive())
        seen = []
        async for status in backend.watch(ref, timeout=timeout):
            seen.append(status)
            if until_done and group_outcome(status, ref.success_policy).done:
                break
        await driver
        return seen

    return asyncio.run(run())


# -- launch ----------------------------------------------------------------------------------
def test_launch_creates_one_indexed_job_per_role_owned_by_the_root(emulator, backend):
    spec = make_spec(labels={"dag_id": "train_mnist", "task_id": "launch", "run_id": "manual__2026-05-01T00:00:00+00:00",
                             "try_number": "1"})
    ref = backend.launch(spec)

    assert (ref.backend, ref.name, ref.namespace) == ("kubernetes", "tf-mnist", NS)
    expected = {o["metadata"]["name"]: o for o in render_group(spec, NS)}
    jobs = {j["metadata"]["name"]: j for j in emulator.objects("jobs", NS)}
    assert sorted(jobs) == ["tf-mnist-ps", "tf-mnist-worker"]
    root = jobs["tf-mnist-worker"]
    for name, job in jobs.items():
        assert job["spec"] == expected[name]["spec"], "exactly what airflow-tf render prints"
        assert job["spec"]["completionMode"] == "Indexed"
        labels = job["metadata"]["labels"]
        assert labels[GROUP_LABEL] == "tf-mnist" and labels["dag_id"] == "train_mnist"
        assert labels["run_id"].startswith("manual__2026-05-01T00") and "+" not in labels["run_id"]
    assert "ownerReferences" not in root["metadata"]
    service, = emulator.objects("services", NS)
    for owned in (jobs["tf-mnist-ps"], service):
        assert owned["metadata"]["ownerReferences"][0]["uid"] == root["metadata"]["uid"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True

    # The Job controller made the pods: hostname <job>-<index> under the Service, the index in the env.
    assert tasks_of(emulator) == [("ps", 0), ("worker", 0), ("worker", 1)]
    worker1 = emulator.get("pods", NS, pod(emulator, "worker", 1))
    assert (worker1["spec"]["hostname"], worker1["spec"]["subdomain"]) == ("tf-mnist-worker-1", "tf-mnist")
    env = {e["name"]: e["value"] for e in worker1["spec"]["containers"][0]["env"]}
    assert env["JOB_COMPLETION_INDEX"] == "1"
    tf_config = json.loads(env["TF_CONFIG"])
    assert tf_config["cluster"] == {"ps": ["tf-mnist-ps-0.tf-mnist.ml.svc:2222"],
                                    "worker": ["tf-mnist-worker-0.tf-mnist.ml.svc:2222",
                                               "tf-mnist-worker-1.tf-mnist.ml.svc:2222"]}
    assert tf_config["task"] == {"type": "worker"}
    from airflow_tf.runtime.task import task_from_env

    assert task_from_env(dict(env)).index == 1, "the runtime takes its index from JOB_COMPLETION_INDEX"
    assert backend.find("tf-mnist") == ref
    assert backend.find("tf-other") is None


def test_retried_launch_reattaches_and_creates_nothing(emulator, backend):
    first = backend.launch(make_spec())
    before = len(emulator.calls("create"))
    again = get_backend("kubernetes", **first.options, namespace=NS).launch(make_spec())
    assert again == first
    assert len(emulator.calls("create")) == before, "a retried launch must not create anything"

    # A launch interrupted half-way is completed, not duplicated, and owned by the same root.
    emulator.remove("jobs", NS, "tf-mnist-ps")
    backend.launch(make_spec())
    created = [r.name or "" for r in emulator.calls("create")][before:]
    assert len(created) == 1 and tasks_of(emulator).count(("ps", 0)) == 1


def test_connection_from_airflow_connection_env(emulator, kubeconfig, monkeypatch):
    # The provider's default connection, defined the way Airflow reads it from the environment.
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": kubeconfig, "namespace": "team-a"}}))
    backend = get_backend("kubernetes")
    ref = backend.launch(make_spec())
    assert ref.namespace == "team-a" and len(emulator.objects("jobs", "team-a")) == 2
    emulator.run("team-a", emulator.pod("team-a", "tf-mnist-worker", 0))
    seen = collect(backend_for(ref), ref, timeout=1.0, until_done=False)  # the async hook, same connection
    assert seen[0].task("worker", 0).phase is Phase.RUNNING


def test_unreachable_api_server_is_a_clear_error(tmp_path):
    dead = KubeEmulator()  # bound, never started or served: connections are refused
    config = dead.write_kubeconfig(tmp_path / "kubeconfig")
    dead.stop()
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=str(config), namespace=NS)
    with pytest.raises(BackendError, match=r"cannot reach the Kubernetes API at http://127\.0\.0\.1:\d+"):
        backend.launch(make_spec())


# -- status --------------------------------------------------------------------------------------
def _unschedulable(emu, name, seconds_ago):
    emu.unschedulable(NS, name, "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.", seconds_ago)


SCENARIOS = {
    # name: (what happens to the pods, done, succeeded, words the outcome must contain)
    "pending": (lambda e: None, False, False, ["workers done 0/2"]),
    "running": (lambda e: [e.run(NS, pod(e, "ps", 0)), e.run(NS, pod(e, "worker", 0)), e.run(NS, pod(e, "worker", 1))],
                False, False, ["workers done 0/2"]),
    "one_succeeded": (lambda e: [e.run(NS, pod(e, "worker", 0)), e.succeed(NS, pod(e, "worker", 1))],
                      False, False, ["workers done 1/2"]),
    "succeeded": (lambda e: [e.run(NS, pod(e, "ps", 0)), e.succeed(NS, pod(e, "worker", 0)),
                             e.succeed(NS, pod(e, "worker", 1))], True, True, ["all 2 training task(s) succeeded"]),
    "program_error": (lambda e: e.fail(NS, pod(e, "worker", 1), exit_code=2), True, False,
                      ["tf-mnist-worker-1", "exit code 2", "a program error, not retried (podFailurePolicy)",
                       "Container worker for pod ml/tf-mnist-worker-1-"]),
    "image_pull": (lambda e: e.waiting(NS, pod(e, "worker", 0), "ImagePullBackOff",
                                       'Back-off pulling image "registry.example/tf:2.21"'),
                   True, False, ["pod tf-mnist-worker-0-", "ImagePullBackOff", 'pulling image "registry.example/tf:2.21"']),
    "invalid_image": (lambda e: e.waiting(NS, pod(e, "ps", 0), "InvalidImageName", 'couldn\'t parse image name "Bad:Name"'),
                      True, False, ["pod tf-mnist-ps-0-", "InvalidImageName", "Bad:Name"]),
    "unschedulable_waiting": (lambda e: _unschedulable(e, pod(e, "worker", 1), 1), False, False, ["workers done 0/2"]),
    "unschedulable_timeout": (lambda e: _unschedulable(e, pod(e, "worker", 1), 120), True, False,
                              ["pod tf-mnist-worker-1-", "unschedulable for more than 60s",
                               "the scheduler says: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."]),
    "oom": (lambda e: e.oom_kill(NS, pod(e, "worker", 0)), True, False,
            ["pod tf-mnist-worker-0-", "OOMKilled", "limit 4Gi", "resources.limits.memory"]),
    "evicted_is_replaced": (lambda e: e.evict(NS, pod(e, "ps", 0), "The node was low on resource: memory."),
                            False, False, ["workers done 0/2"]),
    "worker_job_deleted": (lambda e: e.remove("jobs", NS, "tf-mnist-ps", propagation="Orphan") or
                           e.remove("jobs", NS, "tf-mnist-worker", propagation="Orphan"),
                           True, False, ["does not exist"]),
    "ps_job_deleted_outside": (lambda e: [e.remove("jobs", NS, "tf-mnist-ps"), e.succeed(NS, pod(e, "worker", 0)),
                                          e.succeed(NS, pod(e, "worker", 1))], True, True,
                               ["all 2 training task(s) succeeded"]),
    "ps_being_torn_down": (lambda e: [e.succeed(NS, pod(e, "worker", 0)), e.succeed(NS, pod(e, "worker", 1)),
                                      e.terminating(NS, pod(e, "ps", 0))], True, True, ["all 2 training task(s) succeeded"]),
}


def _scenario_spec():
    return make_spec(role_options={"worker": {"resources": {"limits": {"memory": "4Gi"}},
                                              "kubernetes": {"schedule_timeout_seconds": 60}}})


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("path", ["status", "watch"])
def test_pod_states_give_the_right_outcome(emulator, backend, scenario, path):
    act, done, succeeded, words = SCENARIOS[scenario]
    ref = backend.launch(_scenario_spec())
    act(emulator)
    status = backend.status(ref) if path == "status" else collect(backend, ref, timeout=0.5, until_done=False)[-1]
    outcome = group_outcome(status, ref.success_policy)
    assert (outcome.done, outcome.succeeded) == (done, succeeded), outcome
    for word in words:
        assert word in outcome.reason, f"{word!r} not in {outcome.reason!r}"


@pytest.mark.slow
def test_unschedulable_pod_is_failed_when_its_timeout_passes_during_the_watch(emulator, backend):
    spec = make_spec(role_options={"worker": {"kubernetes": {"schedule_timeout_seconds": 2}}})
    ref = backend.launch(spec)
    _unschedulable(emulator, pod(emulator, "worker", 0), 0)
    seen = collect(backend, ref, timeout=6.0)
    outcome = group_outcome(seen[-1])
    assert outcome.done and not outcome.succeeded
    assert "the scheduler says: 0/3 nodes are available" in outcome.reason
    assert [s for s in seen if not group_outcome(s).done], "the pod was first reported as waiting for a node"
    assert len(emulator.calls("list", "events")) >= 1


def test_a_retryable_failure_is_restarted_by_kubernetes_not_by_the_backend(emulator, backend):
    ref = backend.launch(make_spec(backoff_limit=1))
    first = pod(emulator, "worker", 0)
    emulator.run(NS, first)
    creates = len(emulator.calls("create"))
    emulator.fail(NS, first, exit_code=137)  # killed by a signal: the ExitCode policy retries

    # The Job controller replaced the pod already; status() only reads.
    second = pod(emulator, "worker", 0)
    assert second != first and emulator.get("pods", NS, second)["status"]["phase"] == "Pending"
    assert emulator.created_by_controller.count(second) == 1
    status = backend.status(ref)
    assert status.task("worker", 0).phase is Phase.PENDING and status.task("worker", 0).restarts == 1
    assert not group_outcome(status).done
    assert len(emulator.calls("create")) == creates, "the backend created nothing after the launch"
    assert {r.verb for r in emulator.calls() if r.resource in ("pods", "jobs") and r.verb not in ("list", "watch")} \
        <= {"create"} and not emulator.calls("delete")

    # The budget is per task (backoffLimitPerIndex): worker 0 has spent its one restart.
    emulator.fail(NS, second, exit_code=143)
    outcome = group_outcome(backend.status(ref))
    assert outcome.done and not outcome.succeeded
    assert "tf-mnist-worker-0" in outcome.reason and "MaxFailedIndexesExceeded" in outcome.reason


def test_a_user_error_fails_the_group_at_once_with_its_reason(emulator, backend):
    ref = backend.launch(make_spec(backoff_limit=5))
    emulator.run(NS, pod(emulator, "worker", 0))
    failing = pod(emulator, "worker", 1)
    log_text = "Traceback (most recent call last):\n  ...\nmodel refused: expected a Keras model\n"
    emulator.set_log(NS, failing, log_text)
    emulator.fail(NS, failing, exit_code=2)  # the runtime's CONFIG_ERROR: no restart would help
    outcome = group_outcome(backend.status(ref))
    assert outcome.done and not outcome.succeeded
    assert outcome.failed_task.name == "tf-mnist-worker-1"
    assert "exit code 2" in outcome.reason and "podFailurePolicy" in outcome.reason
    # The cause, carried by the pod's status (terminationMessagePolicy), not a traceback frame.
    assert "last log line: model refused: expected a Keras model" in outcome.reason
    worker_job = emulator.get("jobs", NS, "tf-mnist-worker")
    assert worker_job["status"]["conditions"][-1]["reason"] == "PodFailurePolicy"
    assert [p for p in emulator.objects("pods", NS, f"{ROLE_LABEL}=worker") if p["status"]["phase"] == "Running"] == [], \
        "Kubernetes stopped the other worker"
    assert backend.logs(ref, "worker", 1) == log_text


def test_watch_sees_a_parameter_server_replaced_after_eviction_and_the_group_goes_on(emulator, backend):
    ref = backend.launch(make_spec(backoff_limit=0))
    steps = [(0.2, lambda: emulator.run(NS, pod(emulator, "ps", 0))),
             (0.2, lambda: emulator.evict(NS, pod(emulator, "ps", 0), "preempted by a higher priority pod")),
             (0.4, lambda: emulator.succeed(NS, pod(emulator, "worker", 0))),
             (0.2, lambda: emulator.succeed(NS, pod(emulator, "worker", 1)))]
    seen = collect(backend, ref, steps, timeout=5.0)
    assert group_outcome(seen[-1]).succeeded, "a disruption does not count against backoffLimitPerIndex 0"
    assert seen[-1].task("ps", 0).restarts == 1


# -- watching --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_waiting_uses_a_watch_not_a_poll(emulator, backend):
    ref = backend.launch(make_spec())
    emulator.set_log(NS, pod(emulator, "worker", 0), format_progress(50, 200, 900.0, 0.25, 3.0) + "\n")
    start = emulator.calls()[-1].time
    steps = [(0.3, lambda: emulator.run(NS, pod(emulator, "ps", 0))),
             (0.3, lambda: emulator.run(NS, pod(emulator, "worker", 0))),
             (0.3, lambda: emulator.run(NS, pod(emulator, "worker", 1))),
             (1.0, lambda: emulator.succeed(NS, pod(emulator, "worker", 1))),
             (1.0, lambda: emulator.succeed(NS, pod(emulator, "worker", 0)))]
    seen = collect(backend, ref, steps, timeout=10.0)

    assert group_outcome(seen[-1]).succeeded
    assert [group_outcome(s).reason for s in seen if "done" in group_outcome(s).reason][-1] == "workers done 1/2"
    assert any(s.progress and s.progress["global_step"] == 50 for s in seen), "progress from worker 0's log"
    watches = emulator.calls("watch", "pods", since=start)
    lists = emulator.calls("list", "pods", since=start)
    assert len(watches) == 1, "one watch request follows all five changes"
    assert watches[0].query.get("resourceVersion"), "the watch resumes from the listed resource version"
    assert len(lists) == 1, "the pods are listed once, then watched"
    assert len(emulator.calls("get", "pods/log", since=start)) <= 2


def test_watch_falls_back_to_listing_when_the_watch_fails(emulator, kubeconfig):
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=NS,
                          poll_interval=0.2)
    ref = backend.launch(make_spec())
    start = emulator.calls()[-1].time
    emulator.fail_next("watch", 2)  # the API server is restarting
    steps = [(0.05, lambda: emulator.succeed(NS, pod(emulator, "worker", 0))),
             (1.5, lambda: emulator.succeed(NS, pod(emulator, "worker", 1)))]
    seen = collect(backend, ref, steps, timeout=6.0)
    assert [group_outcome(s).reason for s in seen][-2:] == ["workers done 1/2", "all 2 training task(s) succeeded"]
    assert len(emulator.calls("watch", "pods", since=start)) == 3, "after two failed watches, the third follows the pods"
    assert len(emulator.calls("list", "pods", since=start)) == 3, \
        "listed at the start and once after each failed watch, never polled"


def test_watch_recovers_from_an_expired_resource_version(emulator, backend):
    ref = backend.launch(make_spec())

    def compact_and_finish():
        emulator.succeed(NS, pod(emulator, "worker", 0))
        emulator.succeed(NS, pod(emulator, "worker", 1))
        emulator.compact()

    async def run():
        seen = []
        async for status in backend.watch(ref, timeout=5.0):
            seen.append(status)
            if len(seen) == 1:  # the watch is about to resume from a version that is gone
                compact_and_finish()
            if group_outcome(status).done:
                break
        return seen

    before = len(emulator.calls("list", "pods"))
    assert group_outcome(asyncio.run(run())[-1]).succeeded
    assert len(emulator.calls("list", "pods")) == before + 2, "listed at the start and once after the 410"


def test_trigger_fires_with_the_failed_pod_and_its_log(emulator, backend):
    from airflow_tf.triggers.worker_completion import WorkerCompletionTrigger

    ref = backend.launch(make_spec())
    trigger = WorkerCompletionTrigger(ref.to_dict())
    classpath, kwargs = trigger.serialize()
    trigger = WorkerCompletionTrigger(**kwargs)  # as the triggerer rebuilds it
    failing = pod(emulator, "worker", 1)
    emulator.run(NS, failing)
    emulator.set_log(NS, failing, "Traceback (most recent call last):\nValueError: bad feature 'x3'\n")

    async def run():
        async def crash():
            await asyncio.sleep(0.3)
            emulator.fail(NS, failing, exit_code=1)

        crashing = asyncio.create_task(crash())
        event = await asyncio.wait_for(trigger.run().__anext__(), timeout=10)
        await crashing
        return event

    payload = asyncio.run(run()).payload
    assert payload["status"] == "failed"
    assert payload["failed_task"]["name"] == "tf-mnist-worker-1"
    assert "exit code 1" in payload["reason"] and "bad feature 'x3'" in payload["log_tail"]


# -- logs and teardown -----------------------------------------------------------------------
def test_logs_return_the_tail_and_nothing_before_the_container_starts(emulator, backend):
    ref = backend.launch(make_spec())
    assert backend.logs(ref, "worker", 0) == ""
    emulator.run(NS, pod(emulator, "worker", 0))
    emulator.set_log(NS, pod(emulator, "worker", 0), "".join(f"line {i}\n" for i in range(10)))
    assert backend.logs(ref, "worker", 0, tail_lines=2) == "line 8\nline 9\n"
    assert backend.logs(ref, "worker", 0).count("\n") == 10


def test_teardown_of_ps_leaves_finished_workers_then_all_leaves_nothing(emulator, kubeconfig):
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=NS,
                          network_policy=True)
    ref = backend.launch(make_spec())
    other = backend.launch(make_spec(name="tf-other"))
    assert len(emulator.objects("networkpolicies", NS)) == 2
    emulator.succeed(NS, pod(emulator, "worker", 0))
    emulator.succeed(NS, pod(emulator, "worker", 1))

    deleted = backend_for(ref).teardown(ref, roles=["ps"])
    assert deleted == ["job/tf-mnist-ps"]
    assert tasks_of(emulator) == [("worker", 0), ("worker", 1)], "the ps pod went with its Job"
    assert group_outcome(backend.status(ref)).succeeded, "finished workers still count after the ps are gone"

    deleted = backend_for(ref).teardown(ref)
    assert deleted[0] == "job/tf-mnist-worker", "the root first"
    for kind in ("jobs", "pods", "services", "networkpolicies"):
        assert emulator.objects(kind, NS, f"{GROUP_LABEL}=tf-mnist") == []
        assert emulator.objects(kind, NS, f"{GROUP_LABEL}=tf-other")
    assert backend.teardown(ref) == [], "a second teardown finds nothing and does not fail"
    assert not backend.status(ref).exists
    assert backend.status(other).exists


def test_deleting_the_root_removes_every_object_of_the_group(emulator, kubeconfig):
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=NS,
                          network_policy=True)
    backend.launch(make_spec(chief=1))
    root = emulator.get("jobs", NS, "tf-mnist-chief")
    assert root["metadata"]["annotations"]["airflow-tf/root"] == "true"
    assert len(emulator.objects("pods", NS)) == 4
    emulator.remove("jobs", NS, "tf-mnist-chief")  # kubectl delete job tf-mnist-chief
    for kind in ("jobs", "pods", "services", "networkpolicies"):
        assert emulator.objects(kind, NS) == [], f"{kind} left after the root was deleted"


def test_a_group_whose_airflow_vanished_is_removed_by_kubernetes_after_its_ttl(emulator, kubeconfig):
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=NS,
                          ttl_seconds_after_finished=600)
    backend.launch(make_spec())
    emulator.run(NS, pod(emulator, "ps", 0))
    emulator.succeed(NS, pod(emulator, "worker", 0))
    emulator.succeed(NS, pod(emulator, "worker", 1))
    # No teardown ever comes. The parameter server runs on until the root's TTL passes.
    assert emulator.get("jobs", NS, "tf-mnist-worker")["status"]["conditions"][-1]["type"] == "Complete"
    emulator.advance(599)
    assert tasks_of(emulator) == [("ps", 0), ("worker", 0), ("worker", 1)]
    emulator.advance(2)
    for kind in ("jobs", "pods", "services"):
        assert emulator.objects(kind, NS) == [], f"{kind} left after the TTL"


def test_parameter_servers_of_workers_that_never_finish_are_bounded_by_their_deadline(emulator, kubeconfig):
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=NS,
                          ps_max_lifetime_seconds=3600)
    ref = backend.launch(make_spec())
    emulator.run(NS, pod(emulator, "ps", 0))
    emulator.run(NS, pod(emulator, "worker", 0))  # hangs forever; Airflow is gone
    assert emulator.get("jobs", NS, "tf-mnist-ps")["spec"]["activeDeadlineSeconds"] == 3600
    emulator.advance(3601)
    assert tasks_of(emulator, f"{ROLE_LABEL}=ps") == [], "the ps pod was stopped at its deadline"
    assert "DeadlineExceeded" in group_outcome(backend.status(ref)).reason


def test_group_deadline_fails_the_group(emulator, backend):
    ref = backend.launch(make_spec(active_deadline_seconds=30))
    assert {j["spec"]["activeDeadlineSeconds"] for j in emulator.objects("jobs", NS)} == {30}
    emulator.run(NS, pod(emulator, "worker", 0))
    assert not group_outcome(backend.status(ref)).done
    emulator.advance(31)
    outcome = group_outcome(backend.status(ref))
    assert outcome.done and not outcome.succeeded
    assert "DeadlineExceeded" in outcome.reason and "(30s)" in outcome.reason


def test_jobs_of_a_queue_are_created_suspended_until_kueue_admits_them(emulator, kubeconfig):
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=NS,
                          pod_defaults={"queue_name": "team-a"})
    ref = backend.launch(make_spec())
    for job in emulator.objects("jobs", NS):
        assert job["spec"]["suspend"] is True and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert emulator.objects("pods", NS) == []
    status = backend.status(ref)
    assert "waiting for the queue team-a" in status.task("worker", 0).reason and not group_outcome(status).done
    emulator.admit(NS, "tf-mnist-worker")
    emulator.admit(NS, "tf-mnist-ps")
    assert tasks_of(emulator) == [("ps", 0), ("worker", 0), ("worker", 1)]


def test_hostile_dag_id_launches_with_valid_labels_and_the_original_in_annotations(emulator, backend):
    dag_id = "My_Model; rm -rf /"
    name = group_name(dag_id, "train", "manual__2026-01-01")
    ref = backend.launch(make_spec(name=name, labels={"dag_id": dag_id, "run_id": "manual__2026-01-01"}))
    jobs = emulator.objects("jobs", NS, f"{GROUP_LABEL}={name}")
    assert len(jobs) == 2 and len(emulator.objects("pods", NS)) == 3
    for job in jobs:
        assert job["metadata"]["annotations"]["airflow-tf/dag_id"] == dag_id
        assert ";" not in job["metadata"]["labels"]["dag_id"] and " " not in job["metadata"]["labels"]["dag_id"]
    assert backend.teardown(ref) and emulator.objects("pods", NS) == []


# -- evaluation and export on the cluster ----------------------------------------------------------
REQUEST = {"run_dir": "/runs/tf-mnist", "dataset": "/data/mnist/1", "training": {"steps": 10}}


def test_evaluation_runs_as_a_job_on_the_training_image_and_its_failure_names_the_pod(emulator, kubeconfig):
    import threading

    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=NS,
                          poll_interval=0.05, pod_defaults={"volumes": [{"claim": "tf-runs", "mount_path": "/runs"}]})
    ref = backend.launch(make_spec())
    backend.teardown(ref)  # evaluation runs after the teardown, from what the launch recorded

    def kubelet(outcome):
        while not emulator.objects("pods", NS, "airflow-tf/component=evaluate"):
            time.sleep(0.02)
        name = emulator.objects("pods", NS, "airflow-tf/component=evaluate")[0]["metadata"]["name"]
        emulator.set_log(NS, name, "evaluated 100 examples\n")
        outcome(NS, name)

    runner = threading.Thread(target=kubelet, args=(
        lambda ns, name: emulator.succeed(ns, name, termination_message='{"blessed":true,"metrics":{"mse":0.5}}'),))
    runner.start()
    result = backend_for(ref).run_component(ref, "evaluate", REQUEST)
    runner.join()
    assert result == {"blessed": True, "metrics": {"mse": 0.5}}, "the result is the pod's termination message"
    created = [r for r in emulator.calls("create", "jobs") if r.name is None]
    job_body = emulator._history  # the Job as it was created
    job = next(o for _, resource, kind, o in job_body if resource == "jobs" and kind == "ADDED"
               and o["metadata"]["name"] == "tf-mnist-evaluate")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/tf:2.21"
    assert container["command"][:5] == ["python", "-m", "airflow_tf.serving", "evaluate", "--request"]
    assert json.loads(container["command"][5]) == REQUEST
    assert container["command"][6:] == ["--result-file", "/dev/termination-log"]
    assert (container["terminationMessagePath"], container["terminationMessagePolicy"]) == (
        "/dev/termination-log", "FallbackToLogsOnError")
    assert container["volumeMounts"] == [{"name": "volume-0", "mountPath": "/runs", "readOnly": False}]
    assert "TF_CONFIG" not in {e["name"] for e in container["env"]}
    assert job["spec"]["backoffLimit"] == 0 and len(created) >= 3
    assert emulator.objects("jobs", NS) == [], "a finished evaluation Job is deleted"

    runner = threading.Thread(target=kubelet, args=(lambda ns, name: emulator.fail(ns, name, exit_code=1),))
    runner.start()
    with pytest.raises(BackendError, match=r"(?s)evaluate Job tf-mnist-evaluate failed \(pod tf-mnist-evaluate-0-\w+: "
                                           r"exit code 1, phase Failed\).*evaluated 100 examples"):
        backend_for(ref).run_component(ref, "evaluate", REQUEST)
    runner.join()


def test_a_component_that_is_not_evaluate_or_export_is_refused_before_any_job(emulator, backend):
    ref = backend.launch(make_spec())
    with pytest.raises(BackendError, match="group tf-mnist: component 'train' is not one of evaluate, export"):
        backend.run_component(ref, "train", REQUEST)
    assert [j["metadata"]["name"] for j in emulator.objects("jobs", NS)] == ["tf-mnist-ps", "tf-mnist-worker"]


def test_rbac_role_grants_exactly_what_the_backend_uses(emulator, kubeconfig):
    """A whole life cycle touches every rule of the Role, and nothing outside it (the
    fixture checks the second half for every test)."""
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=NS,
                          network_policy=True)
    ref = backend.launch(make_spec(role_options={"worker": {"kubernetes": {"schedule_timeout_seconds": 1}}}))
    emulator.run(NS, pod(emulator, "worker", 0))
    _unschedulable(emulator, pod(emulator, "worker", 1), 5)
    assert group_outcome(backend.status(ref)).done  # reads events and worker 0's log
    collect(backend, ref, timeout=2.0, until_done=False)
    backend.logs(ref, "worker", 0)
    backend.teardown(ref)
    used = {(r.api_group, r.resource, r.verb) for r in emulator.requests}
    assert used == _granted()
