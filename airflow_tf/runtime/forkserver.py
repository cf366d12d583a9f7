"""A group's fork server: ``python -m airflow_tf.runtime.forkserver <supervisor pid> group=<g> run=<r>``.

Loading TensorFlow and Keras is most of a trainer's start (about 4 s of CPU, and more on a busy
machine), paid again by every worker of a group and by every restart of one. The local
supervisor starts this process once per group: it loads them once, then forks a task for each
request. The task starts training at once and shares the loaded pages with its siblings.

Requests and answers are JSON lines on stdin and stdout. Once loaded, the server says
``{"ready": true}``; then ``{"args": [...], "env": {...}, "log": path, "title": "worker-1"}`` is
answered ``{"pid": n}`` (or ``{"error": why}``). Each task
is forked twice, so that its parent is the supervisor (a child subreaper), which reaps it and reads
its exit status as it does for a task it starts itself, and the task dies with the supervisor.

Why forking a process that has loaded TensorFlow is safe here: a forked child keeps only the
thread that forked it, so a lock another thread held at the fork would stay held in the child
for good. At each fork this server has one thread. Importing TensorFlow and Keras starts no
thread of its own (TensorFlow's thread pools start with its runtime: a session, an eager
context, which nothing here creates). Importing NumPy starts OpenBLAS's pool of worker threads
(one per core but one), but OpenBLAS stops that pool in a ``pthread_atfork`` handler before every
fork, so at the fork itself only the calling thread is left; the pool comes back in the server
at its next BLAS call, which it never makes, and in a task at its own first one. The forked
task then starts TensorFlow's runtime from scratch, with its own threads. Python 3.12 and later
warn (a DeprecationWarning) when they fork a process with more than one thread, counted just
after the fork: for the reason above they do not warn here, and nothing silences them.

This is checked, not only said: before saying it is ready, the server forks a child that exits
at once and counts its own threads just after (:func:`threads_at_fork`). With more than one (a
TensorFlow that starts a thread when imported, a library without OpenBLAS's handler) it says
why instead of that it is ready, and the supervisor starts every task by itself.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from airflow_tf.cluster.spec import FORK_SERVER_READY, LAUNCH_FAILED

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
REPARENT_WAIT = 10.0
"""Seconds a forked task waits to become the supervisor's child (the process between exits at once)."""

_libc = ctypes.CDLL(None, use_errno=True)


def preload() -> None:
    """Load what a trainer loads, as a task would (its environment first): TensorFlow, Keras,
    the training loop and the models."""
    from .main import set_tensorflow_environment
    from .startup import collector_paused, import_tensorflow

    set_tensorflow_environment("worker")
    with collector_paused():
        import_tensorflow(keras=True)
        import airflow_tf.data  # noqa: F401  # the dataset's schema and reader
        from . import coordinator, training  # noqa: F401

    # The loaded objects live as long as every task: the tasks' collections need not walk them,
    # which would also copy every page they sit on into each task.
    gc.collect()
    gc.freeze()


def thread_count() -> int:
    """This process's threads now, as the kernel counts them (the 20th field of /proc/self/stat)."""
    with open("/proc/self/stat", "rb") as stat:
        return int(stat.read().rpartition(b")")[2].split()[17])


def threads_at_fork() -> int:
    """The threads this process has at a fork: what it has once the ``pthread_atfork`` handlers
    have run (OpenBLAS's stops its pool), counted just after forking a child that exits at once.
    Past 1, Python 3.12 and later also warn of this very fork; the count is what is reported."""
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        os._exit(0)
    count = thread_count()
    os.waitpid(child, 0)
    return count


def serve(parent: int, requests, answers) -> None:
    """Answer each request line with the forked task's pid, until stdin closes."""
    own = (requests.fileno(), answers.fileno())
    for line in requests:
        answer: dict[str, Any]
        try:
            request = json.loads(line)
            answer = {"pid": fork_task(request, parent, own)}
        except (OSError, ValueError, KeyError, TypeError) as err:
            answer = {"error": f"{type(err).__name__}: {err}"}
        answers.write((json.dumps(answer) + "\n").encode())
        answers.flush()


def fork_task(request: dict[str, Any], parent: int, own: tuple[int, ...] = ()) -> int:
    """Fork the task ``request`` describes; its pid once it runs. The process between the two
    forks exits at once, so the task is reparented to ``parent``, the nearest subreaper. The
    task closes ``own``, the server's ends of its pipes: a task holding them would keep the
    supervisor from seeing the server exit."""
    args, env, log, title = list(request["args"]), dict(request["env"]), str(request["log"]), str(request["title"])
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    middle = os.fork()  # single-threaded, see the module's docstring
    if middle == 0:
        os.close(read_end)
        try:
            # Named before the fork, the task is born with its role's name: once the supervisor
            # has its pid, ps and top already show it as its role.
            _libc.prctl(PR_SET_NAME, title.encode()[:15], 0, 0, 0)
            task = os.fork()
            if task == 0:
                for fd in (write_end, *own):
                    os.close(fd)
                _exit_as_python_would(lambda: become_task(args, env, log, title, parent))
            os.write(write_end, str(task).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        pid = pipe.read()
    os.waitpid(middle, 0)
    if not pid:
        raise OSError("the second fork failed")
    return int(pid)


def _exit_as_python_would(body: Callable[[], object]) -> NoReturn:
    """Run ``body`` in a forked process and exit with the status an interpreter would have ended
    with: ``sys.exit``'s code, or 1 after printing an uncaught exception, never the process's
    exit after the fork."""
    code: int = 0
    try:
        body()
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException:  # as the interpreter does: the traceback, then exit 1
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def become_task(args: list[str], env: dict[str, str], log: str, title: str, parent: int) -> NoReturn:
    """In the forked task: the supervisor's child, dying with it, in a session of its own,
    writing to its log, with its own environment; then the task's whole life."""
    try:
        deadline = time.monotonic() + REPARENT_WAIT
        while os.getppid() != parent:
            if time.monotonic() > deadline:
                os._exit(LAUNCH_FAILED)
            time.sleep(0.001)
        if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(LAUNCH_FAILED)
        os.setsid()
        output = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        nothing = os.open(os.devnull, os.O_RDONLY)
        for source, target in ((nothing, 0), (output, 1), (output, 2)):
            os.dup2(source, target)
        os.close(output)
        os.close(nothing)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [sys.argv[0], *args]
        if "numpy" in sys.modules:  # the fork copied the server's random state to every task
            sys.modules["numpy"].random.seed()
    except BaseException:  # whatever it was, it goes to the log (or stderr) and the task exits
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(LAUNCH_FAILED)
    from .main import run_task_process

    run_task_process(args)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # group= and run= only name the server in ps, and make its command line long enough for
    # the title each task writes over it (airflow_tf.runtime.proctitle).
    if not args or not args[0].isdigit() or not all(a.startswith(("group=", "run=")) for a in args[1:]):
        print("usage: python -m airflow_tf.runtime.forkserver <supervisor pid> [group=<group> run=<run>]",
              file=sys.stderr)
        return 2
    parent = int(args[0])
    # Requests arrive on stdin and answers leave on stdout; whatever else writes to them (a
    # warning while TensorFlow loads) goes to stderr instead, and the tasks get neither.
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb")
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.close(nothing)
    os.dup2(2, 1)
    preload()
    threads = threads_at_fork()
    # The supervisor starts no trainer before this line: it stays free meanwhile.
    answers.write((json.dumps(FORK_SERVER_READY if threads == 1 else {"error": (
        f"it had {threads} threads at a fork after loading TensorFlow, where it must have 1 "
        "(see airflow_tf.runtime.forkserver); the group's tasks start by themselves")}) + "\n").encode())
    if threads != 1:
        return 1
    answers.flush()
    serve(parent, requests, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
