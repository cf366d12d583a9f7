"""Waiting for a Kubernetes training group: watch() against polling status(), on the same group.

A private plane with one real node (``scripts/kube up DIR --nodes 1``: kubelet, containerd, the
training image loaded) runs, each round, a group of 1 ps + N workers from the training image in a
namespace enforcing Pod Security ``restricted``, launched by the backend as a user's would be,
with the containers' command replaced by the image's ``/bin/sh``: the workers sleep a staggered
time and exit 0, so they finish one after another over ``--seconds``; the ps sleeps until the
teardown. Two waiters follow that same group at once, each through its own request-counting
proxy (tests/k8s/api_faults.py) in front of the API server:

* baseline: ``status()`` every ``--poll`` seconds, as a poke-mode sensor does;
* airflow-tf: ``watch()``, as the deferrable sensor's trigger does.

Prints, per round and as medians, the API requests each made while waiting and how long after the
last worker finished each knew the outcome ("finished": when a third client, watching the pods
with the admin's credentials, saw the last worker's container terminated).

    .venv/bin/python bench/bench_k8s_wait.py [--workers 4] [--seconds 20] [--poll 5] [--rounds 3]   (as root)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from airflow_tf.backends import get_backend  # noqa: E402
from airflow_tf.cluster import GroupSpec, TrainingConfig, group_outcome  # noqa: E402
from tests.k8s.api_faults import ApiFaults  # noqa: E402
from tests.k8s.plane import Plane  # noqa: E402
from tests.k8s.scripted import scripted_manifests, training_image  # noqa: E402

PS_SCRIPT = "trap 'exit 0' TERM\nwhile :; do sleep 1; done\n"


def worker_script(step: float) -> str:
    """Worker i sleeps (i + 1) * step seconds (JOB_COMPLETION_INDEX is the Indexed Job's) and exits 0."""
    step_ms = round(step * 1000)
    return (f"ms=$(( (JOB_COMPLETION_INDEX + 1) * {step_ms} ))\n"
            "sleep \"$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))\"\nexit 0\n")


def staggered(step: float):
    """What the backend's Job manifests become: the training image's containers run the scripts."""

    def rewrite(job: dict) -> dict:
        job = scripted_manifests(job)  # the probes dropped: no TensorFlow server answers them
        for container in job["spec"]["template"]["spec"]["containers"]:
            script = worker_script(step) if container["name"] == "worker" else PS_SCRIPT
            container["command"] = ["/bin/sh", "-c", script]
        return job

    return rewrite


def last_worker_finished(plane: Plane, namespace: str, group: str, workers: int, stop: threading.Event,
                         seen: dict) -> None:
    """The moment the admin's own watch saw the last of the group's workers terminated."""
    from kubernetes import watch

    done: set[str] = set()
    while not stop.is_set() and len(done) < workers:
        for event in watch.Watch().stream(plane.core.list_namespaced_pod, namespace, timeout_seconds=5,
                                          label_selector=f"airflow-tf/group={group},airflow-tf/role=worker"):
            pod = event["object"]
            if any(s.state.terminated and s.state.terminated.exit_code == 0 for s in pod.status.container_statuses or []):
                done.add(pod.metadata.labels["batch.kubernetes.io/job-completion-index"])
                if len(done) == workers:
                    seen["at"] = time.monotonic()
                    return


def wait_polling(backend, ref, poll: float) -> float:
    while not group_outcome(backend.status(ref), ref.success_policy).done:
        time.sleep(poll)
    return time.monotonic()


def wait_watching(backend, ref) -> float:
    async def run() -> float:
        async for status in backend.watch(ref):
            if group_outcome(status, ref.success_policy).done:
                return time.monotonic()
        raise RuntimeError("watch ended before the group finished")

    return asyncio.run(run())


def one_round(plane: Plane, namespace, launcher, poller, watcher, proxies, args, name: str) -> dict:
    spec = GroupSpec.for_training(name, TrainingConfig(dataset="/data/d", run_dir=f"/runs/{name}", steps=10),
                                  ps=1, workers=args.workers, image=training_image())
    ref = launcher.launch(spec)
    before = [len(p.requests()) for p in proxies]  # the waiters' requests from here on
    finished: dict = {}
    stop = threading.Event()
    observer = threading.Thread(target=last_worker_finished,
                                args=(plane, namespace.ns, name, args.workers, stop, finished))
    observer.start()
    known: dict = {}
    polling = threading.Thread(target=lambda: known.__setitem__("poll", wait_polling(poller, ref, args.poll)),
                               daemon=True)
    polling.start()
    known["watch"] = wait_watching(watcher, ref)
    polling.join()
    stop.set()
    observer.join()
    made = [p.requests()[n:] for p, n in zip(proxies, before, strict=True)]
    launcher.teardown(ref)

    def kinds(requests) -> dict[str, int]:
        return dict(collections.Counter(f"{r.verb} {r.resource}" for r in requests).most_common())

    return {"group": name, "poll_requests": len(made[0]), "watch_requests": len(made[1]),
            "poll_late_s": round(known["poll"] - finished["at"], 3),
            "watch_late_s": round(known["watch"] - finished["at"], 3),
            "poll_kinds": kinds(made[0]), "watch_kinds": kinds(made[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0, help="time over which the workers finish")
    parser.add_argument("--poll", type=float, default=5.0, help="baseline poke interval (the sensor's default)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kubeconfig", help="an admin kubeconfig of a plane with nodes already up "
                                             "(default: start one, scripts/kube up DIR --nodes 1)")
    args = parser.parse_args()
    for option in ("workers", "rounds"):
        if getattr(args, option) < 1:
            parser.error(f"--{option} {getattr(args, option)}: give a number from 1")
    if args.seconds <= 0 or args.poll <= 0:
        parser.error("--seconds and --poll: give a number of seconds above 0")
    if args.kubeconfig is None and os.geteuid() != 0:
        parser.error("a real node's kubelet and containerd run as root: run as root, or give --kubeconfig")

    from kubernetes import client

    create_job = client.BatchV1Api.create_namespaced_job
    rewrite = staggered(args.seconds / args.workers)
    client.BatchV1Api.create_namespaced_job = lambda self, ns, body, **kw: create_job(self, ns, rewrite(body), **kw)

    with tempfile.TemporaryDirectory() as tmp:
        plane = Plane(Path(args.kubeconfig)) if args.kubeconfig else Plane.start(Path(tmp) / "plane", "--nodes", "1")
        try:
            namespace = plane.new_namespace("bench-wait", Path(tmp))
            with ApiFaults(namespace.kubeconfig, Path(tmp) / "poll") as poll_proxy, \
                    ApiFaults(namespace.kubeconfig, Path(tmp) / "watch") as watch_proxy:

                def backend(kubeconfig: Path):
                    return get_backend("kubernetes", kubernetes_conn_id=None, config_file=str(kubeconfig),
                                       namespace=namespace.ns)

                launcher = backend(namespace.kubeconfig)
                poller = backend(poll_proxy.write_kubeconfig(Path(tmp) / "poll.kubeconfig"))
                watcher = backend(watch_proxy.write_kubeconfig(Path(tmp) / "watch.kubeconfig"))
                rounds = []
                for i in range(args.rounds):
                    rounds.append(one_round(plane, namespace, launcher, poller, watcher, (poll_proxy, watch_proxy),
                                            args, f"wait-{i}"))
                    print(json.dumps(rounds[-1]), flush=True)
            plane.delete_namespace(namespace.ns)
        finally:
            if not args.kubeconfig:
                plane.stop()

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    print(f"{dt.date.today()}: group of 1 ps + {args.workers} workers (training image, real node) finishing over "
          f"{args.seconds:g} s; {args.rounds} round(s), medians")
    print(f"baseline  status() every {args.poll:g} s: {median('poll_requests'):5.0f} API requests, "
          f"outcome known {median('poll_late_s') * 1000:7.0f} ms after the last worker finished")
    print(f"airflow-tf watch():              {median('watch_requests'):5.0f} API requests, "
          f"outcome known {median('watch_late_s') * 1000:7.0f} ms after the last worker finished")
    print(f"watch() / polling: {median('watch_requests') / max(1, median('poll_requests')):.2f}x the requests, "
          f"{median('watch_late_s') / max(median('poll_late_s'), 1e-3):.2f}x the delay")


if __name__ == "__main__":
    main()
