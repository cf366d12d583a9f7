"""This task's place in the training group: its role and index from TF_CONFIG, and the
TensorFlow session options that follow from them."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from airflow_tf.cluster.spec import TRAINERS_ON_THIS_MACHINE
from airflow_tf.cluster.training import TrainingConfig

from .errors import TaskConfigError

TF_CONFIG = "TF_CONFIG"
TASK_TYPES = ("chief", "worker", "ps", "evaluator")
GRPC_NO_RETRIES = "grpc.enable_retries=0"
"""gRPC channel option for every channel TensorFlow opens (``TF_GRPC_DEFAULT_OPTIONS``): a
broken call fails at once as UnavailableError, which the session recovers from. It was the first
suspect of the long-run hang ("The same RunGraph (Worker) request was received twice"), whose
cause turned out to be TensorFlow's repeating request ids (bench/README.md, .step_bound); it is
kept, as nothing in TensorFlow's worker calls relies on gRPC retrying them."""


def grpc_default_options(current: str | None) -> str:
    """``TF_GRPC_DEFAULT_OPTIONS`` with gRPC retries off, unless the user chose a setting."""
    if not current:
        return GRPC_NO_RETRIES
    return current if "grpc.enable_retries=" in current else f"{current},{GRPC_NO_RETRIES}"


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


def task_from_env(environ: MutableMapping[str, str] | None = None) -> Task:
    """This process's :class:`Task`, from ``TF_CONFIG`` (validated: each problem is named). A
    ``TF_CONFIG`` without a task index takes the Indexed Job's ``JOB_COMPLETION_INDEX``."""
    env: MutableMapping[str, str] = os.environ if environ is None else environ
    data = _parse_tf_config(env.get(TF_CONFIG))
    cluster, task = _cluster_and_task(data)
    kind, index = task.get("type"), task.get("index")
    if index is None:
        # A pod of an Indexed Job (Kubernetes backend): one TF_CONFIG for the whole Job,
        # the index set by the Job controller. Written back so TensorFlow reads it too.
        index = int(env["JOB_COMPLETION_INDEX"]) if env.get("JOB_COMPLETION_INDEX", "").isdigit() else 0
        env[TF_CONFIG] = json.dumps({**data, "task": {**task, "index": index}})
    if kind not in TASK_TYPES:
        hint = " (use 'chief')" if kind == "master" else ""
        raise TaskConfigError(f"{TF_CONFIG}: task type {kind!r} is not one of {', '.join(TASK_TYPES)}{hint}")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise TaskConfigError(f"{TF_CONFIG}: task index must be a whole number >= 0, got {index!r}")
    result = Task(kind, index, {job: list(addresses) for job, addresses in cluster.items()})
    if kind != "evaluator":
        _check_place_in_cluster(result)
    return result


def _parse_tf_config(raw: str | None):
    """The decoded ``TF_CONFIG``; refuses an unset or malformed one."""
    if not raw:
        raise TaskConfigError(
            f"{TF_CONFIG} is not set: it tells this task its role and the cluster, e.g. "
            '{"cluster": {"ps": ["host:2222"], "worker": ["host:2223"]}, "task": {"type": "worker", "index": 0}}'
        )
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TaskConfigError(f"{TF_CONFIG} is not valid JSON ({exc})") from None


def _cluster_and_task(data) -> tuple[dict[str, list[str]], dict]:
    """``TF_CONFIG``'s "cluster" (each job a list of addresses) and "task" (an object)."""
    cluster = data.get("cluster") if isinstance(data, dict) else None
    task = data.get("task") if isinstance(data, dict) else None
    if not isinstance(cluster, dict) or not all(
        isinstance(v, list) and all(isinstance(a, str) for a in v) for v in cluster.values()
    ):
        raise TaskConfigError(f'{TF_CONFIG}: "cluster" must map each job to a list of "host:port" addresses')
    if not isinstance(task, dict):
        raise TaskConfigError(f'{TF_CONFIG}: "task" must be an object {{"type": ..., "index": ...}}')
    return cluster, task


def _check_place_in_cluster(task: Task) -> None:
    """A ps, worker or chief is one of its job's addresses, in a cluster with a ps job (the
    evaluator stands outside the cluster)."""
    if task.index >= len(task.cluster.get(task.type, [])):
        raise TaskConfigError(f"{TF_CONFIG}: task {task.type}:{task.index} is not in the cluster "
                              f"({json.dumps(task.cluster)})")
    if not task.ps_count:
        raise TaskConfigError(f'{TF_CONFIG}: the cluster has no "ps" job; parameter-server training needs one')


def intra_op_threads(task: Task, config: TrainingConfig, environ: Mapping[str, str] = os.environ) -> int:
    """Threads per op: the option when set; else 1 on a ps (it applies updates and serves
    variables, and a thread per core would only compete with the trainers), and on a training
    task its share of the cores this process may use (affinity, cgroup quota: a pod's CPU limit)
    among the training tasks on this machine."""
    if config.intra_op_threads is not None:
        return config.intra_op_threads
    if task.type == "ps":
        return 1
    from airflow_tf.data.cpus import usable_cpus

    sharing = environ.get(TRAINERS_ON_THIS_MACHINE, "1")
    if not sharing.isdigit() or int(sharing) < 1:
        raise TaskConfigError(f"{TRAINERS_ON_THIS_MACHINE}={sharing!r}: expected a positive whole number "
                              "(the training tasks on this machine); unset it, or set intra_op_threads")
    return max(1, usable_cpus() // int(sharing))


def session_config(task: Task, config: TrainingConfig):
    """Threads from the options; a trainer sees only the ps tasks and itself, so it neither
    waits for the other workers to start nor hangs when they have already exited."""
    from tensorflow.core.protobuf.config_pb2 import ConfigProto  # tf.compat.v1.ConfigProto, API or not

    proto = ConfigProto(
        intra_op_parallelism_threads=intra_op_threads(task, config),
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
