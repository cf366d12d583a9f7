"""Training metrics through Airflow's own ``Stats``: whatever the deployment configured in
``[metrics]`` (StatsD, Datadog's DogStatsD or OpenTelemetry) receives them, under Airflow's
``statsd_prefix`` (``airflow.`` by default), as Airflow's own metrics.

Every name starts with ``airflow_tf.``; every metric is tagged as Airflow tags its task metrics
(``dag_id``, ``task_id``, and ``team_name`` in multi-team mode) plus ``run_id`` and, for a
mapped task, ``map_index``; the training's carry ``group`` (the training group's name). Plain
StatsD drops tags (unless ``statsd_influxdb_enabled``), so, as Airflow does for its own metrics
while ``[metrics] legacy_names_on`` holds, each metric is also sent under a name that carries
the DAG and task: ``airflow_tf.training.loss.<dag_id>.<task_id>``.

The table of metrics: docs/reference/metrics.md. Sending a metric never fails a task: a metrics
backend that cannot be reached is Airflow's business (it logs it), not the training's.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from airflow_tf.cluster import GroupStatus, Phase

log = logging.getLogger(__name__)

PREFIX = "airflow_tf"

STEPS_PER_SECOND = f"{PREFIX}.training.steps_per_second"
EXAMPLES_PER_SECOND = f"{PREFIX}.training.examples_per_second"
LOSS = f"{PREFIX}.training.loss"
GLOBAL_STEP = f"{PREFIX}.training.global_step"
PERCENT = f"{PREFIX}.training.percent_done"
ETA = f"{PREFIX}.training.eta_seconds"
QUEUE_WAIT = f"{PREFIX}.training.queue_wait"
REPLACEMENTS = f"{PREFIX}.training.task_replacements"
EVALUATION = f"{PREFIX}.evaluation"
EXPORT_VERSION = f"{PREFIX}.export.version"


def _stats() -> Any:
    """Airflow's Stats module for this release, set up from ``[metrics]`` when the process
    running this did not set it up itself."""
    try:  # Airflow 3.2 on: the task SDK's own
        from airflow.sdk._shared.observability.metrics import stats
        from airflow.sdk.observability.metrics import stats_utils
    except ImportError:  # Airflow 3.1: configured from [metrics] on first use
        from airflow.stats import Stats

        return Stats
    # The task runner initializes this module; a triggerer's runner initializes the core's copy
    # of it only, so a trigger would send nothing without this.
    if getattr(stats, "_factory", None) is None:
        from airflow.configuration import conf

        stats.initialize(factory=stats_utils.get_stats_factory(),
                         export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=True))
    return stats


def _legacy_names_on() -> bool:
    from airflow.configuration import conf

    return conf.getboolean("metrics", "legacy_names_on", fallback=True)


def _legacy_name(stat: str, tags: dict[str, str]) -> str | None:
    """``<stat>.<dag_id>.<task_id>`` with each '.' of an id as '__' (Airflow's rule for its own
    legacy names: a task in a task group keeps the name's segments apart)."""
    if "dag_id" not in tags or "task_id" not in tags:
        return None
    return ".".join([stat, *(tags[key].replace(".", "__") for key in ("dag_id", "task_id"))])


def _send(kind: str, stat: str, value: float, tags: dict[str, str]) -> None:
    try:
        stats = _stats()
        names = [stat]
        if _legacy_names_on() and (legacy := _legacy_name(stat, tags)):
            names.append(legacy)
        for name in names:
            if kind == "gauge":
                stats.gauge(name, value, tags=tags)
            elif kind == "incr":
                stats.incr(name, int(value), tags=tags)
            else:
                stats.timing(name, value, tags=tags)
    except Exception as err:  # a metric never fails the training
        log.warning("could not send metric %s: %s", stat, err)


def _stat_part(name: str) -> str:
    """A metric name segment from a user's metric name (``mean_absolute_error``, ``auc``)."""
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in name) or "_"


def task_tags(context: Any, **extra: Any) -> dict[str, str]:
    """The tags of a task's metrics: Airflow's own (``dag_id``, ``task_id``, ``team_name``),
    ``run_id``, ``map_index`` when mapped, then ``extra`` (None values left out)."""
    ti: Any = (context or {}).get("ti")
    tags = dict(getattr(ti, "stats_tags", None) or {})  # Airflow 3.1's task instance has none
    for key in ("dag_id", "task_id", "run_id"):
        if getattr(ti, key, None) is not None:
            tags.setdefault(key, str(getattr(ti, key)))
    if (map_index := getattr(ti, "map_index", None)) not in (None, -1):
        tags["map_index"] = str(map_index)
    tags.update({k: str(v) for k, v in extra.items() if v is not None})
    return tags


class TrainingMetrics:
    """The metrics of one training group, sent from its wait each time it reads the group's
    status (poke mode: each poke; deferrable: each status the trigger reads).

    The step rate is measured by the wait between two readings of the global step; the queue
    wait is the time from ``started_at`` (when the wait began, right after the launch) until
    every task of the group left Pending, sent once. ``state()`` carries what was measured
    from the sensor to its trigger, so nothing is counted twice."""

    def __init__(self, tags: dict[str, str], *, started_at: float | None = None,
                 state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.tags = dict(tags)
        self.started_at = state.get("started_at", started_at if started_at is not None else time.time())
        self.queue_wait_sent = bool(state.get("queue_wait_sent", False))
        self.restarts = int(state.get("restarts", 0))
        self.last_step: tuple[float, int] | None = tuple(state["last_step"]) if state.get("last_step") else None

    def state(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "queue_wait_sent": self.queue_wait_sent,
                "restarts": self.restarts, "last_step": list(self.last_step) if self.last_step else None}

    def observe(self, status: GroupStatus, now: float | None = None) -> None:
        now = time.time() if now is None else now
        if not status.exists:
            return
        if not self.queue_wait_sent and status.tasks and all(t.phase is not Phase.PENDING for t in status.tasks):
            self.queue_wait_sent = True
            _send("timing", QUEUE_WAIT, max(0.0, now - self.started_at) * 1000.0, self.tags)
        restarts = sum(t.restarts for t in status.tasks)
        if restarts > self.restarts:
            _send("incr", REPLACEMENTS, restarts - self.restarts, self.tags)
            self.restarts = restarts
        self._progress(status.progress, now)

    def _progress(self, progress: dict[str, Any] | None, now: float) -> None:
        if not progress:
            return
        step = int(progress["global_step"])
        _send("gauge", GLOBAL_STEP, step, self.tags)
        if self.last_step is not None and step > self.last_step[1] and now > self.last_step[0]:
            _send("gauge", STEPS_PER_SECOND, (step - self.last_step[1]) / (now - self.last_step[0]), self.tags)
        if self.last_step is None or step != self.last_step[1]:
            self.last_step = (now, step)
        for stat, key in ((EXAMPLES_PER_SECOND, "examples_per_sec"), (LOSS, "loss"), (ETA, "eta_seconds"),
                          (PERCENT, "percent")):
            value = progress.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                _send("gauge", stat, float(value), self.tags)


def send_evaluation(metrics: dict[str, Any], tags: dict[str, str], *, blessed: bool | None = None) -> None:
    """``airflow_tf.evaluation.<metric>`` for each finite number among ``metrics``, and
    ``airflow_tf.evaluation.blessed`` (1 or 0)."""
    for name, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            _send("gauge", f"{EVALUATION}.{_stat_part(name)}", float(value), tags)
    if blessed is not None:
        _send("gauge", f"{EVALUATION}.blessed", 1.0 if blessed else 0.0, tags)


def send_export_version(version: int | str, tags: dict[str, str]) -> None:
    """``airflow_tf.export.version``: the version number just published."""
    try:
        number = float(version)
    except (TypeError, ValueError):
        log.warning("export version %r is not a number; metric %s not sent", version, EXPORT_VERSION)
        return
    _send("gauge", EXPORT_VERSION, number, tags)
