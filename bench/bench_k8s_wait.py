"""Waiting for a Kubernetes training group: watch() against polling status(), same run.

Both wait for the same scripted group (1 ps + N workers; the workers start, then finish one
after another over ``--seconds``) served by the test suite's Kubernetes API emulator on
loopback, through the provider's hooks and the real clients:

* baseline: ``status()`` every ``--poll`` seconds, as a poke-mode sensor does;
* airflow-tf: ``watch()``, as the deferrable sensor's trigger does.

Prints, for each, the API requests made while waiting and the delay between the last worker
finishing and the waiter knowing the outcome, and the ratios. The workers' timeline is half
a poll interval out of step with the poller, its average case.
Usage: ``.venv/bin/python bench/bench_k8s_wait.py [--workers N] [--seconds S] [--poll P]``
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "backends"))

from kube_emulator import KubeEmulator  # noqa: E402

from airflow_tf.backends import get_backend  # noqa: E402
from airflow_tf.cluster import GroupSpec, TrainingConfig, group_outcome  # noqa: E402

NS = "bench"


def script(emu: KubeEmulator, group: str, workers: int, seconds: float, offset: float, finished: dict) -> None:
    """The cluster's side: everything starts, then the workers finish evenly spaced."""
    emu.run(NS, emu.pod(NS, f"{group}-ps", 0))  # pods are the Job controller's, named <job>-<index>-<random>
    for i in range(workers):
        emu.run(NS, emu.pod(NS, f"{group}-worker", i))
    time.sleep(offset)
    for i in range(workers):
        time.sleep(seconds / workers)
        emu.succeed(NS, emu.pod(NS, f"{group}-worker", i))
    finished["at"] = time.monotonic()


def wait_polling(backend, ref, poll: float) -> float:
    while not group_outcome(backend.status(ref)).done:
        time.sleep(poll)
    return time.monotonic()


def wait_watching(backend, ref) -> float:
    async def run() -> float:
        async for status in backend.watch(ref):
            if group_outcome(status).done:
                return time.monotonic()
        raise RuntimeError("watch ended before the group finished")

    return asyncio.run(run())


def measure(emu: KubeEmulator, backend, name: str, args, waiter) -> tuple[int, float]:
    spec = GroupSpec.for_training(name, TrainingConfig(dataset="/data/d", run_dir=f"/runs/{name}", steps=10),
                                  ps=1, workers=args.workers, image="tf:bench")
    ref = backend.launch(spec)
    before = len(emu.requests)
    finished: dict = {}
    # Half a poll interval out of step with the poller: its average case, not its best or worst.
    cluster = threading.Thread(target=script, args=(emu, name, args.workers, args.seconds, args.poll / 2, finished))
    cluster.start()
    known_at = waiter(backend, ref)
    cluster.join()
    requests = len(emu.requests) - before
    backend.teardown(ref)
    return requests, max(0.0, known_at - finished["at"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0, help="time over which the workers finish")
    parser.add_argument("--poll", type=float, default=5.0, help="baseline poke interval (the sensor's default)")
    args = parser.parse_args()

    emu = KubeEmulator().start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = str(emu.write_kubeconfig(Path(tmp) / "kubeconfig"))
            backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=config, namespace=NS)
            backend.launch(GroupSpec.for_training(  # warm-up: imports and connection, not measured
                "warmup", TrainingConfig(dataset="/d", run_dir="/r", steps=1), image="tf:bench"))
            poll_requests, poll_delay = measure(emu, backend, "poll", args, lambda b, r: wait_polling(b, r, args.poll))
            watch_requests, watch_delay = measure(emu, backend, "watch", args, wait_watching)
    finally:
        emu.stop()
    print(f"group: 1 ps + {args.workers} workers finishing over {args.seconds:g} s")
    print(f"baseline  status() every {args.poll:g} s: {poll_requests:4d} API requests, "
          f"outcome known {poll_delay * 1000:7.1f} ms after the last worker finished")
    print(f"airflow-tf watch():              {watch_requests:4d} API requests, "
          f"outcome known {watch_delay * 1000:7.1f} ms after the last worker finished")
    print(f"ratio: {poll_requests / max(1, watch_requests):.1f}x fewer requests, "
          f"{poll_delay / max(watch_delay, 1e-3):.0f}x sooner")


if __name__ == "__main__":
    main()
