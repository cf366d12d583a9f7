"""Stress: several long ``airflow-tf run`` groups at once, to catch a chief that stops inside a step.

Each round starts ``--parallel`` runs of ``--steps`` global steps (2 workers, 1 ps each) on the
seed's linear dataset and watches every run's ``progress.json``. A run whose global step does not
move for ``--stall-secs`` is reported as STALLED, with its tasks' thread stacks (gdb, when it is
installed) and the TensorFlow warnings of its logs; it is then stopped. Prints one line per run
and a JSON summary.

    .venv/bin/python bench/stress_long_runs.py --rounds 3 --parallel 3 --steps 60000

A stuck step the runtime cancels and recovers from (``stalled step recovered`` in a log, see
runtime/step_bound.py) is not a stall of the harness: each run's result lists those recoveries
with the time and the global steps each cost. ``--stall-secs`` (default 400 s, past the 300 s
cap of a step) catches only what the runtime did not recover.

TensorFlow's C++ warnings (``RunStep still blocked``, ``RunGraph ... received twice``,
``Retrying call for``) are kept in the task logs (TF_CPP_MIN_LOG_LEVEL=1). ``--vmodule`` turns on
TensorFlow's verbose logging for the named source files (``TF_CPP_VMODULE``, and then
TF_CPP_MIN_LOG_LEVEL=0, as verbose lines are INFO), ``--grpc-trace`` gRPC's tracers
(``GRPC_TRACE``, ``GRPC_VERBOSITY=debug``). ``--max-minutes`` stops the stress after that long
(runs still going are stopped and counted as cut, neither stalled nor finished)."""

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

TF_WARNINGS = ("RunStep still blocked", "received twice", "No response from RunGraph", "DEADLINE", "Deadline",
               "deadline", "UnavailableError", "operation_timeout", "Timed out", "timed out", "recreated",
               "status=failed", "Retrying call", "step stuck", "stalled step recovered", "step not cancelled")
"""Log text kept from a run's tasks (literal: a task's log can hold millions of lines)."""
RECOVERED = re.compile(r"stalled step recovered: the (?:step|checkpoint save) after global step (\d+): (.*?); the session "
                       r"was recreated at global step (\d+), ([\d.]+) s after")
SUSPECTS = {"received_twice": "received twice", "grpc_retries": "Retrying call for",
            "still_blocked": "RunStep still blocked", "repeated_request_id": "repeat of a RunGraph request id",
            "not_cancelled": "step not cancelled"}


def matching_lines(text: str) -> list[str]:
    """The lines of ``text`` holding any of TF_WARNINGS, in order, each once."""
    starts = set()
    for needle in TF_WARNINGS:
        at = text.find(needle)
        while at >= 0:
            start = text.rfind("\n", 0, at) + 1
            starts.add(start)
            end = text.find("\n", at)
            at = text.find(needle, end) if end >= 0 else -1
    lines = []
    for start in sorted(starts):
        end = text.find("\n", start)
        lines.append(text[start:] if end < 0 else text[start:end])
    return lines


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
        ours = b"airflow_tf.runtime" in b" ".join(cmdline) or cmdline[0].startswith(b"airflow-tf ")  # titled
        if ours and str(state_dir).encode() in environ:
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
    parser.add_argument("--stall-secs", type=float, default=400.0)
    parser.add_argument("--checkpoint-every-secs", type=float, default=10.0)
    parser.add_argument("--extra", default="", help="more airflow-tf run flags, e.g. '--operation-timeout-secs 30'")
    parser.add_argument("--keep", help="directory to keep runs and logs in (default: a temporary one)")
    parser.add_argument("--vmodule", default="", help="TF_CPP_VMODULE for the tasks, e.g. "
                        "'grpc_state=2,recent_request_ids=2,master_session=2,worker=2,grpc_remote_worker=2'")
    parser.add_argument("--grpc-trace", default="", help="GRPC_TRACE for the tasks, e.g. 'channel,subchannel,http'")
    parser.add_argument("--max-minutes", type=float, default=None, help="stop the whole stress after this long")
    args = parser.parse_args()
    deadline = time.monotonic() + args.max_minutes * 60 if args.max_minutes else None

    root = Path(args.keep or tempfile.mkdtemp(prefix="stress-"))
    root.mkdir(parents=True, exist_ok=True)
    dataset = prepare(root)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="1")
    pass_env: list[str] = []
    if args.vmodule:
        env.update(TF_CPP_VMODULE=args.vmodule, TF_CPP_MIN_LOG_LEVEL="0")  # TF_* reaches the tasks
    if args.grpc_trace:
        env.update(GRPC_TRACE=args.grpc_trace, GRPC_VERBOSITY="debug")
        pass_env = ["--pass-env", "GRPC_TRACE", "--pass-env", "GRPC_VERBOSITY"]
    results = []
    for round_no in range(args.rounds):
        if deadline is not None and time.monotonic() >= deadline:
            break
        runs = []
        for i in range(args.parallel):
            name = f"stress-{round_no}-{i}"
            run_dir, state_dir = root / "runs" / name, root / "state" / name
            state_dir.mkdir(parents=True, exist_ok=True)
            out = open(root / f"{name}.out", "w")
            cmd = [sys.executable, "-m", "airflow_tf.cli", "run", "--dataset", dataset, "--run-dir", str(run_dir),
                   "--name", name, "--state-dir", str(state_dir), "--steps", str(args.steps),
                   "--workers", "2", "--ps", "1", "--learning-rate", "0.01",
                   "--checkpoint-every-secs", str(args.checkpoint_every_secs), *pass_env, *args.extra.split()]
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            runs.append({"name": name, "proc": proc, "run_dir": run_dir, "state_dir": state_dir,
                         "start": time.monotonic(), "step": None, "moved": time.monotonic()})
        while any(r["proc"].poll() is None for r in runs):
            time.sleep(2)
            if deadline is not None and time.monotonic() >= deadline:
                for r in runs:
                    if r["proc"].poll() is None and "stalled" not in r:
                        r["cut"] = progress(r["run_dir"])
                        os.killpg(r["proc"].pid, signal.SIGTERM)
            for r in runs:
                if r["proc"].poll() is not None or "stalled" in r or "cut" in r:
                    continue
                step = progress(r["run_dir"])
                if step != r["step"]:
                    r["step"], r["moved"] = step, time.monotonic()
                elif time.monotonic() - r["moved"] > args.stall_secs:
                    r["stalled"] = step
                    (root / f"{r['name']}.stacks").write_text(stacks(r["state_dir"]))
                    os.killpg(r["proc"].pid, signal.SIGTERM)
        for r in runs:
            warnings, recovered, suspects = [], [], dict.fromkeys(SUSPECTS, 0)
            # A finished group's logs are copied to <run_dir>/logs/attempt-N/ and its state removed.
            for log in [*r["state_dir"].rglob("*.log"), *(r["run_dir"] / "logs").rglob("*.log")]:
                for line in matching_lines(log.read_text(errors="replace")):
                    warnings.append(f"{log.name}: {line[:400]}")
                    for key, needle in SUSPECTS.items():
                        suspects[key] += needle in line
                    if recovery := RECOVERED.search(line):
                        stuck_at, cause, resumed_at, lost = recovery.groups()
                        recovered.append({"task": log.stem, "stuck_after_step": int(stuck_at),
                                          "resumed_at_step": int(resumed_at), "steps_redone": int(stuck_at) - int(resumed_at),
                                          "lost_secs": float(lost), "cause": cause})
            result = {"name": r["name"], "exit": r["proc"].returncode, "seconds": round(time.monotonic() - r["start"]),
                      "final_step": progress(r["run_dir"]), "stalled_at": r.get("stalled"), "cut_at": r.get("cut"),
                      "recovered_stalls": recovered, **suspects, "tf_warnings": warnings[:20]}
            results.append(result)
            print(json.dumps(result), flush=True)
    stalled = [r for r in results if r["stalled_at"] is not None]
    cut = [r for r in results if r["cut_at"] is not None]
    recoveries = [s for r in results for s in r["recovered_stalls"]]
    print(json.dumps({"runs": len(results), "finished": sum(r["exit"] == 0 for r in results), "cut": len(cut),
                      "stalled": len(stalled),
                      "failed": sum(r["exit"] != 0 and r not in cut and r not in stalled for r in results),
                      "recovered_stalls": len(recoveries),
                      "max_lost_secs": max((s["lost_secs"] for s in recoveries), default=0),
                      "max_steps_redone": max((s["steps_redone"] for s in recoveries), default=0),
                      **{key: sum(r[key] for r in results) for key in SUSPECTS}, "root": str(root)}), flush=True)
    return 1 if stalled else 0


if __name__ == "__main__":
    sys.exit(main())
