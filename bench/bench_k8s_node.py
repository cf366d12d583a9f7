"""The linear-regression DAG end to end through Airflow (``airflow dags test``) on local
processes, then on a private Kubernetes plane whose node runs the pods as local processes
(``scripts/kube up --node``), in one run: the whole DAG and launch -> first training step.

    .venv/bin/python bench/bench_k8s_node.py [--steps 3000] [--rows 20000]   (as root)

"Launch -> first step" runs from the start of the launch task to the chief's ``session ready``
line (its log is copied into the teardown's task log on both backends).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from airflow_tf.demo import airflow_env, dag_run_state, dags_test, init_airflow, kubernetes_env

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=20000)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the node agent makes network namespaces: run this as root")
    work = Path(tempfile.mkdtemp(prefix="bench-k8s-node-"))
    work.chmod(0o755)  # the pods' user reaches the storage folder at its own path
    plane = work / "plane"
    try:
        local_seconds, local_first = run(airflow_env(work / "local"), args.steps, args.rows)
        subprocess.run([sys.executable, str(KUBE), "up", str(plane), "--node", "--storage", str(work / "storage"),
                        "--owner-pid", str(os.getpid())], check=True, stdout=subprocess.DEVNULL)
        env = airflow_env(work / "kubernetes")
        env.update(kubernetes_env(plane))
        kube_seconds, kube_first = run(env, args.steps, args.rows)
    finally:
        if plane.exists():
            subprocess.run([sys.executable, str(KUBE), "down", str(plane)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    print(f"tf_linear_regression, {args.steps} steps, {args.rows} rows, airflow dags test:")
    print(f"  launch -> first step : local {local_first:6.1f} s, Kubernetes {kube_first:6.1f} s, "
          f"ratio {kube_first / local_first:5.2f}x")
    print(f"  whole DAG            : local {local_seconds:6.1f} s, Kubernetes {kube_seconds:6.1f} s, "
          f"ratio {kube_seconds / local_seconds:5.2f}x")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
