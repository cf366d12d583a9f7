"""What loading TensorFlow costs a process of ours: an earlier commit against the current code,
in the same run.

Each load runs in a fresh interpreter, as the process that makes it does: a group's fork server
(``forkserver.preload``: TensorFlow, Keras and the training code), a ps (its environment, then
``startup.import_tensorflow_server``) and the export's load check
(``startup.import_tensorflow(keras=False)``). The baseline is ``--baseline`` from a temporary
worktree (``history.py``), alternated with the working copy ``--rounds`` times; each child reports
the CPU its process used from its start (``time.process_time``). Prints the medians and ours over
the baseline.

``.venv/bin/python bench/bench_tf_load.py [--rounds 7] [--baseline f73e84b]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import history

LOADS = {
    "fork server": "from airflow_tf.runtime.forkserver import preload; preload()",
    "ps": ("from airflow_tf.runtime.main import set_tensorflow_environment; set_tensorflow_environment('ps'); "
           "from airflow_tf.runtime.startup import import_tensorflow_server; import_tensorflow_server()"),
    "load check": "from airflow_tf.runtime.startup import import_tensorflow; import_tensorflow(keras=False)",
}
REPORT = ("; import json, os, sys, time; print(json.dumps({'cpu': time.process_time(), "
          "'from': os.path.dirname(sys.modules['airflow_tf'].__file__)}))")


def _load(code: str, tree: Path | None) -> float:
    """CPU seconds of a fresh interpreter that makes one load, from ``tree`` (None: the working copy)."""
    done = subprocess.run([sys.executable, "-c", code + REPORT], cwd=tree or history.REPO, capture_output=True,
                          text=True, env=history.environment(tree) if tree else None)
    if done.returncode:
        raise SystemExit(f"the load failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    history.check_imported_from(tree or history.REPO, report["from"])
    return report["cpu"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--baseline", default="f73e84b", help="the commit to compare with (default f73e84b)")
    args = parser.parse_args(argv)
    cpu: dict[tuple[str, str], list[float]] = {}
    with history.checkout(args.baseline) as tree:
        for round_ in range(1, args.rounds + 1):
            for load, code in LOADS.items():
                for name, source in (("baseline", tree), ("ours", None)):
                    cpu.setdefault((load, name), []).append(_load(code, source))
            print(f"round {round_}: " + ", ".join(f"{load} {cpu[load, 'baseline'][-1]:.2f}/{cpu[load, 'ours'][-1]:.2f} s"
                                                  for load in LOADS), flush=True)
    print(f"\nCPU of a fresh process that loads TensorFlow; medians of {args.rounds} rounds (baseline {args.baseline})")
    for load in LOADS:
        base, ours = statistics.median(cpu[load, "baseline"]), statistics.median(cpu[load, "ours"])
        print(f"  {load:12} baseline {base:5.2f} s  ours {ours:5.2f} s  ours / baseline {ours / base:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
