"""Run the example DAGs through Airflow itself (``airflow dags test``) in a self-contained
home: SQLite, local processes, local disk. Used by ``airflow-tf demo`` and the DAG tests.

With a Kubernetes plane with a real node (``scripts/kube up DIR --nodes 1``) the same DAG trains
on it: its tasks' backend is the deployment's (``AIRFLOW_TF_BACKEND``), its pods run from the
training image, and the storage folder the plane offers as a hostPath volume is the storage of
both the Airflow tasks and the pods, at one path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from airflow_tf.plane_env import read_plane_env

REPO_DAGS = Path(__file__).resolve().parents[1] / "dags"


def airflow_env(workdir: str | os.PathLike, dags_folder: str | os.PathLike = REPO_DAGS) -> dict[str, str]:
    """Environment for an isolated Airflow home under ``workdir`` with the project's DAGs."""
    workdir = Path(workdir).resolve()
    home = workdir / "airflow"
    # The user's own Airflow settings must not leak into this self-contained home.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(Path(dags_folder).resolve()),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW_TF_STORAGE": str(workdir / "storage"),
        "AIRFLOW_TF_STATE_DIR": str(workdir / "groups"),
    })
    return env


def _airflow(env: dict[str, str], *args: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
    airflow = str(Path(sys.executable).with_name("airflow"))
    # On a plane, what the Airflow tasks make in the shared storage stays writable by the pods'
    # group (the storage folder is set-group-id to it).
    umask = 0o002 if env.get("AIRFLOW_TF_BACKEND") == "kubernetes" else -1
    return subprocess.run([airflow, *args], env=env, check=check, text=True, umask=umask,
                          stdout=subprocess.PIPE if capture else None,
                          stderr=subprocess.STDOUT if capture else None)


def init_airflow(env: dict[str, str]) -> None:
    """Create the metadata database. ``dags test`` parses the DAG folder and writes its DAGs to
    the database itself (Airflow 3.1 on), under the environment it runs in."""
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    _airflow(env, "db", "migrate", capture=True)


def reserialize(env: dict[str, str]) -> None:
    """Parse the DAG folder into the database, recording its import errors."""
    _airflow(env, "dags", "reserialize", capture=True)


def dags_test(env: dict[str, str], dag_id: str, conf: str | None = None) -> subprocess.CompletedProcess:
    """Run one DAG run to the end through Airflow; output captured, no exception on failure."""
    args = ["dags", "test", dag_id] + (["--conf", conf] if conf else [])
    return _airflow(env, *args, check=False, capture=True)


def dag_run_state(output: str) -> str:
    """The final DagRun state (``success``/``failed``) from ``dags test`` output."""
    return _finished_line(output).split("state=")[1].split(",")[0]


def run_id_of(output: str) -> str:
    return _finished_line(output).split("run_id=")[1].split(",")[0]


def _finished_line(output: str) -> str:
    for line in reversed(output.splitlines()):
        if "DagRun Finished" in line:
            return line
    raise RuntimeError("the DAG run did not finish; last output:\n" + "\n".join(output.splitlines()[-40:]))


def task_states(env: dict[str, str], dag_id: str, output: str) -> dict[str, str]:
    """task_id -> final state of the run in ``output``, read back from Airflow's database."""
    result = _airflow(env, "tasks", "states-for-dag-run", dag_id, run_id_of(output), "--output", "json", capture=True)
    rows = json.loads(result.stdout[result.stdout.index("["):])
    return {row["task_id"]: row["state"] for row in rows}


DEMO_NAMESPACE = "airflow-tf-demo"


def plane_settings(plane: str | os.PathLike) -> dict[str, str]:
    """What ``scripts/kube up DIR --nodes N`` wrote to ``DIR/env``."""
    path = Path(plane) / "env"
    if not path.is_file():
        raise SystemExit(f"airflow-tf demo: {path} is missing: start the plane with `scripts/kube up {plane} --nodes 1`")
    try:
        settings = read_plane_env(path)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"airflow-tf demo: {exc}") from None
    if "AIRFLOW_TF_KUBE_STORAGE" not in settings:
        raise SystemExit(f"airflow-tf demo: the plane of {plane} has no node nor storage (its {path} names none): "
                         f"start it with `scripts/kube up {plane} --nodes 1`")
    return settings


def kubernetes_env(plane: str | os.PathLike, namespace: str = DEMO_NAMESPACE) -> dict[str, str]:
    """The environment that puts the example DAGs on the plane in ``plane`` (its nodes, its
    storage folder): creates ``namespace`` (enforcing Pod Security ``restricted``, as the docs set
    a team's up) and a claim of the storage folder there first."""
    from kubernetes import client, config

    from airflow_tf.backends.kubernetes.access import pod_security_labels

    settings = plane_settings(plane)
    storage = settings["AIRFLOW_TF_KUBE_STORAGE"]
    volume = settings["AIRFLOW_TF_KUBE_STORAGE_VOLUME"]
    core = client.CoreV1Api(config.new_client_from_config(config_file=settings["KUBECONFIG"]))
    if not core.list_namespace(field_selector=f"metadata.name={namespace}").items:
        core.create_namespace({"metadata": {"name": namespace, "labels": pod_security_labels()}})
    if not core.list_namespaced_persistent_volume_claim(namespace, field_selector=f"metadata.name={volume}").items:
        core.create_namespaced_persistent_volume_claim(namespace, {"metadata": {"name": volume}, "spec": {
            "accessModes": ["ReadWriteMany"], "storageClassName": settings["AIRFLOW_TF_KUBE_STORAGE_CLASS"],
            "volumeName": volume, "resources": {"requests": {"storage": "1Gi"}}}})
    deadline = time.monotonic() + 60
    while core.read_namespaced_persistent_volume_claim(volume, namespace).status.phase != "Bound":
        if time.monotonic() > deadline:
            raise SystemExit(f"airflow-tf demo: claim {namespace}/{volume} not bound to volume {volume} after 60 s")
        time.sleep(0.5)
    return {
        "AIRFLOW_TF_STORAGE": storage,
        "AIRFLOW_TF_BACKEND": "kubernetes",
        "AIRFLOW_TF_BACKEND_OPTIONS": json.dumps({"namespace": namespace, "image": settings["AIRFLOW_TF_KUBE_IMAGE"],
                                                  "pod_defaults": {
            "volumes": [{"claim": volume, "mount_path": storage}]}}),
        "AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps({"conn_type": "kubernetes", "extra": {
            "kube_config_path": settings["KUBECONFIG"], "namespace": namespace}}),
    }


class ClusterRecorder:
    """Notes every Job and pod of a namespace while a run lasts (the teardown deletes them)."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=kubeconfig)
        self.core, self.batch, self.namespace = client.CoreV1Api(api), client.BatchV1Api(api), namespace
        self.jobs: dict[str, str] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._record, name="cluster-recorder", daemon=True)

    def __enter__(self) -> ClusterRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _note(self, jobs: list, pods: list) -> None:
        """The state of each Job and pod listed; one seen before and listed no more was deleted
        (by the teardown, or by its task once it had the result)."""
        for job in jobs:
            done = [c.type for c in job.status.conditions or [] if c.status == "True"]
            self.jobs[job.metadata.name] = done[-1] if done else "Active"
        for pod in pods:
            self.pods[pod.metadata.name] = {"phase": pod.status.phase, "node": pod.spec.node_name,
                                            "ip": pod.status.pod_ip}
        listed = {job.metadata.name for job in jobs}
        for name, state in self.jobs.items():
            if name not in listed and not state.endswith("(deleted)"):
                self.jobs[name] = f"{state} (deleted)"
        listed = {pod.metadata.name for pod in pods}
        for name, seen in self.pods.items():
            if name not in listed:
                seen["deleted"] = True

    def _record(self) -> None:
        while True:
            try:
                jobs = self.batch.list_namespaced_job(self.namespace).items
                pods = self.core.list_namespaced_pod(self.namespace).items
            except Exception as exc:  # the plane busy for a moment: the next look catches up
                print(f"airflow-tf demo: could not list the cluster's Jobs and pods: {exc}", file=sys.stderr)
            else:
                self._note(jobs, pods)
            if self._stop.wait(1.0):
                return


def run_demo(workdir: str | os.PathLike, dags_folder: str | os.PathLike = REPO_DAGS,
             plane: str | os.PathLike | None = None) -> dict:
    """Run ``tf_linear_regression`` end to end and report where the model went and how good it
    is; with ``plane`` (a ``scripts/kube up --nodes N`` directory), on that Kubernetes plane."""
    from airflow_tf.serving import latest_export

    env = airflow_env(workdir, dags_folder)
    recorder = None
    if plane is not None:
        env.update(kubernetes_env(plane))
        recorder = ClusterRecorder(plane_settings(plane)["KUBECONFIG"], DEMO_NAMESPACE)
    print(f"airflow-tf demo: Airflow home {env['AIRFLOW_HOME']}, storage {env['AIRFLOW_TF_STORAGE']}", flush=True)
    init_airflow(env)
    print("airflow-tf demo: running DAG tf_linear_regression (airflow dags test) "
          f"on {env.get('AIRFLOW_TF_BACKEND', 'local')} ...", flush=True)
    if recorder is None:
        result = dags_test(env, "tf_linear_regression")
    else:
        with recorder:
            result = dags_test(env, "tf_linear_regression")
    log_path = Path(workdir) / "tf_linear_regression.log"
    log_path.write_text(result.stdout)
    if result.returncode != 0 or dag_run_state(result.stdout) != "success":
        tail = "\n".join(result.stdout.splitlines()[-40:])
        raise SystemExit(f"airflow-tf demo: the DAG run failed (full log: {log_path}):\n{tail}")
    models = Path(env["AIRFLOW_TF_STORAGE"]) / "models"
    served = latest_export(str(models), "linear_regression")
    if served is None:
        raise SystemExit(f"airflow-tf demo: the run succeeded but no model was exported under {models}")
    evaluation = served["metadata"].get("metrics", {})
    predictions = predict(served["path"], {"x": [0.0, 1.0, 5.0]})
    summary = {
        "dag_id": "tf_linear_regression",
        "exported_model": served["path"],
        "version": served["version"],
        "eval_metrics": evaluation.get("metrics", {}),
        "blessed": evaluation.get("blessed"),
        "training_curve": evaluation.get("plot"),
        "predictions_for_x_0_1_5": predictions,
        "expected_for_x_0_1_5 (2x + 10)": [10.0, 12.0, 20.0],
        "dag_log": str(log_path),
    }
    if recorder is not None:
        summary["kubernetes"] = {"namespace": DEMO_NAMESPACE, "jobs": recorder.jobs, "pods": recorder.pods}
    return summary


def predict(saved_model_dir: str, features: dict[str, list]) -> list[float]:
    """Call an exported model's ``serving_default`` signature, as TensorFlow Serving would."""
    import tensorflow as tf

    signature = tf.saved_model.load(saved_model_dir).signatures["serving_default"]
    inputs = {}
    for name, spec in signature.structured_input_signature[1].items():
        value = tf.constant(features[name], dtype=spec.dtype)
        inputs[name] = tf.reshape(value, [-1, *[d or 1 for d in spec.shape[1:]]])
    outputs = signature(**inputs)
    first = outputs.get("predictions", next(iter(outputs.values())))
    return [round(float(v), 3) for v in tf.reshape(first, [-1]).numpy()]
