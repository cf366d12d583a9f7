"""One task of a training group: read TF_CONFIG, start the TensorFlow server, do the role's work.

``ps`` serves variables until it is killed (TensorFlow has no remote shutdown, so stopping it is
the orchestrator's job). ``chief``/``worker`` train. ``evaluator`` has nothing to do here:
evaluation is a separate step of the pipeline, so it logs that and exits 0.

TensorFlow (and the modules that import it: data reading, training, the coordinator) is
imported only inside :func:`run`, once :func:`main` has set TensorFlow's log level and gRPC
options in the environment, which TensorFlow reads when it loads."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from typing import NoReturn

from airflow_tf.cluster.spec import TASK_TEMPORARY_DIRECTORY
from airflow_tf.cluster.training import TrainingConfig

from .errors import ModelError, NonFiniteError, TaskConfigError, failure_reason
from .logs import log, log_exit
from .proctitle import name_task_process
from .startup import import_tensorflow, import_tensorflow_server
from .task import Task, grpc_default_options, session_config, task_from_env

CONFIG_ERROR = 2
"""Exit code of a task refused before it starts (bad options, TF_CONFIG, dataset or model):
a program error, which the ``ExitCode`` restart policy does not retry."""
TRAINING_FAILED = 1
"""Exit code of a task whose training failed (a TensorFlow error, a NaN loss); not retried either."""


def run(config: TrainingConfig, task: Task) -> int:
    if task.type == "evaluator":
        log("airflow-tf task evaluator: nothing to do here (the pipeline evaluates the final checkpoint); exiting")
        return 0
    schema = None
    if task.type != "ps":
        from airflow_tf.data import load_schema

        schema = load_schema(config.dataset)  # refuses an unfinished dataset before TensorFlow starts
    serves_only = task.type == "ps" or (config.mode == "coordinator" and task.type != "chief")
    if not serves_only:  # one that only serves runs graphs built elsewhere: no Python API needed
        import_tensorflow(keras=True)
        from .step_bound import quiet_tensorflow_logs

        quiet_tensorflow_logs()  # the compat.v1 APIs warn on every use; this log says what happens
    server_lib = import_tensorflow_server()
    if config.mode == "coordinator" and task.type == "chief":
        from .coordinator import run_chief  # its strategy starts the chief's server

        return log_exit(run_chief(config, task, schema))
    server = server_lib.Server(
        server_lib.ClusterSpec(task.cluster), job_name=task.type, task_index=task.index,
        protocol="grpc", config=session_config(task, config), start=True,
    )
    if serves_only:  # a coordinator's worker runs what the chief sends
        log(f"airflow-tf task {task.type}:{task.index} serving at {server.target}; it runs until it is stopped")
        # The server runs on its own threads. A SIGTERM may be delivered to any of them, and
        # signal.pause() only wakes for the main thread's own signals: wake regularly instead,
        # so Python runs the handler within a fraction of a second wherever the signal landed.
        while True:
            time.sleep(0.1)
    from .training import train

    return log_exit(train(config, task, server, schema))


_own_temporary_directory: list[str] = []


def use_own_temporary_directory() -> None:
    """Point the task's temporary files into a directory of its own. TensorFlow's autograph
    writes each function it converts to a file there and removes it at the interpreter's exit,
    which a task skips (``os._exit``) or never reaches (a ps is stopped by a signal). With no
    writable temporary directory at all (a read-only root filesystem), the task runs as it is:
    a ps needs none. A directory its backend made for it, and removes even when the task is
    killed, is used as it is."""
    given = os.environ.get(TASK_TEMPORARY_DIRECTORY)
    if given:
        tempfile.tempdir = os.environ["TMPDIR"] = given
        return
    try:
        directory = tempfile.mkdtemp(prefix="airflow-tf-task-")
    except OSError:
        return
    _own_temporary_directory.append(directory)
    tempfile.tempdir = os.environ["TMPDIR"] = directory


def remove_own_temporary_directory() -> None:
    for directory in _own_temporary_directory:
        shutil.rmtree(directory, ignore_errors=True)


def log_exit_on_signal(task: Task) -> None:
    """On SIGTERM/SIGINT, log the exit line, then die of the signal as before: the exit status
    still says "killed by SIGTERM", so a restart policy treats it as the interruption it is."""

    def handler(signum: int, frame) -> None:
        log(f"airflow-tf task exit role={task.type} index={task.index} status=stopped "
            f"signal={signal.Signals(signum).name}")
        remove_own_temporary_directory()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)


def set_tensorflow_environment(role: str) -> None:
    """What TensorFlow reads from the environment when it loads, set before it does."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ info and warnings drown the task log
    os.environ["TF_GRPC_DEFAULT_OPTIONS"] = grpc_default_options(os.environ.get("TF_GRPC_DEFAULT_OPTIONS"))
    if role == "ps":
        # A ps computes nothing oneDNN speeds up, and oneDNN's allocator keeps every buffer it
        # ever held: initialising an embedding table would cost the ps twice the table for good.
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def run_task_process(argv: list[str] | None = None) -> NoReturn:
    """The whole life of a task's process (``python -m airflow_tf.runtime``, or a child of the
    group's fork server): run the task, then leave without the interpreter's teardown."""
    use_own_temporary_directory()
    try:
        code = main(argv)
    finally:
        remove_own_temporary_directory()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything the task writes (checkpoints, events, progress.json, its log) is closed by now;
    # skipping the interpreter's teardown of TensorFlow saves a second or two of idle per task.
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    try:
        config = TrainingConfig.from_args(argv)
        task = task_from_env()
    except (ValueError, TaskConfigError) as exc:
        print(f"airflow_tf.runtime: error: {exc}", file=sys.stderr, flush=True)
        return CONFIG_ERROR
    name_task_process(task.type, task.index)
    set_tensorflow_environment(task.type)
    log(f"airflow-tf task start role={task.type} index={task.index} pid={os.getpid()} "
        f"cluster={json.dumps(task.cluster, sort_keys=True, separators=(',', ':'))}")
    log_exit_on_signal(task)
    from airflow_tf.data.errors import DataError

    try:
        return run(config, task)
    except (DataError, ModelError, TaskConfigError) as exc:
        message = " ".join(str(exc).split())
        print(f"airflow_tf.runtime: error: {message}", file=sys.stderr, flush=True)
        log(f"airflow-tf task exit role={task.type} index={task.index} status=refused reason={message!r}")
        return CONFIG_ERROR
    except Exception as exc:
        # The traceback first and the cause last: the log's last line is what the backends
        # report as the task's failure reason (a traceback ends in a frame of TensorFlow's).
        if not isinstance(exc, NonFiniteError):
            traceback.print_exc()
            sys.stderr.flush()
        log(f"airflow-tf task exit role={task.type} index={task.index} status=failed "
            f"reason={failure_reason(exc)!r}")
        return TRAINING_FAILED
