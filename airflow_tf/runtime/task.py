"""One task of a training group: read TF_CONFIG, start the TensorFlow server, do the role's work.

``ps`` serves variables until it is killed (TensorFlow has no remote shutdown, so stopping it is
the orchestrator's job). ``chief``/``worker`` train. ``evaluator`` has nothing to do here:
evaluation is a separate step of the pipeline, so it logs that and exits 0."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone

from airflow_tf.cluster.training import TrainingConfig

from .errors import ModelError, NonFiniteError, TaskConfigError, failure_reason

TF_CONFIG = "TF_CONFIG"
TASK_TYPES = ("chief", "worker", "ps", "evaluator")
CONFIG_ERROR = 2
"""Exit code of a task refused before it starts (bad options, TF_CONFIG, dataset or model):
a program error, which the ``ExitCode`` restart policy does not retry."""
TRAINING_FAILED = 1
"""Exit code of a task whose training failed (a TensorFlow error, a NaN loss); not retried either."""
GRPC_NO_RETRIES = "grpc.enable_retries=0"
"""gRPC channel option for every channel TensorFlow opens (``TF_GRPC_DEFAULT_OPTIONS``). gRPC's
own retries re-send a RunGraph request the other task has already received; TensorFlow refuses
the copy ("The same RunGraph (Worker) request was received twice") and the step then fails or
waits for ever for the first one's reply (seen in long runs under load). Without them a broken
call fails as UnavailableError, which the session recovers from."""


def grpc_default_options(current: str | None) -> str:
    """``TF_GRPC_DEFAULT_OPTIONS`` with gRPC retries off, unless the user chose a setting."""
    if not current:
        return GRPC_NO_RETRIES
    return current if "grpc.enable_retries=" in current else f"{current},{GRPC_NO_RETRIES}"


def log(message: str) -> None:
    """One line of the task's log, flushed at once (the log is read while the task runs)."""
    stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    print(f"{stamp} {message}", flush=True)


@dataclass(frozen=True)
class Task:
    """This process's place in the cluster, from TF_CONFIG."""

    type: str
    index: int
    cluster: dict[str, list[str]]

    @property
    def device(self) -> str:
        return f"/job:{self.type}/task:{self.index}"

    @property
    def trainers(self) -> list[tuple[str, int]]:
        """The tasks that compute gradients: the chief (if any), then the workers."""
        return [(role, i) for role in ("chief", "worker") for i in range(len(self.cluster.get(role, [])))]

    @property
    def is_chief(self) -> bool:
        """The chief initialises, restores and checkpoints: ``chief:0``, or ``worker:0`` without a chief."""
        return self.trainers[:1] == [(self.type, self.index)]

    @property
    def trainer_index(self) -> int:
        """This task's position among the trainers: its share of the training data."""
        return self.trainers.index((self.type, self.index))

    @property
    def ps_count(self) -> int:
        return len(self.cluster.get("ps", []))


def task_from_env(environ: dict[str, str] | None = None) -> Task:
    environ = os.environ if environ is None else environ
    raw = environ.get(TF_CONFIG)
    if not raw:
        raise TaskConfigError(
            f"{TF_CONFIG} is not set: it tells this task its role and the cluster, e.g. "
            '{"cluster": {"ps": ["host:2222"], "worker": ["host:2223"]}, "task": {"type": "worker", "index": 0}}'
        )
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TaskConfigError(f"{TF_CONFIG} is not valid JSON ({exc})") from None
    cluster = data.get("cluster") if isinstance(data, dict) else None
    task = data.get("task") if isinstance(data, dict) else None
    if not isinstance(cluster, dict) or not all(
        isinstance(v, list) and all(isinstance(a, str) for a in v) for v in cluster.values()
    ):
        raise TaskConfigError(f'{TF_CONFIG}: "cluster" must map each job to a list of "host:port" addresses')
    if not isinstance(task, dict):
        raise TaskConfigError(f'{TF_CONFIG}: "task" must be an object {{"type": ..., "index": ...}}')
    kind, index = task.get("type"), task.get("index")
    if index is None:
        # A pod of an Indexed Job (Kubernetes backend): one TF_CONFIG for the whole Job,
        # the index set by the Job controller. Written back so TensorFlow reads it too.
        index = int(environ["JOB_COMPLETION_INDEX"]) if environ.get("JOB_COMPLETION_INDEX", "").isdigit() else 0
        environ[TF_CONFIG] = json.dumps({**data, "task": {**task, "index": index}})
    if kind not in TASK_TYPES:
        hint = " (use 'chief')" if kind == "master" else ""
        raise TaskConfigError(f"{TF_CONFIG}: task type {kind!r} is not one of {', '.join(TASK_TYPES)}{hint}")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise TaskConfigError(f"{TF_CONFIG}: task index must be a whole number >= 0, got {index!r}")
    result = Task(kind, index, {job: list(addresses) for job, addresses in cluster.items()})
    if kind != "evaluator":
        if index >= len(cluster.get(kind, [])):
            raise TaskConfigError(f"{TF_CONFIG}: task {kind}:{index} is not in the cluster ({json.dumps(cluster)})")
        if not result.ps_count:
            raise TaskConfigError(f'{TF_CONFIG}: the cluster has no "ps" job; parameter-server training needs one')
    return result


def session_config(task: Task, config: TrainingConfig):
    """Threads from the options; a trainer sees only the ps tasks and itself, so it neither
    waits for the other workers to start nor hangs when they have already exited."""
    import tensorflow as tf

    proto = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=config.intra_op_threads,
        inter_op_parallelism_threads=config.inter_op_threads,
    )
    if task.type != "ps" and config.mode != "coordinator":  # there the chief's strategy sets them
        proto.device_filters.extend(["/job:ps", task.device])
        # Every step is bounded: one stuck on an unresponsive ps raises DeadlineExceededError
        # and the session is recreated (see .training) instead of blocking for ever.
        proto.operation_timeout_in_ms = max(1, round(config.operation_timeout_secs * 1000))
        from .towers import cpu_devices_needed

        if cpu_devices_needed(config.devices_per_worker):  # CPU towers (no GPUs): one device each
            proto.device_count["CPU"] = cpu_devices_needed(config.devices_per_worker)
    return proto


def run(config: TrainingConfig, task: Task) -> int:
    if task.type == "evaluator":
        log("airflow-tf task evaluator: nothing to do here (the pipeline evaluates the final checkpoint); exiting")
        return 0
    schema = None
    if task.type != "ps":
        from airflow_tf.data import load_schema

        schema = load_schema(config.dataset)  # refuses an unfinished dataset before TensorFlow starts
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # the compat.v1 APIs warn on every use; this log says what happens
    if config.mode == "coordinator" and task.type == "chief":
        from .coordinator import run_chief  # its strategy starts the chief's server

        return log_exit(run_chief(config, task, schema))
    server = tf.distribute.Server(
        tf.train.ClusterSpec(task.cluster), job_name=task.type, task_index=task.index,
        protocol="grpc", config=session_config(task, config), start=True,
    )
    if task.type == "ps" or config.mode == "coordinator":  # a coordinator's worker runs what the chief sends
        log(f"airflow-tf task {task.type}:{task.index} serving at {server.target}; it runs until it is stopped")
        # The server runs on its own threads. A SIGTERM may be delivered to any of them, and
        # signal.pause() only wakes for the main thread's own signals: wake regularly instead,
        # so Python runs the handler within a fraction of a second wherever the signal landed.
        while True:
            time.sleep(0.1)
    from .training import train

    return log_exit(train(config, task, server, schema))


def log_exit(result: dict) -> int:
    log("airflow-tf task exit " + " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in result.items()))
    return 0


def log_exit_on_signal(task: Task) -> None:
    """On SIGTERM/SIGINT, log the exit line, then die of the signal as before: the exit status
    still says "killed by SIGTERM", so a restart policy treats it as the interruption it is."""

    def handler(signum: int, frame) -> None:
        log(f"airflow-tf task exit role={task.type} index={task.index} status=stopped "
            f"signal={signal.Signals(signum).name}")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> int:
    try:
        config = TrainingConfig.from_args(argv)
        task = task_from_env()
    except (ValueError, TaskConfigError) as exc:
        print(f"airflow_tf.runtime: error: {exc}", file=sys.stderr, flush=True)
        return CONFIG_ERROR
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ info and warnings drown the task log
    os.environ["TF_GRPC_DEFAULT_OPTIONS"] = grpc_default_options(os.environ.get("TF_GRPC_DEFAULT_OPTIONS"))
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
