"""What a training group IS: roles, replicas, what each task runs, how failures are retried.

Pure Python (no Airflow, no TensorFlow) so that the launcher, the backends, the supervisor
and the tests share one definition and one validation."""

from __future__ import annotations

import dataclasses
import math
import re
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .names import is_dns1123_label, task_name
from .group_options import HEALTH_FAILURES, OPTIONS, ROLE_COUNTS, bounds, default, group_parameter_docs
from .status import CHIEF_OR_WORKER0, SUCCESS_POLICIES
from .training import TrainingConfig

ROLES = ("chief", "ps", "worker", "evaluator")
"""Task types, in TF_CONFIG spelling. ``master`` is not one: TensorFlow 2.21 rejects it."""

RESTART_POLICIES = ("Never", "OnFailure", "ExitCode")
# A group's defaults, declared with their bounds and documentation in group_options.GroupOptions.
DEFAULT_PORT: int = default("port")
DEFAULT_PS: int = default("ps")
DEFAULT_WORKERS: int = default("workers")
DEFAULT_BACKOFF_LIMIT: int = default("backoff_limit")
DEFAULT_SUCCESS_POLICY: str = default("success_policy")
RUNTIME_COMMAND = ("python", "-m", "airflow_tf.runtime")
FORK_SERVER_COMMAND = ("python", "-m", "airflow_tf.runtime.forkserver")
FORK_SERVER_READY = {"ready": True}
"""The fork server's first line (JSON), once it has loaded TensorFlow and Keras."""
TASK_TEMPORARY_DIRECTORY = "AIRFLOW_TF_TASK_TMPDIR"
"""Set by a backend that made a task's temporary directory and removes it when the task ends,
even killed (the local backend): the task keeps its temporary files there."""
LAUNCH_FAILED = 70
"""Exit code of a local task's process that could not become the task: its supervisor was gone
before it started, or its fork server could not set it up."""
DEFAULT_PROGRESS_TIMEOUT: float = default("progress_timeout")
DEFAULT_PS_GRACE_SECONDS: float = default("ps_grace_seconds")
DEFAULT_HEALTH_TIMEOUT: float = default("health_timeout")
"""A live TensorFlow server answers its health question in milliseconds, a few hundred on a
loaded machine (docs/reference/faults.md); seconds of silence mean it is stopped, wedged or cut off."""
HEALTH_STARTUP_SECS = 600
"""Longest a task may take to answer its first question (TensorFlow's import and the server's
start on a loaded node); until then it is starting, not stuck (Kubernetes' startup probe)."""
HEALTH_COMMAND = ("python", "-m", "airflow_tf.runtime.health")
HEALTH_ANSWERED = "answered"
"""How the health question's line for a task starts when the task answered."""
TRAINERS_ON_THIS_MACHINE = "AIRFLOW_TF_TRAINERS_ON_THIS_MACHINE"
"""Set by a backend that starts several training tasks on one machine (the local backend): how
many share its cores. Unset, a training task has its container's cores to itself (a pod)."""
_POSIX_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A name a local process's environment can pass on through any shell."""


class SpecError(ValueError):
    """A group spec that cannot run; the message names every field that is wrong."""


def is_retryable_exit(policy: str, exit_code: int) -> bool:
    """Whether a task that exited with ``exit_code`` is restarted under ``policy``.

    ``ExitCode`` retries only infrastructure failures: death by a signal (a negative code
    from a local process, 128+N from a container runtime, e.g. 137 for SIGKILL/OOM, 143
    for SIGTERM). A program error such as exit 1 fails at once: retrying would fail again."""
    if exit_code == 0 or policy == "Never":
        return False
    if policy == "OnFailure":
        return True
    return exit_code < 0 or exit_code > 128


def _whole(value: Any) -> bool:
    """A whole number >= 0; booleans are not numbers here."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _positive(value: Any, zero: bool = False) -> bool:
    """A finite number > 0 (>= 0 with ``zero``); booleans are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value >= 0 if zero else value > 0


def describe_exit(exit_code: int) -> str:
    """``exit code 1`` / ``killed by SIGKILL`` / ``exit code 137 (SIGKILL)``."""
    signum = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 else None
    try:
        signame = signal.Signals(signum).name if signum else None
    except ValueError:
        signame = None
    if exit_code < 0:
        return f"killed by {signame or f'signal {-exit_code}'}"
    return f"exit code {exit_code}" + (f" ({signame})" if signame else "")


def task_failure_reason(exit_code: int, log_tail: str | None) -> str:
    """:func:`describe_exit` and the last non-empty line of the task's log, where the runtime
    writes the cause: ``exit code 1; last log line: ... reason='...'``."""
    lines = [line.strip() for line in (log_tail or "").splitlines() if line.strip()]
    return describe_exit(exit_code) + (f"; last log line: {lines[-1]}" if lines else "")


@dataclass(frozen=True)
class HealthBounds:
    """How a group's tasks are asked whether they are alive (see :mod:`airflow_tf.runtime.health`)."""

    timeout_secs: float
    """Seconds each answer may take."""
    period_secs: float
    """Seconds between two questions to a task."""
    failures: int = HEALTH_FAILURES

    @property
    def stuck_after_secs(self) -> float:
        """At most this long from a task's last answer to its verdict "stuck"."""
        return self.failures * self.period_secs + self.timeout_secs


@dataclass
class RoleSpec:
    replicas: int = 1
    image: str | None = None
    """Container image (Kubernetes backend); None takes the group's image."""
    command: list[str] | None = None
    """None runs ``python -m airflow_tf.runtime`` with the group's training options."""
    resources: dict[str, dict[str, str]] = field(default_factory=dict)
    """``{"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}`` as in Kubernetes. The
    Kubernetes backend requests a measured default CPU and memory for what this leaves out
    (``airflow_tf.backends.kubernetes.default_requests``)."""
    env: dict[str, str] = field(default_factory=dict)
    restart_policy: str = "ExitCode"
    kubernetes: dict[str, Any] = field(default_factory=dict)
    """Pod settings only the Kubernetes backend reads (node selector, tolerations, ...)."""


def _default_roles() -> dict[str, RoleSpec]:
    return {"ps": RoleSpec(replicas=DEFAULT_PS, restart_policy="OnFailure"),
            "worker": RoleSpec(replicas=DEFAULT_WORKERS)}


@dataclass
class GroupSpec:
    """A training group: its name, its roles and what their tasks run, and the options below.

    :param name: the group's name, a DNS-1123 label of at most 46 characters.
    :param roles: per role, its replicas and what each task runs (``RoleSpec``).
    :param training: the training options of the tasks that run the runtime.
    :param image: the tasks' container image (Kubernetes backend).
    :param labels: extra labels (Airflow dag/task/run ids) stamped on every task of the group.
    {group_options}
    """

    name: str
    roles: dict[str, RoleSpec] = field(default_factory=_default_roles)
    training: TrainingConfig | None = None
    image: str | None = None
    # The options a user sets: declared, with their defaults, bounds and documentation, in GroupOptions.
    backoff_limit: int = DEFAULT_BACKOFF_LIMIT
    group_backoff_limit: int | None = default("group_backoff_limit")
    active_deadline_seconds: float | None = default("active_deadline_seconds")
    success_policy: str = DEFAULT_SUCCESS_POLICY
    port: int = DEFAULT_PORT
    labels: dict[str, str] = field(default_factory=dict)
    pass_env: list[str] = field(default_factory=list)
    progress_timeout: float | None = DEFAULT_PROGRESS_TIMEOUT
    ps_grace_seconds: float = DEFAULT_PS_GRACE_SECONDS
    isolate_network: bool = default("isolate_network")
    health_timeout: float | None = DEFAULT_HEALTH_TIMEOUT

    def __post_init__(self) -> None:
        self.roles = {
            role: spec if isinstance(spec, RoleSpec) else RoleSpec(**spec)
            for role, spec in self.roles.items()
        }
        if isinstance(self.training, dict):
            self.training = TrainingConfig.from_dict(self.training)
        self.validate()

    # -- construction -------------------------------------------------------------------
    @classmethod
    def for_training(cls, name: str, training: TrainingConfig, *, ps: int = DEFAULT_PS, workers: int = DEFAULT_WORKERS,
                     chief: int = default("chief"), evaluator: int = 0, **options: Any) -> GroupSpec:
        if training.mode == "coordinator":  # the chief drives the workers (which never exit): its exit decides
            chief, options["success_policy"] = max(chief, 1), CHIEF_OR_WORKER0
        roles = {"ps": RoleSpec(replicas=ps, restart_policy="OnFailure"), "worker": RoleSpec(replicas=workers)}
        if chief:
            roles["chief"] = RoleSpec(replicas=chief)
        if evaluator:
            roles["evaluator"] = RoleSpec(replicas=evaluator)
        role_overrides = options.pop("role_options", {}) or {}
        for role, extra in role_overrides.items():
            if role not in roles:
                raise SpecError(f"role_options: {role!r} is not a role of this group ({', '.join(roles)})")
            roles[role] = dataclasses.replace(roles[role], **extra)
        ps_resources = roles["ps"].resources or {}
        ps_memory = (ps_resources.get("limits") or {}).get("memory") or (ps_resources.get("requests") or {}).get("memory")
        if training.ps_memory_limit is None and ps_memory is not None:  # what the tables are checked against
            training = dataclasses.replace(training, ps_memory_limit=str(ps_memory))
        return cls(name=name, roles=roles, training=training, **options)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def run_name(self) -> str:
        """Which run the group trains, as its processes name it: its run directory, else the
        Airflow DAG and run that launched it (``<dag_id>/<run_id>``), else ``-``."""
        if self.training is not None and self.training.run_dir:
            return self.training.run_dir
        dag, run = self.labels.get("airflow.dag_id"), self.labels.get("airflow.run_id")
        return f"{dag}/{run}" if dag and run else "-"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroupSpec:
        return cls(**data)

    # -- validation ---------------------------------------------------------------------
    def validate(self) -> None:
        """Every problem of the spec at once, each naming its field, as one :class:`SpecError`."""
        errors = [
            *self._name_errors(), *self._role_errors(), *self._topology_errors(), *self._restart_errors(),
            *self._environment_errors(), *self._timing_errors(),
        ]
        if self.training is None and any(s.command is None for r, s in self.roles.items() if s.replicas):
            errors.append("training: required unless every role has its own command")
        if errors:
            raise SpecError(f"invalid training group {self.name!r}:\n  " + "\n  ".join(errors))
        for role, index in self.tasks():
            task_name(self.name, role, index)

    def _name_errors(self) -> Iterator[str]:
        if not is_dns1123_label(self.name or "") or len(self.name) > 46:
            yield (f"name: {self.name!r} must be a DNS-1123 label of at most 46 characters "
                   "(lowercase letters, digits and '-'); derive it with airflow_tf.cluster.names.dns1123_label")

    def _role_errors(self) -> Iterator[str]:
        for role, spec in self.roles.items():
            if role not in ROLES:
                hint = " (use 'chief': TensorFlow 2.21 rejects 'master')" if role == "master" else ""
                yield f"roles.{role}: unknown role{hint}; roles are {', '.join(ROLES)}"
                continue
            if not _whole(spec.replicas):
                yield f"roles.{role}.replicas: must be a whole number >= 0, got {spec.replicas!r}"
            if spec.restart_policy not in RESTART_POLICIES:
                yield f"roles.{role}.restart_policy: {spec.restart_policy!r} is not one of {', '.join(RESTART_POLICIES)}"
            if spec.command is not None and (not spec.command or not all(isinstance(c, str) for c in spec.command)):
                yield f"roles.{role}.command: must be a non-empty list of strings"

    def _topology_errors(self) -> Iterator[str]:
        """How many tasks of each role the group and its training mode need."""
        if self.replicas("worker") < 1 and self.replicas("chief") < 1:
            yield "roles.worker.replicas: a group needs at least one worker (or a chief)"
        for role in ("chief", "evaluator"):
            if self.replicas(role) > 1:
                yield f"roles.{role}.replicas: at most one {role}, got {self.replicas(role)}"
        if self.training is None:
            return
        if self.training.mode == "coordinator" and (
                self.replicas("chief") != 1 or self.success_policy != CHIEF_OR_WORKER0):
            yield ("training.mode: coordinator mode needs one chief (it drives the workers, which never "
                   f"exit by themselves) and success_policy {CHIEF_OR_WORKER0!r}; GroupSpec.for_training sets both")
        if self.replicas("ps") < 1:
            yield "roles.ps.replicas: parameter-server training needs at least one ps task"
        trainers = self.replicas("worker") + self.replicas("chief")
        if self.training.replicas_to_aggregate is not None and self.training.replicas_to_aggregate > trainers:
            yield (f"training.replicas_to_aggregate: {self.training.replicas_to_aggregate} is more than "
                   f"the {trainers} training task(s); a sync step would never complete")

    def _restart_errors(self) -> Iterator[str]:
        """Restart budgets, the deadline and the completion rule."""
        if not _whole(self.backoff_limit):
            yield f"backoff_limit: must be a whole number >= 0, got {self.backoff_limit!r}"
        if self.group_backoff_limit is not None and not _whole(self.group_backoff_limit):
            yield f"group_backoff_limit: must be a whole number >= 0 or None, got {self.group_backoff_limit!r}"
        deadline = bounds("active_deadline_seconds")
        if self.active_deadline_seconds is not None and not deadline.holds(self.active_deadline_seconds):
            yield f"active_deadline_seconds: must be {deadline}, got {self.active_deadline_seconds}"
        if self.success_policy not in SUCCESS_POLICIES:
            yield f"success_policy: {self.success_policy!r} is not one of {', '.join(SUCCESS_POLICIES)}"

    def _environment_errors(self) -> Iterator[str]:
        """What the tasks' processes get from the launcher and where they listen."""
        if not isinstance(self.pass_env, (list, tuple)) or not all(
                isinstance(n, str) and _POSIX_ENV_NAME.fullmatch(n) for n in self.pass_env):
            yield f"pass_env: must be a list of environment variable names, got {self.pass_env!r}"
        if not isinstance(self.isolate_network, bool):
            yield f"isolate_network: must be true or false, got {self.isolate_network!r}"
        if not isinstance(self.port, int) or isinstance(self.port, bool) or not bounds("port").holds(self.port):
            yield f"port: must be a TCP port 1-65535, got {self.port!r}"

    def _timing_errors(self) -> Iterator[str]:
        """The watchdog's timeout and the parameter servers' grace period."""
        if self.progress_timeout is not None:
            if not _positive(self.progress_timeout):
                yield f"progress_timeout: must be a positive number of seconds or None, got {self.progress_timeout!r}"
            elif self.training is not None and self.progress_timeout <= 2 * self.training.log_every_secs:
                yield (f"progress_timeout: {self.progress_timeout:g} s must exceed twice training.log_every_secs "
                       f"({self.training.log_every_secs:g} s): the chief reports its progress that often")
        if not _positive(self.ps_grace_seconds, zero=True):
            yield f"ps_grace_seconds: must be a number of seconds >= 0, got {self.ps_grace_seconds!r}"
        if self.health_timeout is not None and not _positive(self.health_timeout):
            yield f"health_timeout: must be a positive number of seconds or None, got {self.health_timeout!r}"

    # -- queries ------------------------------------------------------------------------
    def replicas(self, role: str) -> int:
        spec = self.roles.get(role)
        return spec.replicas if spec else 0

    def tasks(self) -> Iterator[tuple[str, int]]:
        """Every (role, index) of the group, in a stable order."""
        for role in ROLES:
            for index in range(self.replicas(role)):
                yield role, index

    def training_roles(self) -> tuple[str, ...]:
        """The roles whose tasks train and exit when done; the others serve until stopped (the
        ps, and in coordinator mode also the workers the chief drives)."""
        if self.training is not None and self.training.mode == "coordinator":
            return ("chief",)
        return ("chief", "worker")

    def chief_task(self) -> tuple[str, int]:
        """The task that checkpoints: the chief if there is one, else worker 0."""
        return ("chief", 0) if self.replicas("chief") else ("worker", 0)

    def health_bounds(self) -> HealthBounds | None:
        """How the tasks are asked whether they are alive; None when they are not asked."""
        if self.health_timeout is None:
            return None
        return HealthBounds(timeout_secs=self.health_timeout, period_secs=self.health_timeout)

    def answers_health(self, role: str) -> bool:
        """Whether tasks of ``role`` serve TensorFlow and so answer the health question: the
        runtime's ps, chief and workers (an evaluator exits at once; a command of one's own may
        serve nothing)."""
        return self.health_timeout is not None and self.roles[role].command is None and role != "evaluator"

    def health_command(self, targets: list[str], python: str | None = None) -> list[str]:
        """The health question to the tasks at ``targets`` (``host:port``)."""
        assert self.health_timeout is not None
        head = [python, *HEALTH_COMMAND[1:]] if python else list(HEALTH_COMMAND)
        return [*head, *targets, "--timeout", f"{self.health_timeout:g}"]

    def command(self, role: str, python: str | None = None) -> list[str]:
        """What a task of ``role`` runs. ``python`` replaces the interpreter (local backend)."""
        spec = self.roles[role]
        if spec.command is not None:
            return list(spec.command)
        assert self.training is not None
        head = [python or sys.executable, *RUNTIME_COMMAND[1:]] if python else list(RUNTIME_COMMAND)
        return head + self.training.to_args()


GroupSpec.__doc__ = (GroupSpec.__doc__ or "").replace(
    "{group_options}", group_parameter_docs(tuple(name for name in OPTIONS if name not in ROLE_COUNTS)))
