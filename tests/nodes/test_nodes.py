"""The example DAG ``tf_linear_regression`` on Kubernetes with real nodes (the package's plane,
``nodes_plane``: ``scripts/kube up --nodes 3``, each node a kubelet v1.37, containerd v2.4 and
runc), the DAG's backend the deployment's (``AIRFLOW_TF_BACKEND=kubernetes``), run by real
Airflow. Prepare runs in Airflow; the ps and workers, the evaluation and the export run as Jobs
whose pods, from the training image as uid 1000 in a namespace enforcing Pod Security
``restricted``, talk gRPC to each other by the names TF_CONFIG gives, resolved by the cluster DNS;
the storage folder is a hostPath volume both sides share at one path. Also what the kubelet does
with probes, restarts and grace periods.
"""

from __future__ import annotations

import json
import re
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from airflow_tf.demo import DEMO_NAMESPACE, ClusterRecorder, kubernetes_env, predict
from airflow_tf.serving import latest_export

from serving_check import WARMUP, serve_both_ways
from .faults import CUT, RECOVERY_BOUND, STOP, Faults
from .host import container_pid, plane_env, processes, real_nodes
from .scheduled import ScheduledRun
from k8s.plane import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="a kubelet and containerd run as root")]


def _off_their_nodes(directory: Path, pods: dict[str, dict]) -> dict[str, dict]:
    """The pods (name: {"node", "ip"}) that did not run on one of the plane's nodes with an address
    from that node's pod subnet (10.201.R.0/24, its CNI bridge's)."""
    subnets = {name: node["pod_subnet"].rsplit(".", 1)[0] + "." for name, node in real_nodes(directory)["nodes"].items()}
    return {name: pod for name, pod in pods.items()
            if pod["node"] not in subnets or not (pod["ip"] or "").startswith(subnets[pod["node"]])}


@pytest.mark.timeout(1800)  # a real Airflow, three faults and their recoveries: about 12 minutes under load
def test_a_killed_a_frozen_and_a_lost_ps_are_replaced_and_the_dag_trains_to_its_final_step(nodes_plane, tmp_path):
    """The demo DAG on Kubernetes end to end, through faults. A ps container's process SIGKILLed
    on the node: the Job controller makes a new pod. The
    new ps frozen (SIGSTOP, its TCP port still accepting): its liveness probe (the health
    question, run in the container by the kubelet) fails, the kubelet kills it, and the Job makes
    another. Then the node holding that ps stopped as a lost machine goes: Kubernetes judges it
    lost and evicts the ps, the backend releases the pod its kubelet cannot confirm, and the ps
    runs again on another node; the wait's log says so in a user's words. Each time the workers
    restore from the newest checkpoint and the DAG trains on to its final step; the node is back
    before the test ends. Every training task, the evaluation and the export ran as pods on the
    nodes, the teardown deleted the ps, and the export answers as TensorFlow Serving loads it."""
    directory, storage = nodes_plane

    # Enough that the training outlasts the three faults, and no more (each step costs the other
    # tests CPU): the first comes at the first checkpoint past step 500 (about 2,000-3,000 steps in
    # on a quiet machine, 570 in a loaded CI run; the DAG checkpoints every 5 s), the second as soon
    # as the replacement runs, a few hundred steps on, the node's loss at the next checkpoint (at step
    # 1,080 loaded, 2,192 alone; a quiet rate's 5 s between checkpoints puts it near 5,000 at most);
    # a frozen or lost ps stops the training until its replacement
    # restores the newest checkpoint. Loaded, the steps left after the loss run at 10-20 a second.
    steps = 8000
    faults = Faults(directory, Faults.pods_now(directory))
    dag_run = ScheduledRun(tmp_path / "airflow", directory, steps)
    try:
        with ClusterRecorder(plane_env(directory)["KUBECONFIG"], DEMO_NAMESPACE) as seen:
            _faults_during(dag_run, faults, steps, directory)
    finally:
        dag_run.stop()
        faults.start_stopped()
    # Every training task, the evaluation and the export ran as a pod on one of the nodes, with an
    # address of its own on that node's CNI bridge, from the group's Jobs.
    pods = {name: pod for name, pod in seen.pods.items() if name.startswith("tf-tf-linear-regression-")}
    assert sorted({re.sub(r"^tf-tf-linear-regression-[0-9a-f-]+?-(ps|worker|evaluate|export)(-\d+)?-[a-z0-9]{5}$",
                          r"\1\2", name) for name in pods}) == ["evaluate", "export", "ps-0", "worker-0", "worker-1"]
    # (A pod deleted before it had an address, a replacement the fault overtook, ran nowhere.)
    assert _off_their_nodes(directory, {name: pod for name, pod in pods.items() if pod["ip"]}) == {}, pods
    jobs = {name: state for name, state in seen.jobs.items() if name.startswith("tf-tf-linear-regression-")}
    assert sorted(job.rsplit("-", 1)[-1] for job in jobs) == ["evaluate", "export", "ps", "worker"], jobs
    # The teardown deleted the parameter servers, which never exit by themselves.
    assert next(state for job, state in jobs.items() if job.endswith("-ps")) == "Active (deleted)", jobs
    # The blessed export, where the demo puts it, predicts y = 2x + 10 and answers its warm-up
    # requests both ways TensorFlow Serving would.
    served = latest_export(str(storage / "models"), "linear_regression")
    assert served is not None and served["metadata"]["metrics"]["blessed"] is True, served
    export = Path(served["path"])
    assert export.parent == storage.resolve() / "models" / "linear_regression"
    assert predict(str(export), {"x": [0.0, 1.0, 5.0]}) == pytest.approx([10.0, 12.0, 20.0], abs=0.5)
    serve_both_ways(export, export / WARMUP, tmp_path)


def _faults_during(dag_run: ScheduledRun, faults: Faults, steps: int, directory: Path) -> None:
    core = faults.core
    replaced = sorted(faults.earlier_pods)  # another test's, were one still going
    dag_run.trigger()

    def running_ps(other_than: set[str]):
        for pod in core.list_namespaced_pod(DEMO_NAMESPACE, label_selector="airflow-tf/role=ps").items:
            statuses = pod.status.container_statuses or []
            if pod.metadata.name not in other_than and statuses and statuses[0].state.running \
                    and statuses[0].container_id:
                return pod
        return None

    for fault in (signal.SIGKILL, signal.SIGSTOP):
        ps = wait_for(lambda: running_ps(set(replaced)), 240, "a running ps")
        # A checkpoint first, so the replacement has something to restore.
        checkpointed = wait_for(lambda: (lambda p: p if (p.get("checkpoint_step") or 0) > 500 else None)(
            faults.progress()), 240, "a checkpoint of the training")
        # The container's first process (python, the image's entrypoint), as the node's containerd runs it.
        pid = container_pid(directory, ps.spec.node_name, ps.status.container_statuses[0].container_id)
        at = faults.step()
        assert at < steps - 1000, f"the training ran to step {at} of {steps} before the {fault.name}: raise steps"
        os.kill(pid, fault)
        faulted = time.monotonic()
        replaced.append(ps.metadata.name)
        wait_for(lambda: running_ps(set(replaced)), 180, f"a new ps after {fault.name}")
        moved = wait_for(lambda: (lambda s: s if s > at + 200 else None)(faults.step()), 150,
                         f"training moving again after {fault.name} of the ps")
        print(f"{fault.name} of {ps.metadata.name} at step {at} (checkpoint {checkpointed['checkpoint_step']}): "
              f"step {moved} {time.monotonic() - faulted:.0f} s later")
    # The wait (on the triggerer, its status every 10 s) said which task was replaced, and why.
    killed = re.compile(r"replaced: \S+-ps-0 restarted 2 time\(s\), last: pod \S+ ended \(exit code 137 \(SIGKILL\)\)")
    wait_for(lambda: killed.search(dag_run.task_logs()), 60, "the wait's log to name the ps killed twice", interval=2)

    # The node holding the ps lost, after a checkpoint newer than the faults above; the training
    # must move again within RECOVERY_BOUND (the fault fails past it).
    lost = faults.fault(STOP, "ps-0", after_checkpoint=faults.progress().get("checkpoint_step") or 0,
                        timeout=RECOVERY_BOUND)
    print(f"{lost.describe()}; training moving again {lost.marks['moving']:.0f} s after the node's loss")
    assert lost.new_node != lost.node, lost.describe()
    assert lost.step < steps - 2000, f"the training was at step {lost.step} of {steps} when the node stopped: raise steps"
    # The wait's line naming the node the ps runs on now.
    said = re.compile(rf"\bps-0 lost with node {re.escape(lost.node)}, replaced on {re.escape(lost.new_node)} "
                      r"after \d+ s")
    try:
        reason = wait_for(lambda: said.search(dag_run.task_logs()), 60, "the wait's log to say where ps-0 went",
                          interval=2)
    except AssertionError:
        seen = sorted(set(re.findall(r"\bps-0 lost with node [^;\"]*", dag_run.task_logs())))
        raise AssertionError(f"no line of the wait's log says {said.pattern!r} ({lost.describe()}); "
                             f"its lines on the loss: {seen}") from None
    print(f"the wait's log: {reason.group(0)}")
    # The ps's pod still on the lost node, not evicted yet, is no replacement of an earlier attempt
    # that had ended there (the node's eviction marks that one too).
    assert f"replaced on {lost.node} " not in dag_run.task_logs(), "the lost node was called the replacement's"
    # The backend released the ps its node's kubelet cannot confirm: nothing of the group stays
    # Terminating there while the node is still down (the Job controller finishes a release within seconds).
    wait_for(lambda: not faults.terminating_on(lost.node), 30,
             f"no pod of the group Terminating on the lost {lost.node} ({faults.layout()})", interval=1)
    assert not faults.ready(lost.node), f"{lost.node} came back by itself: the release above proves nothing"
    faults.restore(lost)

    state = wait_for(dag_run.state, 900, "the DAG run's end", interval=2)
    logs = dag_run.task_logs()
    assert state == "success", logs[-4000:]
    final = faults.progress()
    # The final checkpoint is at or past the final step. Its name is the global step the chief read
    # just before saving: the other worker's last step may land after that read (async training),
    # so the final global step can be one past the name.
    saved = int(final["checkpoint"].rsplit("-", 1)[-1])
    assert final["done"] and final["global_step"] >= steps and steps <= saved <= final["global_step"], final


@pytest.mark.timeout(1800)  # the package's plane may start in it; then a fault and its recovery
def test_a_ps_cut_off_from_its_group_is_moved_off_its_node_and_the_group_trains_to_its_final_step(nodes_plane):
    """The node of the ps, alone there, cut off from the pod network with its kubelet still
    Ready: Kubernetes sees nothing wrong. The workers stop answering the ps's health question, the
    ps turns not Ready while the workers, reaching each other, stay Ready, and the backend moves
    the ps's role off that node; its status says where the ps went. The workers' connections to
    the old address hang in the cut: a trainer whose session does not come back while the new ps
    answers exits and is restarted, and the group trains from the newest checkpoint to its final
    step. No Airflow: the backend's own status is what the wait would show."""
    from airflow_tf.backends import get_backend
    from airflow_tf.backends.wait import wait_for_group
    from airflow_tf.cluster import GroupSpec, TrainingConfig
    from airflow_tf.data import prepare_dataset
    from airflow_tf.data.samples import write_linear_regression_csv

    directory, storage = nodes_plane
    settings = plane_env(directory)
    kubernetes_env(directory)  # the namespace and the claim of the storage folder
    files = storage / "cut"
    write_linear_regression_csv(files / "incoming" / "seed.csv", rows=5000, seed=0)
    dataset = prepare_dataset(files / "incoming" / "seed.csv", files / "datasets", "linear_regression",
                              label="y", eval_fraction=0.2, shards=2)["dataset_uri"]
    faults = Faults(directory, Faults.pods_now(directory))
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=settings["KUBECONFIG"],
                          namespace=DEMO_NAMESPACE, image=settings["AIRFLOW_TF_KUBE_IMAGE"], poll_interval=2.0,
                          pod_defaults={"volumes": [{"claim": settings["AIRFLOW_TF_KUBE_STORAGE_VOLUME"],
                                                     "mount_path": str(storage)}]})
    # Enough steps to outlast the cut: it comes at the first checkpoint past step 200 (checkpoints
    # every 2 s), and the training stops until the moved ps restores the newest checkpoint.
    steps = 6000
    name = f"tf-cut-{uuid.uuid4().hex[:6]}"  # tf-*: the run directories Faults follows
    training = TrainingConfig(dataset=dataset, run_dir=str(storage / "runs" / name), model="linear_regression",
                              steps=steps, batch_size=64, learning_rate=0.01, checkpoint_every_secs=2)
    ref = backend.launch(GroupSpec.for_training(name, training, ps=1, workers=2))
    # The wait, as the sensor or `airflow-tf run` runs it: the backend decides the move in its status.
    reasons: set[str] = set()
    waited: dict[str, tuple] = {}
    waiter = threading.Thread(target=lambda: waited.setdefault("end", wait_for_group(
        backend, ref, timeout=1500, interval=2.0, on_status=lambda s: reasons.update(t.reason for t in s.tasks
                                                                                    if t.reason))), daemon=True)
    waiter.start()
    try:
        # The ps prefers a node without trainers, the workers nodes without each other: three nodes, one task each.
        wait_for(lambda: faults.alone_on_its_node() == "ps-0", 300, f"ps-0 alone on its node ({faults.layout()})",
                 interval=1)
        # Ready first (a worker answered its health question): a task never Ready is not judged.
        wait_for(lambda: (lambda pod: pod is not None and any(
            c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []))(faults.running("ps", 0)),
            180, f"ps-0 Ready ({faults.layout()})", interval=1)
        cut = faults.fault(CUT, "ps-0", after_checkpoint=200, timeout=RECOVERY_BOUND)
        print(f"{cut.describe()}; training moving again {cut.marks['moving']:.0f} s after the cut")
        assert cut.new_node != cut.node, cut.describe()
        assert cut.step < steps - 1000, f"the training was at step {cut.step} of {steps} when the network was cut: raise steps"
        assert faults.ready(cut.node), "a cut node's kubelet still reports Ready: only the health questions can tell"
        said = re.compile(rf"\bps-0 cut off from its group on node {re.escape(cut.node)}, replaced on "
                          rf"{re.escape(cut.new_node)} after \d+ s")
        reason = wait_for(lambda: next((r for r in set(reasons) if said.search(r)), None), 60,
                          "the status to say where the cut-off ps went", interval=2)
        print(f"the status: {reason}")
        faults.restore(cut)
        waiter.join(600)
        assert "end" in waited, f"the group did not end within 600 s of the node's return ({faults.layout()})"
        outcome, status = waited["end"]
        assert outcome.succeeded, outcome.reason
        assert status.progress["global_step"] >= steps, status.progress
        restarted = [line for index in (0, 1) for line in backend.logs(ref, "worker", index).splitlines()
                     if "airflow-tf session ready" in line or "session not made" in line]
        print("the workers' sessions:", *restarted[-6:], sep="\n  ")
    finally:
        backend.teardown(ref)
        faults.start_stopped()


PARTS_DAG = '''
import json
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, task
from airflow_tf.task_groups import tf_prepare

with DAG("parts_on_the_node", schedule=None, start_date=datetime(2024, 1, 1), catchup=False) as dag:
    prepared = tf_prepare(input={source!r}, output={output!r}, name="clicks", parts=2, label="y",
                          eval_fraction=0.25, seed=7, progress_every=0, kubernetes={kubernetes!r})

    @task
    def record(summary):
        Path({result!r}).write_text(json.dumps(summary))

    record(prepared.output)
'''


def test_the_parts_of_a_partitioned_prepare_run_as_pods_on_the_node(nodes_plane, tmp_path, migrated_airflow_db):
    """``tf_prepare(kubernetes=...)``: each part a Job whose pod reads the input and writes its
    shards in the storage it shares with Airflow; the version equals a local prepare's."""
    from airflow_tf.data import prepare_dataset
    from airflow_tf.demo import airflow_env, dags_test

    from k8s.test_kubernetes_parts import _inputs, _records

    directory, storage = nodes_plane
    settings, env = plane_env(directory), airflow_env(tmp_path / "demo", tmp_path / "dags")
    env.update(kubernetes_env(directory))
    source, output, result = _inputs(storage / "raw"), storage / "datasets", tmp_path / "xcom.json"
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "parts_on_the_node.py").write_text(PARTS_DAG.format(
        source=str(source), output=str(output), result=str(result), kubernetes={
            "image": settings["AIRFLOW_TF_KUBE_IMAGE"], "namespace": DEMO_NAMESPACE,
            "kubernetes_conn_id": None, "config_file": settings["KUBECONFIG"], "poll_interval": 0.5,
            "volumes": [{"claim": settings["AIRFLOW_TF_KUBE_STORAGE_VOLUME"], "mount_path": str(storage)}]}))
    migrated_airflow_db(env)
    with ClusterRecorder(settings["KUBECONFIG"], DEMO_NAMESPACE) as seen:
        run = dags_test(env, "parts_on_the_node")
    assert "state=success" in run.stdout, run.stdout[-4000:]
    parts = {name: pod for name, pod in seen.pods.items() if name.startswith("prep-clicks-")}
    assert len(parts) == 2 and _off_their_nodes(directory, parts) == {}, seen.pods
    summary = json.loads(result.read_text())
    single = prepare_dataset(source, tmp_path / "single", "single", label="y", eval_fraction=0.25, seed=7)
    assert summary["parts"] == 2 and summary["counts"] == single["counts"]
    for split in ("train", "eval"):
        assert _records(summary["dataset_uri"], split) == _records(single["dataset_uri"], split)


def _pod(name: str, image: str, command: list[str], **spec: object) -> dict:
    container = {"name": "main", "image": image, "command": command}
    container.update(spec.pop("container", {}))
    return {"metadata": {"name": name}, "spec": {"automountServiceAccountToken": False, "containers": [container],
                                                 **spec}}


def test_the_kubelet_runs_probes_restarts_and_grace_periods_on_the_node(nodes_plane):
    """What a group's manifests rely on from the node: a failing liveness probe stops the
    container (restarted under OnFailure, the pod failed under Never), a startup probe that
    outlasts its timeout fails it too, and a process that ignores SIGTERM is killed once its grace
    period is over, not before."""
    from kubernetes import client, config

    directory = nodes_plane[0]
    marker = f"aftf-nodes-test-{uuid.uuid4().hex[:8]}"
    env = plane_env(directory)
    image = env["AIRFLOW_TF_KUBE_IMAGE"]
    core = client.CoreV1Api(config.new_client_from_config(config_file=env["KUBECONFIG"]))
    ns = "probes"
    core.create_namespace({"metadata": {"name": ns}})
    wait_for(lambda: core.list_namespaced_service_account(ns).items, 30, "the default service account")
    failing = {"exec": {"command": ["/bin/sh", "-c", "exit 1"]}, "periodSeconds": 1, "failureThreshold": 2}
    # The shell is the container's pid 1, which ignores a signal it has no handler for: it exits on SIGTERM.
    sleeper = ["/bin/sh", "-c", "trap 'exit 143' TERM; while :; do sleep 1; done", marker]
    # A liveness probe that fails: the container is stopped (SIGTERM), and restarted (OnFailure)...
    core.create_namespaced_pod(ns, _pod("restarted", image, sleeper, restartPolicy="OnFailure",
                                        terminationGracePeriodSeconds=5, container={"livenessProbe": failing}))
    # ... or, under Never, the pod fails.
    core.create_namespaced_pod(ns, _pod("failed", image, sleeper, restartPolicy="Never",
                                        terminationGracePeriodSeconds=5, container={"livenessProbe": failing}))
    # A startup probe that outlasts its timeout fails too.
    slow = {"exec": {"command": ["/bin/sh", "-c", "sleep 30"]}, "timeoutSeconds": 1, "failureThreshold": 1}
    core.create_namespaced_pod(ns, _pod("slow-start", image, sleeper, restartPolicy="Never",
                                        terminationGracePeriodSeconds=5, container={"startupProbe": slow}))
    # A process that ignores SIGTERM is killed once the grace period is over.
    core.create_namespaced_pod(ns, _pod("stubborn", image, ["/bin/sh", "-c", "trap '' TERM; while :; do sleep 1; done",
                                                            marker],
                                        restartPolicy="Never", terminationGracePeriodSeconds=3))
    try:
        def status(name: str):
            return core.read_namespaced_pod(name, ns).status

        restarted = wait_for(lambda: (lambda s: s if s.container_statuses and s.container_statuses[0].restart_count >= 1
                                      else None)(status("restarted")), 90, "a restart after the liveness probe failed")
        last = restarted.container_statuses[0].last_state.terminated
        assert (last.exit_code, last.reason) == (143, "Error")  # stopped by SIGTERM
        for name in ("failed", "slow-start"):
            failed = wait_for(lambda n=name: (lambda s: s if s.phase == "Failed" else None)(status(n)), 90,
                              f"pod {name} failed")
            terminated = failed.container_statuses[0].state.terminated
            assert (terminated.exit_code, terminated.reason) == (143, "Error"), name
        wait_for(lambda: any(e.reason == "Unhealthy" and "Liveness" in e.message for e in core.list_namespaced_event(
            ns, field_selector="involvedObject.name=failed").items), 30, "the Unhealthy event")

        wait_for(lambda: status("stubborn").phase == "Running", 60, "pod stubborn running")
        started = time.monotonic()
        core.delete_namespaced_pod("stubborn", ns)
        wait_for(lambda: not [p for p in core.list_namespaced_pod(ns).items if p.metadata.name == "stubborn"], 30,
                 "pod stubborn removed", interval=0.2)
        assert 3 <= time.monotonic() - started < 15  # SIGKILL after the grace period, not before
        assert not [p for p in processes(marker) if "trap ''" in p]
    finally:
        core.delete_namespace(ns)


def test_a_ps_out_of_memory_fails_the_wait_naming_its_limit_and_what_to_raise(nodes_plane):
    """A ps given less memory than TensorFlow needs is OOMKilled by the node: the DAG's wait (the
    sensor) fails with the pod, the limit it had and the setting to raise, not a bare exit 137."""
    from airflow_tf.backends import get_backend
    from airflow_tf.cluster import GroupSpec, TrainingConfig
    from airflow_tf.data import prepare_dataset
    from airflow_tf.data.samples import write_linear_regression_csv
    from airflow_tf.sensors.worker_completion import TrainingGroupFailed, WorkerCompletionSensor

    directory, storage = nodes_plane
    settings = plane_env(directory)
    kubernetes_env(directory)  # the namespace (Pod Security restricted) and the claim of the storage folder
    write_linear_regression_csv(storage / "oom" / "seed.csv", rows=500, seed=0)
    dataset = prepare_dataset(storage / "oom" / "seed.csv", storage / "oom" / "datasets", "linear_regression",
                              label="y", eval_fraction=0.2)["dataset_uri"]
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=settings["KUBECONFIG"],
                          namespace=DEMO_NAMESPACE, image=settings["AIRFLOW_TF_KUBE_IMAGE"], poll_interval=1.0,
                          pod_defaults={"volumes": [{"claim": settings["AIRFLOW_TF_KUBE_STORAGE_VOLUME"],
                                                     "mount_path": str(storage)}]})
    training = TrainingConfig(dataset=dataset, run_dir=str(storage / "runs" / "tf-oom"), model="linear_regression",
                              steps=200, batch_size=32)
    ref = backend.launch(GroupSpec.for_training("tf-oom", training, ps=1, workers=1, role_options={
        "ps": {"resources": {"requests": {"memory": "40Mi"}, "limits": {"memory": "40Mi"}}}}))
    try:
        sensor = WorkerCompletionSensor(task_id="wait", group=ref.to_dict(), poke_interval=1)
        with pytest.raises(TrainingGroupFailed) as failed:
            wait_for(lambda: sensor.poke({}), 300, "the sensor to end the wait", interval=1)
    finally:
        backend.teardown(ref)
    message = str(failed.value)
    assert re.match(r"training group tf-oom failed: task \S+ \(ps 0\) failed: OOMKilled: pod tf-oom-ps-0-\S+ ran out "
                    r"of memory \(limit 40Mi\); raise roles\.ps\.resources\.limits\.memory", message), message
