"""What a platform team watches, through Airflow itself (``airflow dags test``, local processes):
the training's metrics arrive at a StatsD listener of the test's own (UDP on loopback) through
Airflow's ``Stats``, the chief's log lines reach the wait's task log while the group still runs,
and every task's log is kept in the run directory, bounded by ``[airflow_tf] kept_log_bytes``.

StatsD as a deployment turns it on (``[metrics] statsd_on``, host, port, prefix): in poke mode
plain StatsD (no tags: the names that carry the DAG and task are what tells runs apart), in
deferrable mode with ``statsd_influxdb_enabled`` (the tags appended to the name, less Airflow's
default ``statsd_disabled_tags``, ``job_id,run_id``)."""

from __future__ import annotations

import math
import re
import socket
import threading
from dataclasses import dataclass, field

import pytest

from airflow_tf.demo import dag_run_state, dags_test

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # a DAG run through Airflow, under load

KEPT_LOG_BYTES = 2000
PREFIX = "mlplatform"  # not Airflow's default, so the test sees that [metrics] statsd_prefix is used
TYPES = {"c": "counter", "g": "gauge", "ms": "timer", "h": "histogram", "s": "set", "d": "distribution"}


@dataclass(frozen=True)
class Sample:
    """One StatsD line, ``name:value|type[|@rate][|#tag,...]``; tags in the name the InfluxDB way
    (``name,key=value,...``) or DogStatsD's (``|#key:value,...``) both end up in ``tags``."""

    name: str
    value: float
    type: str
    rate: float = 1.0
    tags: dict[str, str] = field(default_factory=dict)


def parse_line(line: str) -> Sample:
    """A StatsD line, or ValueError saying what is wrong with it."""
    stat, sep, rest = line.partition(":")  # a name has no ':' (Airflow's name check), a DogStatsD tag may
    fields = rest.split("|")
    if not sep or not stat or len(fields) < 2 or fields[1] not in TYPES:
        raise ValueError(f"not name:value|type: {line!r}")
    name, *influx = stat.split(",")
    tags = dict(pair.split("=", 1) for pair in influx if "=" in pair)
    if len(tags) != len(influx):
        raise ValueError(f"a tag in the name is not key=value: {line!r}")
    rate = 1.0
    for extra in fields[2:]:
        if extra.startswith("@"):
            rate = float(extra[1:])
        elif extra.startswith("#"):
            tags.update(tuple(tag.split(":", 1)) if ":" in tag else (tag, "") for tag in extra[1:].split(","))
        else:
            raise ValueError(f"unknown field {extra!r}: {line!r}")
    value = float(fields[0])  # a delta gauge's sign ('+3') is read as the number it is
    return Sample(name, value, TYPES[fields[1]], rate, tags)


def test_the_parser_reads_each_form_of_the_line_protocol():
    assert parse_line("a.b:1|c") == Sample("a.b", 1.0, "counter")
    assert parse_line("a.b:12.500000|ms|@0.5") == Sample("a.b", 12.5, "timer", 0.5)
    assert parse_line("a.b,dag_id=d,task_id=t.w:3|g") == Sample("a.b", 3.0, "gauge", tags={"dag_id": "d", "task_id": "t.w"})
    assert parse_line("a.b:-2|g|#group:g1,x") == Sample("a.b", -2.0, "gauge", tags={"group": "g1", "x": ""})
    for bad in ("a.b", "a.b:1", "a.b:1|q", ":1|g", "a.b:x|g", "a.b,dag_id:1|g", "a.b:1|g|rate"):
        with pytest.raises(ValueError):
            parse_line(bad)


class StatsdListener:
    """A StatsD server's receiving end: UDP on 127.0.0.1 (a free port), every line of every
    datagram parsed and kept in order; a line that does not parse is kept in ``malformed``."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.samples: list[Sample] = []
        self.malformed: list[str] = []
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.settimeout(0.2)
        self.port = self._socket.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                datagram = self._socket.recv(65535)
            except TimeoutError:
                continue
            for line in datagram.decode("utf-8", "replace").splitlines():
                self.lines.append(line)
                try:
                    self.samples.append(parse_line(line))
                except ValueError:
                    self.malformed.append(line)

    def of(self, name: str) -> list[Sample]:
        return [sample for sample in self.samples if sample.name == name]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close()


def _instant(stamp: str) -> float:
    """Seconds since the epoch of an ISO 8601 UTC time (``2026-11-29T06:16:10.982585Z``)."""
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def statsd():
    listener = StatsdListener()
    yield listener
    listener.close()


@pytest.mark.parametrize(("dag_id", "influx_tags"), [("tf_test_observed", False), ("tf_test_observed_deferred", True)],
                         ids=["poke-plain-statsd", "deferred-statsd-influxdb-tags"])
def test_metrics_reach_a_statsd_listener_and_the_chief_log_is_followed_live_and_kept_bounded(
        airflow_home, tmp_path, statsd, group_processes, dag_id, influx_tags):
    env = dict(airflow_home.env,
               AIRFLOW_TF_STORAGE=str(tmp_path / "storage"), AIRFLOW_TF_STATE_DIR=str(tmp_path / "groups"),
               AIRFLOW__METRICS__STATSD_ON="True", AIRFLOW__METRICS__STATSD_HOST="127.0.0.1",
               AIRFLOW__METRICS__STATSD_PORT=str(statsd.port), AIRFLOW__METRICS__STATSD_PREFIX=PREFIX,
               AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED=str(influx_tags),
               AIRFLOW__AIRFLOW_TF__KEPT_LOG_BYTES=str(KEPT_LOG_BYTES))
    result = dags_test(env, dag_id)
    (tmp_path / f"{dag_id}.log").write_text(result.stdout)
    (tmp_path / "statsd.txt").write_text("\n".join(statsd.lines))
    assert dag_run_state(result.stdout) == "success", result.stdout[-4000:]
    group = next((tmp_path / "storage" / "runs").iterdir()).name
    output = result.stdout.splitlines()

    # Metrics, as a StatsD server receives them: every line well formed, under the configured prefix.
    assert not statsd.malformed, statsd.malformed[:5]
    ours = sorted({s.name for s in statsd.samples if s.name.startswith(f"{PREFIX}.airflow_tf.")})
    assert ours and all(s.name.startswith(f"{PREFIX}.") for s in statsd.samples), sorted({s.name for s in statsd.samples})

    def metric(name: str, kind: str, task: str = "training.wait_for_workers", **tags: str) -> list[float]:
        """The values of ``<prefix>.airflow_tf.<name>``, each checked for its type and tags, and
        that the same values went out under the name that carries the DAG and task."""
        stat = f"{PREFIX}.airflow_tf.{name}"
        samples = statsd.of(stat)
        assert samples, f"no {stat}; received: {ours}"
        expected = {"dag_id": dag_id, "task_id": task, **tags} if influx_tags else {}
        for sample in samples:
            assert (sample.type, sample.tags, sample.rate) == (kind, expected, 1.0), sample
        legacy = statsd.of(f"{stat}.{dag_id}.{task.replace('.', '__')}")
        assert [(s.type, s.value) for s in legacy] == [(s.type, s.value) for s in samples], (stat, legacy)
        return [sample.value for sample in samples]

    rates = metric("training.steps_per_second", "gauge", group=group)
    assert all(rate > 0 for rate in rates), rates
    examples = metric("training.examples_per_second", "gauge", group=group)
    assert all(value > 0 for value in examples), examples
    losses = metric("training.loss", "gauge", group=group)
    assert all(math.isfinite(loss) and loss >= 0 for loss in losses), losses
    steps = metric("training.global_step", "gauge", group=group)
    assert steps == sorted(steps) and 0 < steps[-1] <= 4000, steps
    percent = metric("training.percent_done", "gauge", group=group)
    assert all(0 <= value <= 100 for value in percent) and percent == sorted(percent), percent
    eta = metric("training.eta_seconds", "gauge", group=group)
    # The chief's estimate: large from the first slow steps, then falling; under the DAG's timeout at the end.
    assert all(math.isfinite(value) and value >= 0 for value in eta) and eta[-1] < min(600, max(eta)), eta
    waited = metric("training.queue_wait", "timer", group=group)  # milliseconds, sent once per wait
    assert len(waited) == 1 and 0 <= waited[0] < 120_000, waited
    # No task of the group was restarted, so no replacement was counted.
    assert not [s for s in statsd.samples if "task_replacements" in s.name], "a replacement was counted"
    assert "--- airflow-tf: restart" not in "".join(
        p.read_text() for p in (tmp_path / "storage" / "runs" / group / "logs").rglob("*.log"))
    mse = metric("evaluation.mse", "gauge", task="training.evaluate", model="observed")
    assert len(mse) == 1 and math.isfinite(mse[0]) and 0 <= mse[0] <= 100, mse  # the DAG's threshold: 100
    assert metric("evaluation.blessed", "gauge", task="training.evaluate", model="observed") == [1.0]
    exported = [int(path.name) for path in (tmp_path / "storage" / "models" / "observed").iterdir()]
    assert exported == [1]
    assert metric("export.version", "gauge", task="training.export", model="observed") == [1.0]

    # Live logs: the chief's lines were in the wait's task log while the chief still ran.
    chief = f"[{group}-worker-0] "
    followed = [line for line in output if chief in line]
    assert followed, "\n".join(output[-200:])
    exit_line = next(line for line in followed if "airflow-tf task exit role=worker index=0" in line)
    chief_exited = exit_line.split(chief)[1].split()[0]  # the chief's own clock, as Airflow's, UTC
    first_logged = followed[0].split()[0]  # when Airflow logged the first followed line
    assert _instant(first_logged) < _instant(chief_exited), (followed[0], exit_line)
    progress = re.compile(re.escape(chief) + r".*airflow-tf progress global_step=(\d+) target_step=4000")
    logged_steps = [int(m.group(1)) for line in followed if (m := progress.search(line))]
    assert logged_steps and logged_steps[0] < 4000 and logged_steps == sorted(logged_steps), logged_steps
    bodies = [line.split(chief, 1)[1] for line in followed]
    assert len(bodies) == len(set(bodies)), "a line of the chief's was logged twice"

    # Kept logs: every task's, in the run directory, the end of each within the bound.
    kept = sorted((tmp_path / "storage" / "runs" / group / "logs").rglob("*.log"))
    names = {path.name for path in kept}
    assert {f"{group}-worker-0.log", f"{group}-ps-0.log"} <= names, names
    for path in kept:
        assert path.stat().st_size <= KEPT_LOG_BYTES, path
    worker = next(path for path in kept if path.name == f"{group}-worker-0.log").read_text()
    assert worker.startswith("[airflow-tf: the first ") and f"kept_log_bytes is {KEPT_LOG_BYTES}" in worker.splitlines()[0]
    assert "global_step=4000" in worker  # the end of the log is what is kept
    assert not group_processes(tmp_path / "groups"), "no process of the group is left"
