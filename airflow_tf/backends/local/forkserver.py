"""The supervisor's side of a group's fork server (:mod:`airflow_tf.runtime.forkserver`): which
tasks it may start, asking it for one, and the handle of a task it forked."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from airflow_tf.cluster import GroupSpec
from airflow_tf.cluster.spec import FORK_SERVER_COMMAND, FORK_SERVER_READY, LAUNCH_FAILED

READY_TIMEOUT = 180.0
"""Seconds the fork server may take to load TensorFlow, which takes tens of seconds on a busy
machine. Past that the group stops using it."""
ANSWER_TIMEOUT = 30.0
"""Seconds a loaded fork server may take to answer a request (it forks at once)."""
LOADED_AT_START = ("TF_", "KERAS_", "PYTHON", "LD_", "MALLOC_", "OMP_", "MKL_", "OPENBLAS_", "CUDA_", "XLA_")
"""Prefixes of the environment variables TensorFlow, Keras or Python read when they load: a role
that sets one of its own starts by itself, so it loads with its own."""


class ForkServerError(Exception):
    """The fork server did not start a task: it is gone, did not answer in time, or failed."""


def forkable(spec: GroupSpec, role: str) -> bool:
    """Whether the fork server may start the tasks of ``role``: those that run the runtime with the
    environment the server loaded with. A ps is left out: it loads only TensorFlow's server, with
    oneDNN off, at a fifth of the CPU."""
    role_spec = spec.roles[role]
    return (role != "ps" and role_spec.command is None
            and not any(name.startswith(LOADED_AT_START) for name in role_spec.env))


class ForkedProcess:
    """A task the fork server forked, which the supervisor reaps as its subreaper: the part of
    :class:`subprocess.Popen` the supervisor uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self._wait(os.WNOHANG)

    def wait(self) -> int:
        code = self._wait(0)
        assert code is not None
        return code

    def _wait(self, options: int) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, options)
            except ChildProcessError:  # never became the supervisor's child: it exited by itself
                self.returncode = LAUNCH_FAILED
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


class ForkServer:
    """The group's fork server, started at once; it loads TensorFlow while the ps start."""

    def __init__(self, python: str, supervisor: int, env: dict[str, str], preexec_fn: Callable[[], None], *,
                 group: str = "-", run: str = "-") -> None:
        # group= and run=: the server's command line names its group, and is long enough for the
        # title each forked task writes over it.
        self.proc = subprocess.Popen(
            [python, *FORK_SERVER_COMMAND[1:], str(supervisor), f"group={group}", f"run={run}"], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, start_new_session=True, preexec_fn=preexec_fn,  # noqa: PLW1509
        )
        self.pending = b""
        self.started = time.monotonic()
        self.ready = False

    def poll_ready(self) -> bool:
        """Whether the server has loaded, without waiting for it; ForkServerError once it has
        exited or took longer than :data:`READY_TIMEOUT`."""
        if not self.ready:
            message = self._message(0.0)
            if message is not None:  # its first line
                if message != FORK_SERVER_READY:
                    raise ForkServerError(f"it said {message!r:.200} instead of that it was ready")
                self.ready = True
            elif time.monotonic() - self.started > READY_TIMEOUT:
                raise ForkServerError(f"it did not load within {READY_TIMEOUT:g} s")
        return self.ready

    def fork(self, args: list[str], env: dict[str, str], log: Path, title: str) -> ForkedProcess:
        """A task running ``python -m airflow_tf.runtime <args>`` with ``env``, writing to ``log``
        (the server has said it is ready)."""
        request = {"args": args, "env": env, "log": str(log), "title": title}
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError) as err:
            raise ForkServerError(f"it has exited ({err})") from None
        answer = self._message(ANSWER_TIMEOUT)
        if answer is None:
            raise ForkServerError(f"no answer within {ANSWER_TIMEOUT:g} s")
        if not isinstance(answer.get("pid"), int):
            raise ForkServerError(str(answer.get("error", repr(answer))))
        return ForkedProcess(answer["pid"])

    def _message(self, timeout: float) -> dict | None:
        """The server's next line as the JSON object it must be (None past ``timeout``); anything
        else is ForkServerError, on which the supervisor starts its tasks by itself."""
        line = self._line(timeout)
        if line is None:
            return None
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            raise ForkServerError(f"it said {line[:200]!r}, not a JSON object")
        return message

    def _line(self, timeout: float) -> bytes | None:
        """The server's next line, waiting at most ``timeout`` seconds for it: past that, None.
        ForkServerError once the server has exited."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise ForkServerError(f"it has exited (exit code {self.proc.wait()})")
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line

    def close(self) -> None:
        """Stop the server; the tasks it forked are the supervisor's and live on."""
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        try:
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
