"""Recovery from a lost node on a private three-node Kubernetes plane, against the local backend's
recovery from a killed task of the same role, in one run.

    .venv/bin/python bench/bench_node_loss.py [--runs 3] [--steps 100000] [--local-steps 40000]   (as root)

Ours: ``--runs`` scheduled runs of the demo DAG (real Airflow, ``tests/nodes/scheduled.py``) on
``scripts/kube up --nodes 3``, each with the faults of ``tests/nodes/faults.py``, one after
another and each after a checkpoint: the ps's node stopped (``scripts/kube node stop``: kubelet,
containerd and containers SIGKILLed), a worker's that is not the chief, the chief's, then the ps's
node drained (``kubectl drain``), then the ps's node cut off from the pod network (``scripts/kube
node cut``, its kubelet Ready); the stopped node is started, the drained one uncordoned and the cut
one joined before the next. For each it prints the seconds from the fault to (a) the node
``NotReady`` (after a cut: the ps's pod not Ready), (b) the pod
evicted (deletion started) and released (gone or marked ``Failed``: the backend's release of a pod
stuck on a lost node), (c) its replacement running on another node, (d) training moving again (the
chief's global step growing; the step of a worker's fault grows on with the other worker).
Baseline: the local backend (1 ps + 2 workers, the same model, checkpoints every 5 s as the demo
DAG's), ``--runs`` times the task of the same role SIGKILLed after a checkpoint, timed from the kill
to its replacement running and the training moving again. Read from the API server and
``progress.json`` every 0.5 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from airflow_tf.backends.local import LocalBackend
from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.data import prepare_dataset
from airflow_tf.data.samples import write_linear_regression_csv
from airflow_tf.files import read_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from k8s.plane import KUBE_SCRIPT, wait_for  # noqa: E402
from nodes.faults import CUT, DRAIN, STOP, Faults, Moving, Recovery  # noqa: E402
from nodes.scheduled import ScheduledRun, progress  # noqa: E402

FAULTS = (("ps node lost", STOP, "ps-0"), ("worker node lost", STOP, "worker-1"),
          ("chief node lost", STOP, "worker-0"), ("ps node drained", DRAIN, "ps-0"),
          ("ps node cut off", CUT, "ps-0"))
"""(name, fault, task): the demo has no chief role, worker-0 is its chief."""
MARKS = ("not_ready", "evicted", "released", "running", "moving")


def local_recoveries(work: Path, runs: int, steps: int) -> dict[str, list[dict[str, float]]]:
    """Per task, the seconds from its SIGKILL to its replacement running and to training moving
    again, ``runs`` times, on one local group of each run."""
    csv = write_linear_regression_csv(work / "linear.csv", rows=5000, seed=1)
    dataset = prepare_dataset(csv, work / "datasets", name="linear", label="y", shards=4)["dataset_uri"]
    backend = LocalBackend(work / "groups")
    seen: dict[str, list[dict[str, float]]] = {task: [] for task in ("ps-0", "worker-1", "worker-0")}
    for run in range(runs):
        name, runs_dir = f"tf-local-{run}", work / "runs"
        training = TrainingConfig(dataset=dataset, run_dir=str(runs_dir / name), steps=steps, batch_size=64,
                                  learning_rate=0.01, optimizer="sgd", checkpoint_every_secs=5)
        ref = backend.launch(GroupSpec.for_training(name, training, ps=1, workers=2, backoff_limit=10))
        earlier = {p.name for p in runs_dir.glob("tf-*") if p.name != name}
        step = lambda: int(progress(runs_dir, earlier).get("global_step") or 0)  # noqa: E731
        try:
            checkpoint = 0
            for task in seen:
                checkpoint = wait_for(lambda c=checkpoint: (lambda n: n if n > c else None)(
                    progress(runs_dir, earlier).get("checkpoint_step") or 0), 240, f"a checkpoint before killing {task}",
                    interval=0.5)
                state = read_json(backend.state_dir / name / "state.json")
                restarts = lambda t=task: next(s.restarts for s in backend.status(ref).tasks  # noqa: E731
                                               if s.name == f"{name}-{t}")
                before = restarts()
                os.kill(state["processes"][f"{name}-{task}"]["pid"], signal.SIGKILL)
                killed, moving = time.monotonic(), Moving(step)
                wait_for(lambda: restarts() > before, 300, f"local {task} replaced", interval=0.5)
                running = time.monotonic() - killed
                moving.start()
                wait_for(moving, 300, f"local training moving after {task} killed", interval=0.5)
                seen[task].append({"running": running, "moving": time.monotonic() - killed})
                checkpoint = progress(runs_dir, earlier).get("checkpoint_step") or checkpoint
        finally:
            backend.teardown(ref)
    return seen


def node_recoveries(work: Path, runs: int, steps: int) -> list[Recovery]:
    storage, plane = work / "storage", work / "plane"
    subprocess.run([sys.executable, str(KUBE_SCRIPT), "up", str(plane), "--nodes", "3", "--storage", str(storage),
                    "--owner-pid", str(os.getpid())], check=True, stdout=subprocess.DEVNULL)
    recoveries = []
    try:
        for run in range(runs):
            faults = Faults(plane, Faults.pods_now(plane))
            dag_run = ScheduledRun(work / f"airflow-{run}", plane, steps)
            try:
                dag_run.trigger()
                checkpoint = 500
                for name, fault, task in FAULTS:
                    recovery = faults.fault(fault, task, checkpoint)
                    print(f"run {run + 1}: {name}: {recovery.describe()}", flush=True)
                    faults.restore(recovery)  # by the fault it undoes, before it is named for the table
                    recovery.fault = name
                    recoveries.append(recovery)
                    checkpoint = faults.progress().get("checkpoint_step") or checkpoint
                state = wait_for(dag_run.state, 1800, "the DAG run's end", interval=2)
                if state != "success":
                    raise SystemExit(f"run {run + 1}: the DAG run ended {state}:\n{dag_run.task_logs()[-4000:]}")
            finally:
                dag_run.stop()
    finally:
        subprocess.run([sys.executable, str(KUBE_SCRIPT), "down", str(plane)], check=False)
    return recoveries


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f}" if values else "      -"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="DAG runs with every fault (and local kills per task)")
    parser.add_argument("--steps", type=int, default=100_000, help="the demo DAG's steps: outlasting the five faults")
    parser.add_argument("--local-steps", type=int, default=40_000, help="the local group's steps: outlasting 3 kills")
    args = parser.parse_args()
    if args.runs < 1:
        raise SystemExit(f"--runs must be at least 1, not {args.runs}")
    if os.geteuid() != 0:
        raise SystemExit("a real node's kubelet and containerd run as root: run this as root")
    work = Path(tempfile.mkdtemp(prefix="bench-node-loss-"))
    work.chmod(0o755)  # the pods' user reaches the storage folder at its own path
    try:
        local = local_recoveries(work / "local", args.runs, args.local_steps)
        nodes = node_recoveries(work, args.runs, args.steps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nseconds from the fault, medians of {args.runs} run(s); 3 nodes, the demo DAG, 1 ps + 2 workers")
    print(f"{'fault':18} {'NotReady':>8} {'evicted':>8} {'released':>8} {'running':>8} {'moving':>8}   "
          f"local SIGKILL: running  moving   ratio (moving)")
    for name, _fault, task in FAULTS:
        mine = [r for r in nodes if r.fault == name]
        column = {mark: [r.marks[mark] for r in mine if mark in r.marks] for mark in MARKS}
        base = [m["moving"] for m in local[task]]
        ratio = statistics.median(column["moving"]) / statistics.median(base) if column["moving"] and base else None
        print(f"{name:18} " + " ".join(f"{_median(column[mark]):>8}" for mark in MARKS)
              + f"   {task:8} {_median([m['running'] for m in local[task]])} {_median(base)}   "
              + (f"{ratio:.1f}x" if ratio is not None else "-"))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
