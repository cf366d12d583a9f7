"""The Kubernetes backend against a Kubernetes API emulator on loopback.

No cluster runs on the test machines, so the API server is the emulator in
kube_emulator.py; everything on the client side is real: the provider's KubernetesHook and
AsyncKubernetesHook, the kubernetes and kubernetes_asyncio clients, HTTP, watches. Every
request a test makes is checked against the shipped RBAC Role when the test ends."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from pathlib import Path

import pytest
import yaml
from kube_emulator import KubeEmulator

import airflow_tf
from airflow_tf.backends import BackendError, backend_for, get_backend
from airflow_tf.backends.kubernetes_manifests import GROUP_LABEL, render_group
from airflow_tf.cluster import GroupSpec, Phase, TrainingConfig, evaluate, group_name
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


def pod_names(emu, selector=None):
    return [p["metadata"]["name"] for p in emu.objects("pods", NS, selector)]


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
            if until_done and evaluate(status, ref.success_policy).done:
                break
        await driver
        return seen

    return asyncio.run(run())


# -- launch ----------------------------------------------------------------------------------
def test_launch_creates_one_pod_and_one_headless_service_per_task(emulator, backend):
    spec = make_spec(labels={"dag_id": "train_mnist", "task_id": "launch", "run_id": "manual__2026-05-01T00:00:00+00:00",
                             "try_number": "1"})
    ref = backend.launch(spec)

    assert (ref.backend, ref.name, ref.namespace) == ("kubernetes", "tf-mnist", NS)
    expected = {o["metadata"]["name"]: o for o in render_group(spec, NS) if o["kind"] == "Pod"}
    pods = {p["metadata"]["name"]: p for p in emulator.objects("pods", NS)}
    assert sorted(pods) == ["tf-mnist-ps-0", "tf-mnist-worker-0", "tf-mnist-worker-1"]
    assert sorted(s["metadata"]["name"] for s in emulator.objects("services", NS)) == sorted(pods)
    for name, pod in pods.items():
        assert pod["spec"] == expected[name]["spec"]
        labels = pod["metadata"]["labels"]
        assert labels[GROUP_LABEL] == "tf-mnist" and labels["dag_id"] == "train_mnist"
        assert labels["airflow-tf/role"] == name.split("-")[2] and labels["airflow-tf/index"] == name[-1]
        assert labels["run_id"].startswith("manual__2026-05-01T00") and "+" not in labels["run_id"]
        tf_config = json.loads(next(e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"] == "TF_CONFIG"))
        assert tf_config["cluster"] == {"ps": ["tf-mnist-ps-0.ml.svc:2222"],
                                        "worker": ["tf-mnist-worker-0.ml.svc:2222", "tf-mnist-worker-1.ml.svc:2222"]}
        assert tf_config["task"] == {"type": name.split("-")[2], "index": int(name[-1])}
    assert backend.find("tf-mnist") == ref
    assert backend.find("tf-other") is None


def test_retried_launch_reattaches_and_creates_nothing(emulator, backend):
    first = backend.launch(make_spec())
    before = len(emulator.calls("create"))
    again = get_backend("kubernetes", **first.options, namespace=NS).launch(make_spec())
    assert again == first
    assert len(emulator.calls("create")) == before, "a retried launch must not create anything"

    # A launch interrupted half-way is completed, not duplicated.
    emulator.remove("pods", NS, "tf-mnist-worker-1")
    backend.launch(make_spec())
    created = [r.name or "" for r in emulator.calls("create")][before:]
    assert len(created) == 1 and pod_names(emulator).count("tf-mnist-worker-1") == 1


def test_connection_from_airflow_connection_env(emulator, kubeconfig, monkeypatch):
    # The provider's default connection, defined the way Airflow reads it from the environment.
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": kubeconfig, "namespace": "team-a"}}))
    backend = get_backend("kubernetes")
    ref = backend.launch(make_spec())
    assert ref.namespace == "team-a" and len(emulator.objects("pods", "team-a")) == 3
    emulator.run("team-a", "tf-mnist-worker-0")
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
def _unschedulable(emu, pod, seconds_ago):
    emu.unschedulable(NS, pod, "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.", seconds_ago)


SCENARIOS = {
    # name: (what happens to the pods, done, succeeded, words the outcome must contain)
    "pending": (lambda e: None, False, False, ["workers done 0/2"]),
    "running": (lambda e: [e.run(NS, "tf-mnist-ps-0"), e.run(NS, "tf-mnist-worker-0"), e.run(NS, "tf-mnist-worker-1")],
                False, False, ["workers done 0/2"]),
    "one_succeeded": (lambda e: [e.run(NS, "tf-mnist-worker-0"), e.succeed(NS, "tf-mnist-worker-1")],
                      False, False, ["workers done 1/2"]),
    "succeeded": (lambda e: [e.run(NS, "tf-mnist-ps-0"), e.succeed(NS, "tf-mnist-worker-0"),
                             e.succeed(NS, "tf-mnist-worker-1")], True, True, ["all 2 training task(s) succeeded"]),
    "program_error": (lambda e: e.fail(NS, "tf-mnist-worker-1", exit_code=1), True, False,
                      ["tf-mnist-worker-1", "exit code 1", "restart policy ExitCode"]),
    "image_pull": (lambda e: e.waiting(NS, "tf-mnist-worker-0", "ImagePullBackOff",
                                       'Back-off pulling image "registry.example/tf:2.21"'),
                   True, False, ["tf-mnist-worker-0", "ImagePullBackOff", 'pulling image "registry.example/tf:2.21"']),
    "invalid_image": (lambda e: e.waiting(NS, "tf-mnist-ps-0", "InvalidImageName", 'couldn\'t parse image name "Bad:Name"'),
                      True, False, ["tf-mnist-ps-0", "InvalidImageName", "Bad:Name"]),
    "unschedulable_waiting": (lambda e: _unschedulable(e, "tf-mnist-worker-1", 1), False, False, ["workers done 0/2"]),
    "unschedulable_timeout": (lambda e: _unschedulable(e, "tf-mnist-worker-1", 120), True, False,
                              ["tf-mnist-worker-1", "unschedulable for more than 60s",
                               "the scheduler says: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."]),
    "oom": (lambda e: e.oom_kill(NS, "tf-mnist-worker-0"), True, False,
            ["tf-mnist-worker-0", "OOMKilled", "limit 4Gi", "resources.limits.memory"]),
    "evicted": (lambda e: e.evict(NS, "tf-mnist-ps-0", "The node was low on resource: memory."), True, False,
                ["tf-mnist-ps-0", "Evicted: The node was low on resource: memory."]),
    "worker_deleted": (lambda e: e.remove("pods", NS, "tf-mnist-worker-0"), True, False,
                       ["tf-mnist-worker-0", "pod not found: it was deleted outside airflow-tf"]),
    "ps_being_torn_down": (lambda e: [e.succeed(NS, "tf-mnist-worker-0"), e.succeed(NS, "tf-mnist-worker-1"),
                                      e.terminating(NS, "tf-mnist-ps-0")], True, True, ["all 2 training task(s) succeeded"]),
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
    outcome = evaluate(status, ref.success_policy)
    assert (outcome.done, outcome.succeeded) == (done, succeeded), outcome
    for word in words:
        assert word in outcome.reason, f"{word!r} not in {outcome.reason!r}"


@pytest.mark.slow
def test_unschedulable_pod_is_failed_when_its_timeout_passes_during_the_watch(emulator, backend):
    spec = make_spec(role_options={"worker": {"kubernetes": {"schedule_timeout_seconds": 2}}})
    ref = backend.launch(spec)
    _unschedulable(emulator, "tf-mnist-worker-0", 0)
    seen = collect(backend, ref, timeout=6.0)
    outcome = evaluate(seen[-1])
    assert outcome.done and not outcome.succeeded
    assert "the scheduler says: 0/3 nodes are available" in outcome.reason
    assert [s for s in seen if not evaluate(s).done], "the pod was first reported as waiting for a node"
    assert len(emulator.calls("list", "events")) >= 1


def test_restart_policy_recreates_failed_pods_within_the_budget(emulator, backend):
    ref = backend.launch(make_spec(backoff_limit=1))
    old_uid = emulator.get("pods", NS, "tf-mnist-worker-0")["metadata"]["uid"]
    emulator.fail(NS, "tf-mnist-worker-0", exit_code=137)  # killed: ExitCode policy retries
    status = backend.status(ref)
    assert status.task("worker", 0).phase is Phase.RESTARTING and not evaluate(status).done
    new = emulator.get("pods", NS, "tf-mnist-worker-0")
    assert new["metadata"]["uid"] != old_uid and new["status"]["phase"] == "Pending"
    assert new["metadata"]["annotations"]["airflow-tf/restarts"] == "1"
    assert backend.status(ref).task("worker", 0).restarts == 1

    emulator.fail(NS, "tf-mnist-worker-1", exit_code=143)  # the group's budget (1) is spent
    outcome = evaluate(backend.status(ref))
    assert outcome.done and not outcome.succeeded
    assert "tf-mnist-worker-1" in outcome.reason and "restart budget spent (backoff_limit 1" in outcome.reason


def test_watch_restarts_a_parameter_server_and_the_group_goes_on(emulator, backend):
    ref = backend.launch(make_spec())
    steps = [(0.2, lambda: emulator.run(NS, "tf-mnist-ps-0")),
             (0.2, lambda: emulator.fail(NS, "tf-mnist-ps-0", exit_code=1)),  # ps: OnFailure
             (0.4, lambda: emulator.succeed(NS, "tf-mnist-worker-0")),
             (0.2, lambda: emulator.succeed(NS, "tf-mnist-worker-1"))]
    seen = collect(backend, ref, steps, timeout=5.0)
    assert any(s.task("ps", 0).phase is Phase.RESTARTING for s in seen)
    assert evaluate(seen[-1]).succeeded
    assert emulator.get("pods", NS, "tf-mnist-ps-0")["metadata"]["annotations"]["airflow-tf/restarts"] == "1"


# -- watching --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_waiting_uses_a_watch_not_a_poll(emulator, backend):
    ref = backend.launch(make_spec())
    emulator.set_log(NS, "tf-mnist-worker-0", format_progress(50, 200, 900.0, 0.25, 3.0) + "\n")
    start = emulator.calls()[-1].time
    steps = [(0.3, lambda: emulator.run(NS, "tf-mnist-ps-0")),
             (0.3, lambda: emulator.run(NS, "tf-mnist-worker-0")),
             (0.3, lambda: emulator.run(NS, "tf-mnist-worker-1")),
             (1.0, lambda: emulator.succeed(NS, "tf-mnist-worker-1")),
             (1.0, lambda: emulator.succeed(NS, "tf-mnist-worker-0"))]
    seen = collect(backend, ref, steps, timeout=10.0)

    assert evaluate(seen[-1]).succeeded
    assert [evaluate(s).reason for s in seen if "done" in evaluate(s).reason][-1] == "workers done 1/2"
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
    emulator.fail_next("list", 1)  # the API server is restarting
    emulator.fail_next("watch", 2)
    steps = [(0.05, lambda: emulator.succeed(NS, "tf-mnist-worker-0")),
             (1.5, lambda: emulator.succeed(NS, "tf-mnist-worker-1"))]
    seen = collect(backend, ref, steps, timeout=6.0)
    assert [evaluate(s).reason for s in seen][-2:] == ["workers done 1/2", "all 2 training task(s) succeeded"]
    assert len(emulator.calls("watch", "pods", since=start)) == 3, "after two failed watches, the third follows the pods"
    assert len(emulator.calls("list", "pods", since=start)) == 4, \
        "listed at the start (once failed, once again) and once after each failed watch, never polled"


def test_watch_recovers_from_an_expired_resource_version(emulator, backend):
    ref = backend.launch(make_spec())

    def compact_and_finish():
        emulator.succeed(NS, "tf-mnist-worker-0")
        emulator.succeed(NS, "tf-mnist-worker-1")
        emulator.compact()

    async def run():
        seen = []
        async for status in backend.watch(ref, timeout=5.0):
            seen.append(status)
            if len(seen) == 1:  # the watch is about to resume from a version that is gone
                compact_and_finish()
            if evaluate(status).done:
                break
        return seen

    before = len(emulator.calls("list", "pods"))
    assert evaluate(asyncio.run(run())[-1]).succeeded
    assert len(emulator.calls("list", "pods")) == before + 2, "listed at the start and once after the 410"


def test_trigger_fires_with_the_failed_pod_and_its_log(emulator, backend):
    from airflow_tf.triggers.worker_completion import WorkerCompletionTrigger

    ref = backend.launch(make_spec())
    trigger = WorkerCompletionTrigger(ref.to_dict())
    classpath, kwargs = trigger.serialize()
    trigger = WorkerCompletionTrigger(**kwargs)  # as the triggerer rebuilds it
    emulator.run(NS, "tf-mnist-worker-1")
    emulator.set_log(NS, "tf-mnist-worker-1", "Traceback (most recent call last):\nValueError: bad feature 'x3'\n")

    async def run():
        async def crash():
            await asyncio.sleep(0.3)
            emulator.fail(NS, "tf-mnist-worker-1", exit_code=1)

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
    emulator.run(NS, "tf-mnist-worker-0")
    emulator.set_log(NS, "tf-mnist-worker-0", "".join(f"line {i}\n" for i in range(10)))
    assert backend.logs(ref, "worker", 0, tail_lines=2) == "line 8\nline 9\n"
    assert backend.logs(ref, "worker", 0).count("\n") == 10


def test_teardown_of_ps_leaves_finished_workers_then_all_leaves_nothing(emulator, kubeconfig):
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=NS,
                          network_policy=True)
    ref = backend.launch(make_spec())
    other = backend.launch(make_spec(name="tf-other"))
    assert len(emulator.objects("networkpolicies", NS)) == 2
    emulator.succeed(NS, "tf-mnist-worker-0")
    emulator.succeed(NS, "tf-mnist-worker-1")

    deleted = backend_for(ref).teardown(ref, roles=["ps"])
    assert sorted(deleted) == ["pod/tf-mnist-ps-0", "service/tf-mnist-ps-0"]
    assert pod_names(emulator, f"{GROUP_LABEL}=tf-mnist") == ["tf-mnist-worker-0", "tf-mnist-worker-1"]
    assert evaluate(backend.status(ref)).succeeded, "finished workers still count after the ps are gone"

    emulator.remove("services", NS, "tf-mnist-worker-1")  # already gone: tolerated
    deleted = backend_for(ref).teardown(ref)
    assert sorted(deleted) == ["networkpolicy/tf-mnist-grpc", "pod/tf-mnist-worker-0", "pod/tf-mnist-worker-1",
                               "service/tf-mnist-worker-0"]
    for kind in ("pods", "services", "networkpolicies"):
        assert emulator.objects(kind, NS, f"{GROUP_LABEL}=tf-mnist") == []
        assert len(emulator.objects(kind, NS, f"{GROUP_LABEL}=tf-other")) == (1 if kind == "networkpolicies" else 3)
    assert backend.teardown(ref) == [], "a second teardown finds nothing and does not fail"
    assert not backend.status(ref).exists
    assert backend.status(other).exists


def test_hostile_dag_id_launches_with_valid_labels_and_the_original_in_annotations(emulator, backend):
    dag_id = "My_Model; rm -rf /"
    name = group_name(dag_id, "train", "manual__2026-01-01")
    ref = backend.launch(make_spec(name=name, labels={"dag_id": dag_id, "run_id": "manual__2026-01-01"}))
    pods = emulator.objects("pods", NS, f"{GROUP_LABEL}={name}")
    assert len(pods) == 3
    for pod in pods:
        assert pod["metadata"]["annotations"]["airflow-tf/dag_id"] == dag_id
        assert ";" not in pod["metadata"]["labels"]["dag_id"] and " " not in pod["metadata"]["labels"]["dag_id"]
    assert backend.teardown(ref) and emulator.objects("pods", NS) == []


@pytest.mark.slow
def test_group_deadline_fails_the_group_and_reaches_the_pods(emulator, backend):
    ref = backend.launch(make_spec(active_deadline_seconds=3))
    pod = emulator.get("pods", NS, "tf-mnist-ps-0")
    assert pod["spec"]["activeDeadlineSeconds"] == 3, "the cluster stops the pods even if Airflow is gone"
    emulator.run(NS, "tf-mnist-worker-0")
    assert not evaluate(backend.status(ref)).done
    deadline = dt.datetime.fromisoformat(pod["metadata"]["annotations"]["airflow-tf/deadline"])
    time.sleep(max(0.0, (deadline - dt.datetime.now(dt.timezone.utc)).total_seconds()) + 0.1)
    outcome = evaluate(backend.status(ref))
    assert outcome.done and not outcome.succeeded
    assert "passed its active_deadline_seconds" in outcome.reason


def test_rbac_role_grants_exactly_what_the_backend_uses(emulator, kubeconfig):
    """A whole life cycle touches every rule of the Role, and nothing outside it (the
    fixture checks the second half for every test)."""
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=kubeconfig, namespace=NS,
                          network_policy=True)
    ref = backend.launch(make_spec(role_options={"worker": {"kubernetes": {"schedule_timeout_seconds": 1}}}))
    emulator.run(NS, "tf-mnist-worker-0")
    emulator.fail(NS, "tf-mnist-ps-0", exit_code=137)
    _unschedulable(emulator, "tf-mnist-worker-1", 5)
    assert evaluate(backend.status(ref)).done  # restarts the ps, reads events, reads worker 0's log
    collect(backend, ref, timeout=2.0, until_done=False)
    backend.logs(ref, "worker", 0)
    backend.teardown(ref)
    used = {(r.api_group, r.resource, r.verb) for r in emulator.requests}
    assert used == _granted()
