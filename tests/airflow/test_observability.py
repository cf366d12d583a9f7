"""What a platform team watches, through Airflow itself (``airflow dags test``, local processes):
the training's metrics arrive at a metrics receiver (the test's own OpenTelemetry collector: an
OTLP/HTTP endpoint on loopback) through Airflow's ``Stats``, the chief's log lines reach the
wait's task log while the group still runs, and every task's log is kept in the run directory,
bounded by ``[airflow_tf] kept_log_bytes``.

OpenTelemetry rather than StatsD: Airflow's StatsD client needs the ``statsd`` package
(``apache-airflow[statsd]``), which this project's locks do not install; both go through the
same ``Stats`` calls."""

from __future__ import annotations

import http.server
import math
import re
import threading

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from airflow_tf.demo import dag_run_state, dags_test

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # a DAG run through Airflow, under load

KEPT_LOG_BYTES = 2000


def _attributes(point) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


class OtlpReceiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP metrics endpoint: every data point posted to /v1/metrics, kept in order as
    (name, kind, value, attributes); a histogram's value is (count, sum)."""

    def __init__(self) -> None:
        self.points: list[tuple[str, str, object, dict[str, str]]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the base class's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.take(ExportMetricsServiceRequest.FromString(body))
                answer = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.port = self.server_address[1]
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    def take(self, request) -> None:
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    if kind in ("gauge", "sum"):
                        for point in getattr(metric, kind).data_points:
                            value = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
                            self.points.append((metric.name, kind, value, _attributes(point)))
                    elif kind in ("histogram", "exponential_histogram"):
                        for point in getattr(metric, kind).data_points:
                            self.points.append((metric.name, kind, (point.count, point.sum), _attributes(point)))

    def values(self, name: str) -> list[tuple[object, str, dict[str, str]]]:
        return [(value, kind, tags) for stat, kind, value, tags in self.points if stat == name]

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def _instant(stamp: str) -> float:
    """Seconds since the epoch of an ISO 8601 UTC time (``2026-11-29T06:16:10.982585Z``)."""
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def otlp():
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


@pytest.mark.parametrize("dag_id", ["tf_test_observed", "tf_test_observed_deferred"])
def test_metrics_reach_the_collector_and_the_chief_log_is_followed_live_and_kept_bounded(airflow_home, tmp_path, otlp,
                                                                                         group_processes, dag_id):
    env = dict(airflow_home.env,
               AIRFLOW_TF_STORAGE=str(tmp_path / "storage"), AIRFLOW_TF_STATE_DIR=str(tmp_path / "groups"),
               AIRFLOW__METRICS__OTEL_ON="True", AIRFLOW__METRICS__OTEL_HOST="127.0.0.1",
               AIRFLOW__METRICS__OTEL_PORT=str(otlp.port), AIRFLOW__METRICS__OTEL_INTERVAL_MILLISECONDS="500",
               AIRFLOW__AIRFLOW_TF__KEPT_LOG_BYTES=str(KEPT_LOG_BYTES))
    result = dags_test(env, dag_id)
    (tmp_path / f"{dag_id}.log").write_text(result.stdout)
    assert dag_run_state(result.stdout) == "success", result.stdout[-4000:]
    group = next((tmp_path / "storage" / "runs").iterdir()).name
    output = result.stdout.splitlines()

    # Metrics, as a dashboard reads them: Airflow's prefix, tagged with the DAG, task, run and group.
    rate = otlp.values("airflow.airflow_tf.training.steps_per_second")
    assert rate and all(value > 0 for value, _, _ in rate), sorted({p[0] for p in otlp.points})
    tags = rate[0][2]
    assert (tags["dag_id"], tags["task_id"], tags["group"]) == (dag_id, "training.wait_for_workers", group), tags
    assert tags["run_id"].startswith("manual__"), tags
    losses = [value for value, _, _ in otlp.values("airflow.airflow_tf.training.loss")]
    assert losses and all(math.isfinite(loss) and loss >= 0 for loss in losses)
    examples = otlp.values("airflow.airflow_tf.training.examples_per_second")
    assert examples and all(value > 0 for value, _, _ in examples)
    steps = [value for value, _, _ in otlp.values("airflow.airflow_tf.training.global_step")]
    assert steps and steps == sorted(steps) and 0 < steps[-1] <= 4000, steps
    assert otlp.values("airflow.airflow_tf.training.eta_seconds")
    waited = otlp.values("airflow.airflow_tf.training.queue_wait")  # a timer: (count, sum in ms)
    assert waited and waited[-1][0][0] == 1 and 0 <= waited[-1][0][1] < 120_000, waited
    # Where tags are dropped (plain StatsD), the name carries the DAG and task, as Airflow's legacy names.
    assert otlp.values(f"airflow.airflow_tf.training.loss.{dag_id}.training__wait_for_workers")
    mse = otlp.values("airflow.airflow_tf.evaluation.mse")
    assert mse and len({value for value, _, _ in mse}) == 1 and math.isfinite(mse[0][0])
    assert mse[0][2]["task_id"] == "training.evaluate" and mse[0][2]["model"] == "observed"
    assert {value for value, _, _ in otlp.values("airflow.airflow_tf.evaluation.blessed")} == {1.0}
    exported = [int(path.name) for path in (tmp_path / "storage" / "models" / "observed").iterdir()]
    version = otlp.values("airflow.airflow_tf.export.version")
    assert exported == [1] and {value for value, _, _ in version} == {1.0}, version
    assert version[0][2]["task_id"] == "training.export"

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
