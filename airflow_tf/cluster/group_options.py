"""A group's options, declared once: :class:`GroupOptions` holds every option a user sets on a
training group (its tasks, restarts, completion rule, port, network and environment) with its
default, bounds and documentation. :class:`~airflow_tf.cluster.spec.GroupSpec`'s defaults and
checks, the launch operator's parameter documentation and the flags of ``airflow-tf run`` and
``airflow-tf render`` are made from these declarations."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .declarations import Bounds, flag_name, flag_settings, option, parameter_docs
from .status import ALL_WORKERS, CHIEF_OR_WORKER0

HEALTH_FAILURES = 3
"""Questions in a row a task may leave unanswered before it is stuck: one slow answer is not."""


@dataclass(frozen=True)
class GroupOptions:
    """The options of a training group a user sets, each with its default, bounds and documentation."""

    ps: int = option(1, "parameter-server tasks", bounds=Bounds(1))
    workers: int = option(2, "worker tasks", bounds=Bounds(1))
    chief: int = option(0, "separate chief tasks, 0 or 1", bounds=Bounds(0, 1),
                        note="``mode=\"coordinator\"`` needs one")
    backoff_limit: int = option(
        3, "restarts of each failed task before the group fails", bounds=Bounds(0),
        python="per role and index, on every backend (Kubernetes' ``backoffLimitPerIndex``); a parameter "
        "server's death restarts the whole local group, but counts only against that parameter server's budget")
    group_backoff_limit: int | None = option(
        None, "restarts of all the group's tasks together before the group fails", bounds=Bounds(0),
        python="local backend only (the Kubernetes backend refuses it); None: only ``backoff_limit`` applies")
    active_deadline_seconds: float | None = option(
        None, "fail the group if it runs longer than this many seconds", bounds=Bounds(0, low_open=True),
        cli={"flag": "deadline", "metavar": "SECONDS"})
    success_policy: str = option(
        ALL_WORKERS, "what makes the group succeed",
        python=f"``{ALL_WORKERS}``: every worker and the chief done; ``{CHIEF_OR_WORKER0}``: the chief, else worker 0")
    port: int = option(2222, "gRPC port of every task", bounds=Bounds(1, 65535),
                       python="Kubernetes only: a local group's tasks get free ports")
    isolate_network: bool = option(
        True, "local backend: run the group in a private network namespace, reachable from nowhere and unable "
        "to reach anything either", unset=True,
        python="a group whose dataset is on ``gs://`` needs ``False``: its gRPC ports then listen on every "
        "interface without authentication (firewall them)")
    pass_env: tuple[str, ...] = option(
        (), "variables of the launching environment passed on to the tasks, which otherwise get a minimal one",
        python="local backend; names, e.g. ``[\"GOOGLE_APPLICATION_CREDENTIALS\"]``: nothing else of the launcher's "
        "environment (its Airflow settings, connections, secrets) reaches them",
        cli={"note": "may be repeated", "action": "append", "default": [], "metavar": "NAME"})
    progress_timeout: float | None = option(
        300.0, "restart a training task with no progress for this long", bounds=Bounds(0, low_open=True),
        python="seconds, under the task's restart policy; None: never", cli={"zero": "0 never", "metavar": "SECONDS"})
    ps_grace_seconds: float = option(
        5.0, "seconds the parameter servers run on after the last worker finished, before the group stops them",
        bounds=Bounds(0), python="local backend")
    health_timeout: float | None = option(
        5.0, f"seconds each ps and worker has to answer its health question, asked this often; {HEALTH_FAILURES} "
        "unanswered in a row restart it", bounds=Bounds(0, low_open=True),
        python="its TensorFlow server is asked for its status; a stuck task (stopped, wedged, cut off) is killed and "
        "restarted under its restart policy, by the supervisor (local) or its liveness probe (Kubernetes); None: "
        "never asked", cli={"zero": "0 never", "metavar": "SECONDS"})


OPTIONS = {field.name: field for field in dataclasses.fields(GroupOptions)}
DEFAULTS = GroupOptions()
ROLE_COUNTS = ("ps", "workers", "chief")
"""The group options that are task counts: parameters of ``GroupSpec.for_training``; the others
are fields of :class:`~airflow_tf.cluster.spec.GroupSpec`."""
LAUNCH_OPTIONS = ("ps", "workers", "chief", "backoff_limit", "active_deadline_seconds", "success_policy", "port",
                  "isolate_network", "pass_env")
"""The group options that are parameters of the launch operator (the others are set on a
:class:`~airflow_tf.cluster.spec.GroupSpec` or on the command line)."""


def default(name: str) -> Any:
    """The default of an option."""
    return OPTIONS[name].default


def bounds(name: str) -> Bounds:
    """The bounds of a number option."""
    found = OPTIONS[name].metadata["bounds"]
    assert found is not None, name
    return found


def group_parameter_docs(names: tuple[str, ...] = LAUNCH_OPTIONS, indent: str = "    ") -> str:
    """A ``:param name: ...`` line per group option of ``names``."""
    return parameter_docs((OPTIONS[name] for name in names), indent=indent)


def add_group_arguments(parser: Any, *names: str) -> None:
    """The group options ``names`` as flags (``--workers``, ``--deadline`` ...), made from their
    declarations: type, default, help."""
    for name in names:
        parser.add_argument(flag_name(OPTIONS[name]), **flag_settings(OPTIONS[name]))


def group_options_of(args: Any, *names: str) -> dict[str, Any]:
    """The values of the flags of the group options ``names`` (:func:`add_group_arguments`), by
    option name; 0 for an option where it means never is None."""
    values = {}
    for name in names:
        field = OPTIONS[name]
        value = getattr(args, flag_name(field)[2:].replace("-", "_"))
        values[name] = None if value == 0 and "zero" in field.metadata["cli"] else value
    return values
