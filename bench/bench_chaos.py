"""A long local run under a schedule of random faults, against the same run with no faults in the
same session (1 ps + 2 workers, the seed's linear regression, checkpoints every second).

Baseline: the run without faults. Ours: the same run while faults land at random times (seeded)
between 10% and 70% of the baseline's duration: SIGKILL, SIGSTOP (left frozen: the group must
notice by itself) or a network cut (every packet to or from the task's port throttled to a byte a
second inside the group's network namespace, restored once the task was replaced or after 120 s),
each of a random task (the ps or a worker). Prints whether each run finished, their final eval
loss and its ratio, each fault with how long until the task was replaced, and the time lost per
fault ((chaos wall time - baseline wall time) / faults); exits 1 unless both runs finished with
final eval losses within ``--tolerance`` of each other.

Usage: ``.venv/bin/python bench/bench_chaos.py [--steps 40000] [--faults 4] [--seed 1] [--tolerance 0.05] [--workdir DIR]``
(root, for the network cuts: ``nsenter`` and ``tc`` in the group's namespace).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.wait import run_group
from airflow_tf.cluster import GroupSpec, TrainingConfig
from airflow_tf.data import prepare_dataset
from airflow_tf.data.samples import write_linear_regression_csv
from airflow_tf.files import read_json
from airflow_tf.serving.evaluate import evaluate_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from processes import can_cut, cut_port, restore_network  # noqa: E402  the tests' way to cut a task off

KINDS = ("SIGKILL", "SIGSTOP", "network cut")
TASKS = ("ps-0", "worker-0", "worker-1")
WAIT_FOR_REPLACEMENT = 120.0
"""How long a fault waits for its task to be replaced before the next (a cut is restored then)."""


def spec(name: str, dataset: str, run_dir: Path, steps: int) -> GroupSpec:
    config = TrainingConfig(dataset=dataset, run_dir=str(run_dir), steps=steps, batch_size=32, learning_rate=0.05,
                            checkpoint_every_secs=1.0, log_every_secs=1.0)
    # A budget for every fault the schedule may aim at one task, and one to spare.
    return GroupSpec.for_training(name, config, ps=1, workers=2, backoff_limit=10)


class Chaos:
    """Lands the scheduled faults on a running group and records how each ended."""

    def __init__(self, backend: LocalBackend, name: str, schedule: list[tuple[float, str, str]]) -> None:
        self.backend, self.name, self.schedule = backend, name, schedule
        self.started = 0.0
        self.ref = None
        self.report: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def launched(self, ref) -> None:
        self.ref, self.started = ref, time.monotonic()
        self.thread.start()

    def restarts(self, task: str) -> int:
        status = self.backend.status(self.ref)
        found = next((t for t in status.tasks if t.name == f"{self.name}-{task}"), None)
        return found.restarts if found else 0

    def run(self) -> None:
        for at, kind, task in self.schedule:
            time.sleep(max(0.0, self.started + at - time.monotonic()))
            state = read_json(self.backend.state_dir / self.name / "state.json", missing_ok=True) or {}
            process = state.get("processes", {}).get(f"{self.name}-{task}")
            if state.get("supervisor", {}).get("state") != "running" or process is None:
                self.report.append(f"  {at:6.0f} s  {kind:11} {task:8}  skipped: the task was not running")
                continue
            before, landed = self.restarts(task), time.monotonic()
            supervisor = state["supervisor"]["pid"]
            if kind == "network cut":
                cut_port(supervisor, process["port"])
            else:
                os.kill(process["pid"], signal.SIGKILL if kind == "SIGKILL" else signal.SIGSTOP)
            while self.restarts(task) == before and time.monotonic() - landed < WAIT_FOR_REPLACEMENT:
                time.sleep(0.5)
            replaced = time.monotonic() - landed
            if kind == "network cut":
                restore_network(supervisor)
            outcome = f"replaced after {replaced:.1f} s" if self.restarts(task) > before else "not replaced"
            self.report.append(f"  {at:6.0f} s  {kind:11} {task:8}  {outcome}")


def timed_run(backend: LocalBackend, group: GroupSpec, dataset: str, chaos: Chaos | None = None) -> tuple[bool, float, float | None]:
    started = time.monotonic()
    result = run_group(backend, group, on_launched=chaos.launched if chaos else None, interval=1.0)
    took = time.monotonic() - started
    if not result.outcome.succeeded:
        print(result.report)
        return False, took, None
    metrics = evaluate_checkpoint(group.training.run_dir, dataset, group.training, plot=False)["metrics"]
    return True, took, metrics.get("loss", metrics.get("mse"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--faults", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="largest relative difference of the final eval losses that passes (default 0.05)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    csv = write_linear_regression_csv(workdir / "linear.csv", rows=20_000, seed=1)
    dataset = prepare_dataset(csv, workdir / "datasets", name="linear", label="y", shards=4)["dataset_uri"]
    backend = LocalBackend(workdir / "groups")

    print(f"baseline: {args.steps} steps, no faults ...", flush=True)
    calm = spec("calm", dataset, workdir / "calm", args.steps)
    calm_ok, calm_secs, calm_loss = timed_run(backend, calm, dataset)
    print(f"  finished={calm_ok} wall={calm_secs:.0f} s eval loss={calm_loss}", flush=True)

    rng = random.Random(args.seed)
    times = sorted(rng.uniform(0.1, 0.7) * calm_secs for _ in range(args.faults))
    kinds = KINDS if can_cut() else tuple(k for k in KINDS if k != "network cut")
    schedule = [(at, rng.choice(kinds), rng.choice(TASKS)) for at in times]
    print(f"chaos: the same run with {args.faults} faults (seed {args.seed}) ...", flush=True)
    wild = spec("chaos", dataset, workdir / "chaos", args.steps)
    chaos = Chaos(backend, "chaos", schedule)
    wild_ok, wild_secs, wild_loss = timed_run(backend, wild, dataset, chaos)
    chaos.thread.join(timeout=WAIT_FOR_REPLACEMENT)
    print(f"  finished={wild_ok} wall={wild_secs:.0f} s eval loss={wild_loss}")
    print("\n".join(chaos.report))
    ratio = f"{wild_loss / calm_loss:.3f}" if calm_loss and wild_loss is not None else "n/a"
    print(f"\nfinished: baseline {calm_ok}, chaos {wild_ok}")
    print(f"final eval loss: baseline {calm_loss}, chaos {wild_loss}, ratio {ratio}")
    print(f"time lost per fault: {(wild_secs - calm_secs) / max(1, args.faults):.1f} s "
          f"(wall {calm_secs:.0f} s -> {wild_secs:.0f} s)")
    close = bool(calm_loss and wild_loss is not None and abs(wild_loss / calm_loss - 1) <= args.tolerance)
    print(f"within {args.tolerance:.0%} of the fault-free loss: {close}")
    return 0 if calm_ok and wild_ok and close else 1


if __name__ == "__main__":
    sys.exit(main())
