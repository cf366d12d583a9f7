"""Stress: several long ``airflow-tf run`` groups at once, to catch a chief that stops inside a step.

Each round starts ``--parallel`` runs of ``--steps`` global steps (2 workers, 1 ps each) on the
seed's linear dataset and watches every run's ``progress.json``. A run whose global step does not
move for ``--stall-secs`` is reported as STALLED, with its tasks' thread stacks (gdb, when it is
installed) and the TensorFlow warnings of its logs; it is then stopped. Prints one line per run
and a JSON summary.

    .venv/bin/python bench/stress_long_runs.py --rounds 3 --parallel 3 --steps 60000

TensorFlow's C++ warnings (``RunStep still blocked``, ``RunGraph ... received twice``) are kept in
the task logs (TF_CPP_MIN_LOG_LEVEL=1)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TF_WARNINGS = re.compile(r"RunStep still blocked|received twice|No response from RunGraph|DEADLINE|Deadline|"
                         r"UnavailableError|operation_timeout|Timed out|recreated|status=failed", re.I)


def prepare(root: Path) -> str:
    from airflow_tf.data import prepare_dataset
    from airflow_tf.data.samples import write_linear_regression_csv

    csv = write_linear_regression_csv(root / "linear.csv", rows=20000, seed=1)
    return prepare_dataset(csv, root / "datasets", name="linear", label="y", shards=4)["dataset_uri"]


def progress(run_dir: Path) -> int | None:
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError):
        return None


def stacks(state_dir: Path) -> str:
    """Thread stacks of every runtime process started under ``state_dir`` (its TF_CONFIG group)."""
    if not shutil.which("gdb"):
        return "(gdb not installed: no stacks)"
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"airflow_tf.runtime" in b" ".join(cmdline) and str(state_dir).encode() in environ:
            try:  # attaching to a TensorFlow process's ~100 threads takes minutes on a loaded machine
                result = subprocess.run(["gdb", "-p", proc.name, "-batch", "-ex", "thread apply all bt 12"],
                                        capture_output=True, text=True, timeout=900)
                stack = result.stdout[-200000:]
            except subprocess.TimeoutExpired:
                stack = "(gdb timed out)"
            out.append(f"--- pid {proc.name} {b' '.join(cmdline[-6:]).decode(errors='replace')}\n{stack}")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60000)
    parser.add_argument("--stall-secs", type=float, default=90.0)
    parser.add_argument("--checkpoint-every-secs", type=float, default=10.0)
    parser.add_argument("--extra", default="", help="more airflow-tf run flags, e.g. '--operation-timeout-secs 30'")
    parser.add_argument("--keep", help="directory to keep runs and logs in (default: a temporary one)")
    args = parser.parse_args()

    root = Path(args.keep or tempfile.mkdtemp(prefix="stress-"))
    root.mkdir(parents=True, exist_ok=True)
    dataset = prepare(root)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="1")
    results = []
    for round_no in range(args.rounds):
        runs = []
        for i in range(args.parallel):
            name = f"stress-{round_no}-{i}"
            run_dir, state_dir = root / "runs" / name, root / "state" / name
            state_dir.mkdir(parents=True, exist_ok=True)
            out = open(root / f"{name}.out", "w")
            cmd = [sys.executable, "-m", "airflow_tf.cli", "run", "--dataset", dataset, "--run-dir", str(run_dir),
                   "--name", name, "--state-dir", str(state_dir), "--steps", str(args.steps),
                   "--workers", "2", "--ps", "1", "--learning-rate", "0.01",
                   "--checkpoint-every-secs", str(args.checkpoint_every_secs), *args.extra.split()]
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            runs.append({"name": name, "proc": proc, "run_dir": run_dir, "state_dir": state_dir,
                         "start": time.monotonic(), "step": None, "moved": time.monotonic()})
        while any(r["proc"].poll() is None for r in runs):
            time.sleep(2)
            for r in runs:
                if r["proc"].poll() is not None or "stalled" in r:
                    continue
                step = progress(r["run_dir"])
                if step != r["step"]:
                    r["step"], r["moved"] = step, time.monotonic()
                elif time.monotonic() - r["moved"] > args.stall_secs:
                    r["stalled"] = step
                    (root / f"{r['name']}.stacks").write_text(stacks(r["state_dir"]))
                    os.killpg(r["proc"].pid, signal.SIGTERM)
        for r in runs:
            warnings = []
            # A finished group's logs are copied to <run_dir>/logs/attempt-N/ and its state removed.
            for log in [*r["state_dir"].rglob("*.log"), *(r["run_dir"] / "logs").rglob("*.log")]:
                warnings += [f"{log.name}: {line}" for line in log.read_text(errors="replace").splitlines()
                             if TF_WARNINGS.search(line)]
            result = {"name": r["name"], "exit": r["proc"].returncode, "seconds": round(time.monotonic() - r["start"]),
                      "final_step": progress(r["run_dir"]), "stalled_at": r.get("stalled"),
                      "tf_warnings": warnings[:20]}
            results.append(result)
            print(json.dumps(result), flush=True)
    stalled = [r for r in results if r["stalled_at"] is not None]
    print(json.dumps({"runs": len(results), "stalled": len(stalled), "failed": sum(r["exit"] != 0 for r in results),
                      "root": str(root)}), flush=True)
    return 1 if stalled else 0


if __name__ == "__main__":
    sys.exit(main())
