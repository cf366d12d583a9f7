"""The linear-regression DAG end to end through Airflow (``airflow dags test``, deferrable
sensor) against the same data preparation and training through ``airflow-tf`` alone, in one
run; and how long after the last worker exited the parameter servers were gone.

    .venv/bin/python bench/bench_dag.py [--steps 3000] [--rows 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from airflow_tf.data.samples import write_linear_regression_csv
from airflow_tf.demo import airflow_env, dag_run_state, dags_test, init_airflow

BIN = Path(sys.executable).parent


class ProcessWatcher(threading.Thread):
    """Samples the process table: when each ps / worker process of the run was last seen alive."""

    def __init__(self, marker: str, interval: float = 0.02):
        super().__init__(daemon=True)
        self.marker, self.interval = marker, interval
        self.last_seen: dict[int, tuple[str, float]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            for proc in psutil.process_iter(["pid", "cmdline"]):
                try:
                    cmdline = " ".join(proc.info["cmdline"] or [])
                    titled = re.match(r"airflow-tf ([a-z]+)-\d+ group=", cmdline)  # runtime/proctitle.py
                    if not (titled or "airflow_tf.runtime" in cmdline) or self.marker not in cmdline:
                        continue
                    role = titled.group(1) if titled else (
                        json.loads(proc.environ().get("TF_CONFIG", "{}")).get("task", {}).get("type", "?"))
                except (psutil.Error, ValueError):
                    continue
                self.last_seen[proc.info["pid"]] = (role, now)
            time.sleep(self.interval)

    def ps_gone_after_last_worker(self) -> float | None:
        workers = [t for role, t in self.last_seen.values() if role in ("worker", "chief")]
        ps = [t for role, t in self.last_seen.values() if role == "ps"]
        return max(ps) - max(workers) if workers and ps else None


def task_durations(output: str) -> dict[str, float]:
    """Seconds each task took, from the ``[DAG TEST] starting/end task`` lines of the run."""
    from datetime import datetime

    started: dict[str, datetime] = {}
    durations: dict[str, float] = {}
    for line in output.splitlines():
        for marker in ("[DAG TEST] starting task_id=", "[DAG TEST] end task task_id="):
            if marker in line:
                task_id = line.split(marker)[1].split()[0]
                at = datetime.fromisoformat(line.split()[0].replace("Z", "+00:00"))
                if "starting" in marker:
                    started[task_id] = at
                else:
                    durations[task_id] = (at - started[task_id]).total_seconds()
    return durations


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.monotonic()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=20000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-dag-"))
    env = airflow_env(work)
    storage = Path(env["AIRFLOW_TF_STORAGE"])
    init_airflow(env)

    # Baseline: the same preparation and training, without Airflow.
    csv = work / "cli" / "linear.csv"
    write_linear_regression_csv(str(csv), rows=args.rows, seed=0)
    cli_env = dict(env, AIRFLOW_TF_STATE_DIR=str(work / "cli-groups"))
    cli_seconds = timed([str(BIN / "airflow-tf"), "prepare", "--input", str(csv), "--output", str(work / "cli" / "datasets"),
                         "--name", "linear_regression", "--label", "y", "--eval-fraction", "0.2", "--shards", "4"], cli_env)
    cli_seconds += timed([str(BIN / "airflow-tf"), "run", "--dataset", str(work / "cli" / "datasets" / "linear_regression" / "1"),
                          "--model", "linear_regression", "--ps", "1", "--workers", "2", "--steps", str(args.steps),
                          "--batch-size", "64", "--learning-rate", "0.01", "--checkpoint-every-secs", "5",
                          "--run-dir", str(work / "cli" / "run")], cli_env)

    # Ours: the DAG through Airflow, with the deferrable worker-count sensor.
    watcher = ProcessWatcher(marker=str(storage))
    watcher.start()
    start = time.monotonic()
    result = dags_test(env, "tf_linear_regression", json.dumps({"steps": args.steps, "rows": args.rows}))
    dag_seconds = time.monotonic() - start
    watcher.stop.set()
    watcher.join()
    state = dag_run_state(result.stdout)
    if state != "success":
        raise SystemExit(f"the DAG run ended {state}; see {work}")
    latency = watcher.ps_gone_after_last_worker()

    durations = task_durations(result.stdout)
    print("DAG tasks: " + ", ".join(f"{task} {seconds:.1f} s" for task, seconds in durations.items()))
    print(f"  outside the tasks (airflow CLI start, DAG parsing, run bookkeeping): {dag_seconds - sum(durations.values()):.1f} s")
    print(f"prepare + train via airflow-tf CLI : {cli_seconds:7.1f} s")
    print(f"tf_linear_regression DAG (Airflow) : {dag_seconds:7.1f} s  (adds evaluation and export)")
    print(f"ratio DAG / CLI                    : {dag_seconds / cli_seconds:7.2f}x  (goal <= 1.5x)")
    print(f"ps gone after the last worker      : {latency:7.2f} s  (goal < 2 s)" if latency is not None
          else "ps gone after the last worker      : not observed")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
