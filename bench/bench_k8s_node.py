"""Pod start on a real node, and the linear-regression DAG through Airflow (``airflow dags test``)
on local processes and on a private Kubernetes plane with a real node (``scripts/kube up
--nodes 1``: kubelet, containerd, runc, the training image), in one run.

    .venv/bin/python bench/bench_k8s_node.py [--pods 5] [--steps 3000] [--rows 20000]   (as root)

"Pod start" runs from the pod's creation (the API call's return) to its container seen running
through the API server (polled every 50 ms), for pods of the training image created one at a time
in the demo's namespace (Pod Security ``restricted``). "Launch -> first step" runs from the start
of the launch task to the chief's ``session ready`` line (its log is copied into the teardown's
task log on both backends).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from airflow_tf.demo import DEMO_NAMESPACE, airflow_env, dag_run_state, dags_test, init_airflow, kubernetes_env
from airflow_tf.plane_env import read_plane_env

KUBE = Path(__file__).resolve().parents[1] / "scripts" / "kube"


def _at(line: str) -> datetime:
    return datetime.fromisoformat(line.split()[0].replace("Z", "+00:00"))


def launch_to_first_step(output: str) -> float:
    """Seconds from the launch task's start to the chief's first ``session ready``."""
    launched = next(_at(line) for line in output.splitlines() if "[DAG TEST] starting task_id=training.launch" in line)
    ready = min(_at(match.group(1)) for match in re.finditer(r"(\d{4}-\d\d-\d\dT[\d:.]+Z) airflow-tf session ready",
                                                             output))
    return (ready - launched).total_seconds()


def run(env: dict[str, str], steps: int, rows: int) -> tuple[float, float]:
    init_airflow(env)
    start = time.monotonic()
    result = dags_test(env, "tf_linear_regression", json.dumps({"steps": steps, "rows": rows}))
    seconds = time.monotonic() - start
    if dag_run_state(result.stdout) != "success":
        raise SystemExit(f"the DAG run on {env.get('AIRFLOW_TF_BACKEND', 'local')} failed:\n"
                         + "\n".join(result.stdout.splitlines()[-40:]))
    return seconds, launch_to_first_step(result.stdout)


def pod_starts(kubeconfig: str, image: str, count: int) -> list[float]:
    """Seconds from each pod's creation to its container running, one pod at a time."""
    from kubernetes import client, config

    core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    restricted = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                  "seccompProfile": {"type": "RuntimeDefault"}}
    seconds = []
    for i in range(count):
        name = f"bench-pod-start-{i}"
        started = time.monotonic()
        core.create_namespaced_pod(DEMO_NAMESPACE, {"metadata": {"name": name}, "spec": {
            "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
            "containers": [{"name": "main", "image": image, "command": ["sleep", "600"],
                            "securityContext": restricted}]}})
        while True:
            statuses = core.read_namespaced_pod(name, DEMO_NAMESPACE).status.container_statuses or []
            if statuses and statuses[0].state.running:
                seconds.append(time.monotonic() - started)
                break
            if time.monotonic() - started > 300:
                raise SystemExit(f"pod {name} not running after 300 s: {statuses}")
            time.sleep(0.05)
        core.delete_namespaced_pod(name, DEMO_NAMESPACE, grace_period_seconds=0)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=5, help="pods started one at a time for the pod start")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=20000)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("a real node's kubelet and containerd run as root: run this as root")
    work = Path(tempfile.mkdtemp(prefix="bench-k8s-node-"))
    work.chmod(0o755)  # the pods' user reaches the storage folder at its own path
    plane = work / "plane"
    try:
        local_seconds, local_first = run(airflow_env(work / "local"), args.steps, args.rows)
        started = time.monotonic()
        subprocess.run([sys.executable, str(KUBE), "up", str(plane), "--nodes", "1", "--storage", str(work / "storage"),
                        "--owner-pid", str(os.getpid())], check=True, stdout=subprocess.DEVNULL)
        plane_seconds = time.monotonic() - started
        env = airflow_env(work / "kubernetes")
        env.update(kubernetes_env(plane))
        settings = read_plane_env(plane / "env")
        starts = pod_starts(settings["KUBECONFIG"], settings["AIRFLOW_TF_KUBE_IMAGE"], args.pods)
        kube_seconds, kube_first = run(env, args.steps, args.rows)
    finally:
        if plane.exists():
            subprocess.run([sys.executable, str(KUBE), "down", str(plane)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    print(f"scripts/kube up --nodes 1 (plane, node, training image imported): {plane_seconds:.1f} s")
    print(f"pod start on a real node (created -> container running), {len(starts)} pods one at a time: "
          f"median {statistics.median(starts):.2f} s, min {min(starts):.2f} s, max {max(starts):.2f} s")
    print(f"tf_linear_regression, {args.steps} steps, {args.rows} rows, airflow dags test:")
    print(f"  launch -> first step : local {local_first:6.1f} s, Kubernetes {kube_first:6.1f} s, "
          f"ratio {kube_first / local_first:5.2f}x")
    print(f"  whole DAG            : local {local_seconds:6.1f} s, Kubernetes {kube_seconds:6.1f} s, "
          f"ratio {kube_seconds / local_seconds:5.2f}x")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
