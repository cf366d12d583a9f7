"""The health question every task of a group answers, asked from outside its process:
``python -m airflow_tf.runtime.health HOST:PORT [HOST:PORT ...] --timeout S``.

It asks each task's TensorFlow server for its status (``WorkerService.GetStatus``, the device
list every ps and worker serves), with a deadline. A live server answers in milliseconds; a
stopped (SIGSTOP), wedged or cut-off one does not, although the kernel may still accept its TCP
connections, which is why a port or process check is no health check here. It imports gRPC only,
never TensorFlow: a question costs a fraction of a second of CPU, the answer less.

Prints one line per task and exits 0 when every task answered, 1 otherwise (the Kubernetes
liveness probe's contract; the local supervisor reads the lines). The bound a task gets, and how
many questions in a row it may leave unanswered, are :class:`airflow_tf.cluster.HealthBounds`.

With ``--peers-answered FILE`` (a Kubernetes task's liveness probe) it also asks the group's other
tasks, named by the task's ``TF_CONFIG``, across the pod network, and keeps ``FILE`` while one of
them answers (removed while none does): the readiness probe reads it, so a task whose node's pod
network is cut turns not Ready while the others stay Ready. The exit status still answers for
the task's own server only."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from airflow_tf.cluster.spec import HEALTH_ANSWERED as ANSWERED

from .errors import TaskConfigError
from .task import task_from_env

GET_STATUS = "/tensorflow.WorkerService/GetStatus"
"""TensorFlow's gRPC method every server (ps or worker) serves; an empty request is valid."""


def ask(targets: list[str], timeout_secs: float) -> dict[str, str]:
    """For each ``host:port``, ``"answered in 0.004 s"`` or why it did not answer in ``timeout_secs``."""
    import grpc

    channels = {target: grpc.insecure_channel(target) for target in targets}
    try:
        started = time.monotonic()
        finished: dict[str, float] = {}
        # All at once: a frozen task costs the others nothing. Without wait_for_ready a server
        # still binding its port would be refused at once rather than given its deadline.
        calls = {target: channel.unary_unary(GET_STATUS).future(b"", timeout=timeout_secs, wait_for_ready=True)
                 for target, channel in channels.items()}
        for target, call in calls.items():
            call.add_done_callback(lambda _, target=target: finished.setdefault(target, time.monotonic()))
        answers = {}
        for target, call in calls.items():
            try:
                call.result()
                answers[target] = f"{ANSWERED} in {finished.get(target, time.monotonic()) - started:.3f} s"
            except grpc.RpcError as err:
                code = err.code()
                if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                    answers[target] = f"no answer within {timeout_secs:g} s"
                else:
                    answers[target] = f"{code.name}: {err.details()}"
        return answers
    finally:
        for channel in channels.values():
            channel.close()


def peers(environ: Mapping[str, str]) -> list[str]:
    """The addresses of the group's other tasks, from ``TF_CONFIG`` in ``environ`` read as the task
    reads it (an Indexed Job's pods share one, the index is ``JOB_COMPLETION_INDEX``)."""
    task = task_from_env(dict(environ))
    return [address for role, addresses in task.cluster.items()
            for index, address in enumerate(addresses) if (role, index) != (task.type, task.index)]


def record_peers(path: Path, answered: bool) -> None:
    """Keep ``path`` while a peer answered (or there is none to ask), remove it while none did."""
    if answered:
        path.touch()
    else:
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_tf.runtime.health",
                                     description="Ask TensorFlow servers for their status, with a deadline.")
    parser.add_argument("targets", nargs="+", metavar="HOST:PORT")
    parser.add_argument("--timeout", type=float, required=True, help="seconds each server has to answer")
    parser.add_argument("--peers-answered", type=Path, metavar="FILE",
                        help="also ask the group's other tasks (TF_CONFIG); keep FILE while one of them answers")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    try:
        others = [p for p in peers(os.environ) if p not in args.targets] if args.peers_answered else []
    except TaskConfigError as error:
        parser.error(f"--peers-answered reads the group from TF_CONFIG: {error}")
    answers = ask(args.targets + others, args.timeout)
    for target, answer in answers.items():
        print(f"{target} {answer}", flush=True)
    if args.peers_answered:
        record_peers(args.peers_answered, not others or any(answers[p].startswith(ANSWERED) for p in others))
    return 0 if all(answers[t].startswith(ANSWERED) for t in args.targets) else 1


if __name__ == "__main__":
    sys.exit(main())
