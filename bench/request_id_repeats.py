"""Experiment: TensorFlow's RunGraph request ids repeat, and a repeat can hang a step for ever.

TensorFlow 2.21 (``GetUniqueRequestId``, request_id.cc) draws each RunGraph request id from
``tsl::random::ThreadLocalNew64``: a per-thread ``std::mt19937_64`` seeded with ONE 32-bit value
from ``std::random_device``. The master runs every step in a thread of its own
(``Master::RunStep`` -> ``SchedClosure`` -> ``Env::SchedClosure``, which starts a new
``std::thread``), so the id a step sends to a given partition is one of only 2**32 values, and a
worker refuses an id it saw among its last 100,000 RunGraph requests ("The same RunGraph
(Worker) request was received twice", recent_request_ids.cc). See bench/README.md.

This script shows it in minutes by narrowing ``std::random_device`` to ``--seeds`` values (a
small C library preloaded into a ps and a worker process; needs gcc), and prints the odds for
the real 2**32 seeds:

1. baseline, real seeds: ``--steps`` steps of a worker+ps graph: no refusal;
2. narrowed seeds, the same graph: refusals at the birthday rate (steps^2 / 2 / seeds), each
   reported at once (AbortedError), which training recovers from by recreating the session;
3. narrowed seeds, a worker-only graph alternating with a worker+ps graph: when a repeated id is
   refused by the worker itself before the request to the ps is sent, the master's cancel misses
   that call and the step hangs although it carries ``timeout_in_ms`` (the hang of long runs).

    .venv/bin/python bench/request_id_repeats.py            # about 3-5 minutes on a loaded machine
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SHIM = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
/* std::random_device::_M_getval, narrowed to NARROW_SEEDS values. */
unsigned int _ZNSt13random_device9_M_getvalEv(void *self) {
  unsigned int v = 0;
  int fd = open("/dev/urandom", O_RDONLY);
  (void)self;
  if (fd >= 0) { if (read(fd, &v, sizeof v) != sizeof v) v = 0; close(fd); }
  const char *n = getenv("NARROW_SEEDS");
  unsigned long k = n ? strtoul(n, 0, 10) : 0;
  return k ? v % k : v;
}
"""
TRACKED = 100_000
"""RunGraph request ids a TensorFlow worker remembers (``Worker::recent_request_ids_``)."""


def odds_of_a_repeat(requests: int, seeds: float = 2.0**32, tracked: int = TRACKED) -> float:
    """Chance that one of ``requests`` ids (one per step, at one partition position) repeats one
    the task still remembers."""
    pairs = sum(min(i, tracked) for i in range(requests)) if requests < 10**6 else requests * tracked
    return 1 - math.exp(-pairs / seeds)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_ps(spec: dict) -> None:
    import tensorflow as tf

    tf.distribute.Server(tf.train.ClusterSpec(spec), job_name="ps", task_index=0).join()


def run_worker(mode: str, steps: int, timeout_ms: int) -> dict:
    """One worker (master and worker in this process) and a ps process; ``mode`` "same" runs one
    worker+ps graph, "alternate" a worker-only graph then a worker+ps graph each step."""
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    spec = {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"]}
    ps = subprocess.Popen([sys.executable, __file__, "--serve-ps", json.dumps(spec)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name="worker", task_index=0)
        with tf.device("/job:worker/task:0"):
            local_only = tf.random.uniform([]) + 1.0
            x = tf.random.uniform([]) * 2.0
        with tf.device("/job:ps/task:0"):
            v = tf.compat.v1.get_variable("v", initializer=1.0)
            both = tf.compat.v1.assign_add(v, x * 1e-6)
        session = tf.compat.v1.Session(server.target)
        session.run(tf.compat.v1.global_variables_initializer())  # waits for the ps to start
        graphs = [both] if mode == "same" else [local_only, both]
        options = tf.compat.v1.RunOptions(timeout_in_ms=timeout_ms)
        counts = {"steps": 0, "refused": 0, "other_errors": 0}
        example = ""
        for _ in range(steps):
            for fetch in graphs:
                outcome: dict = {}

                def step(fetch=fetch, outcome=outcome):
                    try:
                        session.run(fetch, options=options)
                    except tf.errors.OpError as exc:
                        outcome["error"] = exc

                runner = threading.Thread(target=step, daemon=True)
                began = time.monotonic()
                runner.start()
                runner.join(timeout_ms / 1000 + 20)
                if runner.is_alive():
                    return {**counts, "hung": True, "hung_secs": round(time.monotonic() - began),
                            "timeout_secs": timeout_ms / 1000, "refusal": example}
                counts["steps"] += 1
                error = outcome.get("error")
                if error is not None and "received twice" in str(error):
                    counts["refused"] += 1
                    example = example or next(line for line in str(error).splitlines() if "received twice" in line)[:120]
                elif error is not None:
                    counts["other_errors"] += 1
        return {**counts, "hung": False, "refusal": example}
    finally:
        ps.kill()


def child(args, env: dict) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", args[0], str(args[1]), str(args[2])],
                          env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"the experiment's worker failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=4096, help="narrowed seed space of runs 2 and 3")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--serve-ps", help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_ps:
        serve_ps(json.loads(args.serve_ps))
        return 0
    if args.worker:
        print(json.dumps(run_worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))), flush=True)
        os._exit(0)  # the session's threads may still wait on a hung step

    print("odds that a task meets a repeated request id in one run (real 2**32 seeds, one partition position):")
    for steps in (10_000, 30_000, 60_000, 100_000, 200_000):
        print(f"  {steps:>7} RunGraph requests: {odds_of_a_repeat(steps):.1%}")
    if not shutil.which("gcc"):
        print("gcc is not installed: the experiment needs it to build the seed-narrowing library")
        return 2
    work = Path(tempfile.mkdtemp(prefix="request-ids-"))
    try:
        (work / "narrow.c").write_text(SHIM)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(work / "narrow.so"), str(work / "narrow.c")],
                       check=True)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        narrowed = dict(env, LD_PRELOAD=str(work / "narrow.so"), NARROW_SEEDS=str(args.seeds))
        started = time.monotonic()
        baseline = child(("same", args.steps, 20000), env)
        print(json.dumps({"run": "1 baseline (2**32 seeds)", **baseline}), flush=True)
        repeats = child(("same", args.steps, 20000), narrowed)
        expected = sum(min(i, TRACKED) for i in range(args.steps)) / args.seeds
        print(json.dumps({"run": f"2 one graph, {args.seeds} seeds", **repeats,
                          "expected_refusals": round(expected, 1),
                          "ratio_refused_to_baseline": f"{repeats['refused']}:{baseline['refused']}"}), flush=True)
        hang = child(("alternate", args.steps, 5000), dict(narrowed, NARROW_SEEDS="64"))
        print(json.dumps({"run": "3 worker-only and worker+ps graphs, 64 seeds", **hang}), flush=True)
        print(f"{time.monotonic() - started:.0f} s", flush=True)
        return 0 if hang["hung"] and repeats["refused"] and not baseline["refused"] else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
