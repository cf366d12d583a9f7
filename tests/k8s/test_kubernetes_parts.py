"""The parts of a partitioned prepare as Kubernetes Jobs (``tf_prepare(kubernetes=...)``),
on the real control plane (test_kubernetes.py), through the provider's KubernetesHook and the
real ``kubernetes`` client, as a service account bound only to the shipped RBAC Role.

The part pods run on the real node from the training image: ``python -m airflow_tf.data part``
reads the plan and writes its shards in the test's folder, mounted in the pod at the same path
(a volume on a host folder, as a PersistentVolumeClaim on shared storage gives), its output is
the pod's log and its result the termination message the kubelet reports. So the committed
version is compared with a local prepare record by record. The tests that need a part to stay
running, or a try to end a given way, run the pods as told (tests/k8s/scripted.py)."""

from __future__ import annotations

import os
import struct
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from .plane import REMOVAL_BOUND, wait_for
from .scripted import ABSENT_IMAGE, original_command, training_image
from .test_kubernetes import kubeconfig  # noqa: F401 (fixtures)

from airflow_tf.backends import BackendError
from airflow_tf.backends.base import ComponentRefusedError
from airflow_tf.backends.kubernetes.one_off import TERMINATION_MESSAGE_PATH
from airflow_tf.backends.kubernetes.parts import KubernetesPartOptions, part_job, part_job_name, run_part
from airflow_tf.cluster import SpecError
from airflow_tf.cluster.names import is_dns1123_label
from airflow_tf.data import prepare_dataset
from airflow_tf.data.errors import DataError
from airflow_tf.data.parts import commit_parts, plan_parts

PARTS = "airflow-tf/component=prepare-part"
ROOT = Path(__file__).resolve().parents[2]


class JobsSeen:
    """The part Jobs as created, recorded while the block runs (each is deleted once finished)."""

    def __init__(self, kube):
        self.kube, self.jobs = kube, []
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> JobsSeen:
        self._watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._watcher.join()

    def _watch(self) -> None:
        while not self._stop.is_set():
            seen = {j["metadata"]["uid"] for j in self.jobs}
            self.jobs += [j for j in self.kube.objects("jobs", PARTS) if j["metadata"]["uid"] not in seen]
            time.sleep(0.05)


def _inputs(folder: Path) -> Path:
    """Two CSV files of rows with a unique id."""
    folder.mkdir(parents=True)
    start = 0
    for index, rows in enumerate((1500, 900)):
        lines = ["id,x,word,y"] + [f"{i},{i / 7:.5f},w{i % 13},{i % 2}" for i in range(start, start + rows)]
        (folder / f"day-{index}.csv").write_text("\n".join(lines) + "\n")
        start += rows
    return folder


def _tfrecords(path: Path) -> list[bytes]:
    """The records of one uncompressed TFRecord file (length, its CRC, data, its CRC)."""
    data, records, at = path.read_bytes(), [], 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at:at + 8])
        records.append(data[at + 12:at + 12 + length])
        at += 12 + length + 4
    return records


def _records(uri: str, split: str) -> Counter:
    return Counter(r for f in sorted(Path(uri, split).glob("part-*")) for r in _tfrecords(f))


RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}


def _options(kube, folder: Path, **extra) -> KubernetesPartOptions:
    """The part pods' settings: ``folder`` (the test's) mounted at its own path, where the plan
    names the inputs and the shards; the pods' user (the image's, uid 1000) may write in it."""
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, 1000, 1000)
    kube.volume_claim("datasets", folder)
    return KubernetesPartOptions.coerce({
        "image": training_image(), "namespace": kube.ns, "kubernetes_conn_id": None,
        "config_file": str(kube.kubeconfig),
        "poll_interval": 0.1, "volumes": [{"claim": "datasets", "mount_path": str(folder)}],
        "resources": RESOURCES, **extra})


def _jobs_created(kube) -> int:
    """How many Jobs the backend created (a create refused as already done does not count)."""
    return len([c for c in kube.calls("create", "jobs") if c.code == 201])


def test_parts_run_as_jobs_and_the_committed_version_equals_a_local_prepare(kube, tmp_path):
    folder = _inputs(tmp_path / "raw")
    options = dict(label="y", eval_fraction=0.25, seed=7)
    plan = plan_parts(folder, tmp_path / "datasets", "clicks", parts=2, **options)
    pods = _options(kube, tmp_path)
    lines: list[str] = []
    with JobsSeen(kube) as seen:
        results = [run_part(pods, plan=plan["directory"], index=i, dataset="clicks", token=plan["token"],
                            progress_every=0, on_log=lines.append) for i in range(2)]
    assert [r["index"] for r in results] == [0, 1] and sum(r["rows"] for r in results) == 2400, \
        "each part's result comes back from its pod's termination message"
    assert any(line.startswith("part 0: ") for line in lines) and any(line.startswith("part 1: ") for line in lines), \
        "the parts' progress reaches the task log"
    assert len(lines) == len(set(lines)), "each log line is shown once"
    wait_for(lambda: kube.gone("jobs"), 30, "each finished part's Job to be deleted")

    summary = commit_parts(plan)
    single = prepare_dataset(folder, tmp_path / "single", "single", **options)
    assert summary["counts"] == single["counts"] and summary["rows"] == 2400
    for split in ("train", "eval"):
        assert _records(summary["dataset_uri"], split) == _records(single["dataset_uri"], split)

    job = seen.jobs[0]
    name = job["metadata"]["name"]
    assert name == part_job_name("clicks", plan["token"], 0) and is_dns1123_label(name)
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["ttlSecondsAfterFinished"] == 3600
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == training_image()
    assert container["command"] == ["python", "-m", "airflow_tf.data", "part", "--plan", plan["directory"],
                                    "--index", "0", "--progress-every", "0", "--result-file", TERMINATION_MESSAGE_PATH]
    assert container["volumeMounts"] == [{"name": "volume-0", "mountPath": str(tmp_path)}]
    assert pod["volumes"] == [{"name": "volume-0", "persistentVolumeClaim": {"claimName": "datasets"}}]
    assert container["resources"] == RESOURCES
    assert pod["securityContext"]["runAsNonRoot"] and not pod["automountServiceAccountToken"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert job["metadata"]["labels"]["airflow-tf/dataset"] == "clicks"


def test_a_retried_part_reattaches_to_its_running_job_and_replaces_a_finished_one(kube, scripted, tmp_path):
    pods = _options(kube, tmp_path)
    plan_dir, token = str(tmp_path / ".parts-0123456789ab"), ".parts-0123456789ab"
    earlier = part_job(pods, kube.ns, plan=plan_dir, index=0, dataset="clicks", token=token)
    backend = pods.backend()
    backend._create(earlier)  # the first try of the task started it, then its worker was lost
    first = wait_for(lambda: next((p["metadata"]["name"] for p in kube.objects("pods", PARTS)
                                   if p["spec"].get("nodeName")), None), 30, "the part's pod")
    scripted.running(first)
    assert original_command(kube.objects("jobs", PARTS)[0])[:4] == ["python", "-m", "airflow_tf.data", "part"]

    def finish():
        wait_for(lambda: [c for c in kube.calls("create", "jobs") if c.time > started and c.code == 409], 30,
                 "the retry's create, refused")
        scripted.succeed(first, log="part 0: write 100%\n", message='{"counts":{"train":5},"index":0,"rows":5}',
                         wait=False)

    started = time.time()
    helper = threading.Thread(target=finish)
    helper.start()
    result = run_part(pods, plan=plan_dir, index=0, dataset="clicks", token=token)
    helper.join()
    assert result == {"counts": {"train": 5}, "index": 0, "rows": 5}
    assert _jobs_created(kube) == 1, "the retry re-attached to the running Job instead of starting another"

    backend._create(earlier)  # a try that failed left its finished Job behind
    failed = wait_for(lambda: next((p["metadata"]["name"] for p in kube.objects("pods", PARTS)
                                    if p["metadata"]["name"] != first and p["spec"].get("nodeName")), None), 30,
                      "the second try's pod")
    scripted.fail(failed, exit_code=1)
    wait_for(lambda: "Failed" in [c["type"] for c in (kube.objects("jobs", PARTS)[0].get("status") or {}).get(
        "conditions") or []], 30, "the second try's Job to fail")

    def succeed_new():
        fresh = wait_for(lambda: next((p["metadata"]["name"] for p in kube.objects("pods", PARTS)
                                       if p["metadata"]["name"] not in (first, failed) and p["spec"].get("nodeName")),
                                      None), 60, "the third try's pod")
        scripted.succeed(fresh, message='{"counts":{"train":7},"index":0,"rows":7}', wait=False)

    helper = threading.Thread(target=succeed_new)
    helper.start()
    assert run_part(pods, plan=plan_dir, index=0, dataset="clicks", token=token)["rows"] == 7, \
        "the finished Job of an earlier try was replaced by a new one"
    helper.join()
    assert _jobs_created(kube) == 3
    wait_for(lambda: kube.gone("jobs"), 30, "the finished Jobs to be deleted")


def test_a_failed_part_names_its_pod_phase_reason_and_log_and_nothing_commits(kube, tmp_path):
    folder = _inputs(tmp_path / "raw")
    plan = plan_parts(folder, tmp_path / "datasets", "clicks", parts=2, label="y", eval_fraction=0.25)
    bad = next(i for i, files in enumerate(plan["parts"]) if files[0].endswith("day-1.csv"))
    with open(folder / "day-1.csv", "a") as handle:  # a row the plan did not see: only the part reads it
        handle.write("9999,0.5,w1,oops\n")
    pods = _options(kube, tmp_path)
    with JobsSeen(kube):
        run_part(pods, plan=plan["directory"], index=1 - bad, dataset="clicks", token=plan["token"])
        with pytest.raises(ComponentRefusedError) as failure:
            run_part(pods, plan=plan["directory"], index=bad, dataset="clicks", token=plan["token"])
    message = str(failure.value)
    assert f"Job {part_job_name('clicks', plan['token'], bad)} failed (pod " in message
    assert "exit code 2, phase Failed" in message, "the refused part's exit status and phase are named"
    assert "day-1.csv line 902, column 'y'" in message, "the last lines of its log say which value is wrong"
    wait_for(lambda: kube.gone("jobs"), 30, "the failed part's Job to be deleted too")
    with pytest.raises(DataError, match=f"part {bad} of 2 of dataset 'clicks' did not finish"):
        commit_parts(plan)
    assert not (tmp_path / "datasets" / "clicks" / "1").exists()


def test_a_killed_part_task_deletes_its_job_and_its_pod(kube, scripted, tmp_path):
    from airflow_tf.operators.prepare import PreparePartOperator

    folder = _inputs(tmp_path / "raw")
    plan = plan_parts(folder, tmp_path / "datasets", "clicks", parts=2, label="y")
    job = {"plan": plan["directory"], "index": 0, "name": "clicks", "token": plan["token"]}
    operator = PreparePartOperator(task_id="part", job=job, kubernetes=_options(kube, tmp_path).to_dict())
    outcome: list[BaseException] = []

    def execute():
        try:
            operator.execute({})
        except BaseException as e:  # noqa: BLE001  the test reads it below
            outcome.append(e)

    # The part runs on (its pod does nothing but wait) until the task is killed.
    runner = threading.Thread(target=execute)
    runner.start()
    scripted.running(wait_for(lambda: [p["metadata"]["name"] for p in kube.objects("pods", PARTS)], 30,
                              "the part's pod")[0])
    operator.on_kill()
    runner.join(timeout=30)
    wait_for(lambda: kube.gone("jobs") and kube.gone("pods"), REMOVAL_BOUND,
             "killing the task to delete the part's Job and, with it, its pod")
    assert outcome and isinstance(outcome[0], BackendError) and "disappeared before it finished" in str(outcome[0])
    with pytest.raises(DataError, match="part 0 of 2 of dataset 'clicks' did not finish"):
        commit_parts(plan)


def test_a_part_job_with_every_kind_of_setting_validates_against_the_kubernetes_schemas():
    import kubernetes_validate
    from .test_kubernetes_manifests import SUPPORTED_VERSIONS

    pods = KubernetesPartOptions(
        image="registry.example/tf:2.21", namespace="ml", resources={"limits": {"cpu": "2", "memory": "3Gi"}},
        env={"ARROW_IO_THREADS": "4"}, timeout_seconds=7200,
        pod={"volumes": [{"claim": "shared", "mount_path": "/shared"}], "node_selector": {"pool": "batch"},
             "tolerations": [{"key": "batch", "operator": "Exists", "effect": "NoSchedule"}],
             "service_account": "prepare", "secret_env": {"AWS_SECRET_ACCESS_KEY": {"secret": "s3", "key": "secret"}},
             "env_from": [{"config_map": "s3-endpoint"}], "image_pull_secrets": ["registry"],
             "labels": {"team": "ads"}, "priority_class": "batch-low",
             "pod_template": {"spec": {"containers": [{"name": "base", "workingDir": "/shared"}]}}})
    job = part_job(pods, "ml", plan="/shared/datasets/clicks/.parts-0123456789ab", index=1, dataset="clicks",
                   token=".parts-0123456789ab")
    for version in SUPPORTED_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {"name": "s3", "key": "secret"}}, \
        "a secret reaches the part as a reference, never as a value in the manifest"
    assert env["ARROW_IO_THREADS"] == "4" and container["envFrom"] == [{"configMapRef": {"name": "s3-endpoint"}}]
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == ("prepare", True)
    assert pod["nodeSelector"] == {"pool": "batch"} and pod["priorityClassName"] == "batch-low"
    assert container["workingDir"] == "/shared", "the user's pod template is merged under the part's container"
    assert job["spec"]["activeDeadlineSeconds"] == 7200
    assert job["spec"]["template"]["metadata"]["labels"]["team"] == "ads"


@pytest.mark.parametrize(("settings", "complaint"), [
    ({"image": ""}, r"kubernetes.image: '' is not a container image reference"),
    ({"image": "tf:2.21", "namespace": "ML_Team"}, r"kubernetes.namespace: .*'ML_Team' is not a Kubernetes namespace"),
    ({"image": "tf:2.21", "resources": {"limits": {"memory": "lots"}}},
     r"kubernetes.resources.limits.memory: 'lots' is not a Kubernetes quantity"),
    ({"image": "tf:2.21", "env": {"BAD NAME": "1"}}, r"kubernetes.env.BAD NAME: not a usable environment variable"),
    ({"image": "tf:2.21", "volumes": [{"claim": "data"}]},
     r"kubernetes.volumes\[0\].mount_path: an absolute path inside the container is required"),
    ({"image": "tf:2.21", "service_account": "Bad_Name"}, r"kubernetes.service_account: 'Bad_Name' is not a valid"),
    ({"image": "tf:2.21", "queue_name": "q"}, r"kubernetes.queue_name: not a setting of part pods"),
    ({"image": "tf:2.21", "volume": []}, r"kubernetes.volume: unknown setting; the settings are: image"),
    ({"image": "tf:2.21", "timeout_seconds": 0}, r"kubernetes.timeout_seconds: must be a number of seconds > 0"),
    ({"namespace": "ml"}, r"kubernetes.image: the image the parts run on is required"),
])
def test_bad_settings_are_refused_naming_the_setting(settings, complaint):
    with pytest.raises(SpecError, match=complaint):
        KubernetesPartOptions.coerce(settings)


def test_a_bad_setting_fails_the_dag_while_it_is_parsed(tmp_path):
    from airflow.sdk import DAG

    from airflow_tf.task_groups import tf_prepare

    with DAG("parted_k8s", schedule=None), pytest.raises(SpecError, match="kubernetes.image"):
        tf_prepare(input=str(tmp_path), name="clicks", kubernetes={"image": "bad image!"})
    with DAG("parted_k8s_ok", schedule=None) as dag:
        tf_prepare(input=str(tmp_path), name="clicks", kubernetes={"image": "tf:2.21", "volumes": []})
    part = dag.get_task("prepare.part")
    assert KubernetesPartOptions.coerce(part.partial_kwargs["kubernetes"]).image == "tf:2.21"


def test_a_part_whose_image_cannot_be_pulled_fails_at_once_naming_the_pod(kube, tmp_path):
    pods = _options(kube, tmp_path, image=ABSENT_IMAGE)  # in no registry: the node's pull is refused
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"failed \(pod prep-clicks-0123456789ab-0-\w+: "
                                           r"(ErrImagePull|ImagePullBackOff): .*phase Pending\)"):
        run_part(pods, plan=str(tmp_path / ".parts-0123456789ab"), index=0, dataset="clicks",
                 token=".parts-0123456789ab")
    assert time.monotonic() - started < 30, "the task does not wait for the Job's deadline (a day)"
    wait_for(lambda: kube.gone("jobs"), 30, "the part's Job to be deleted")
