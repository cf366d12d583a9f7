"""``python -m airflow_tf.data part --plan DIR --index N [--result-file PATH]``: one part of a
partitioned prepare, in a process of its own (on Kubernetes, a pod on the training image that
mounts the shared volume the plan is on).

The part streams its share of the input into the plan's directory, exactly as
:func:`airflow_tf.data.parts.prepare_part` does in an Airflow task, printing its progress
as it goes. Its result, a JSON object (``index``, ``rows``, ``counts``), goes to
``--result-file`` (on Kubernetes the container's termination message) and, after
:data:`~airflow_tf.cluster.components.RESULT_MARKER`, to the log's last line.

Exit status 0 with the result; 2 (:data:`~airflow_tf.cluster.components.REFUSED_EXIT`) when the
data or the plan is refused (a bad value, a missing plan: a retry would fail again), with the
reason on stderr; any other failure (storage, memory) exits 1.
"""

from __future__ import annotations

import argparse
import sys

from airflow_tf.cluster.components import REFUSED_EXIT, hand_back_result
from airflow_tf.deprecation import REMOVED_IN

from .errors import DataError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_tf.data", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    part = commands.add_parser("part", help="write one part of a partitioned prepare")
    part.add_argument("--plan", required=True, help="the plan's directory (or its plan.json)")
    part.add_argument("--index", required=True, type=int, help="the part's index, from 0")
    part.add_argument("--encode-threads", dest="encode_threads", type=int,
                      help="encoding threads (default: the plan's, else the CPUs this process may use)")
    part.add_argument("--workers", dest="workers", type=int, help=argparse.SUPPRESS)  # its name before 0.2
    part.add_argument("--progress-every", dest="progress_every", type=float, default=5.0,
                      help="seconds between progress lines")
    part.add_argument("--result-file", dest="result_file",
                      help="write the result (a JSON object) here, e.g. the container's termination message")
    args = parser.parse_args(argv)
    from .parts import prepare_part

    if args.workers is not None:  # Python hides DeprecationWarning here by default: said on stderr
        print(f"--workers is deprecated and will be removed in airflow-tf {REMOVED_IN}: use --encode-threads",
              file=sys.stderr, flush=True)
        args.encode_threads = args.encode_threads or args.workers
    try:
        result = prepare_part(args.plan, args.index, encode_threads=args.encode_threads,
                              progress=lambda p: print(f"part {args.index}: {p.describe()}", flush=True),
                              progress_every=args.progress_every)
    except DataError as e:
        print(f"part {args.index} refused: {e}", file=sys.stderr, flush=True)
        return REFUSED_EXIT
    hand_back_result(result, args.result_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
