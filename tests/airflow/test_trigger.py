"""The deferrable sensor's trigger against real local groups (tiny stand-in task commands)."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from airflow_tf.backends import get_backend
from airflow_tf.cluster import GroupSpec, OutcomeCode, RoleSpec
from airflow_tf.triggers import WorkerCompletionTrigger

SERVE_FOREVER = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture
def launch_group(tmp_path):
    backend = get_backend("local", state_dir=str(tmp_path / "groups"))
    launched = []

    def launch(name: str, worker_code: str):
        spec = GroupSpec(name=name, roles={
            "ps": RoleSpec(1, command=SERVE_FOREVER, restart_policy="Never"),
            "worker": RoleSpec(2, command=[sys.executable, "-c", worker_code], restart_policy="Never"),
        })
        ref = backend.launch(spec)
        launched.append(ref)
        return ref

    yield launch
    for ref in launched:
        backend.teardown(ref)


async def _events(trigger: WorkerCompletionTrigger, timeout: float = 60) -> list:
    async def collect():
        return [event async for event in trigger.run()]

    return await asyncio.wait_for(collect(), timeout)


def test_serialize_round_trips():
    trigger = WorkerCompletionTrigger(group={"group": {"backend": "local", "name": "g", "options": {"state_dir": "/s"}}},
                                      log_tail_lines=5)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_tf.triggers.worker_completion.WorkerCompletionTrigger"
    assert WorkerCompletionTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_one_success_event_when_all_workers_finish(launch_group):
    ref = launch_group("trigger-ok", "print('trained')")
    events = asyncio.run(_events(WorkerCompletionTrigger(group=ref.to_dict())))
    assert len(events) == 1
    payload = events[0].payload
    assert payload["status"] == "success" and payload["reason_code"] == OutcomeCode.SUCCEEDED == "Succeeded"
    assert payload["counts"]["worker"]["Succeeded"] == 2
    assert payload["counts"]["ps"]["Running"] == 1, "parameter servers are not expected to finish"


def test_one_failure_event_naming_the_task_and_quoting_its_log(launch_group):
    ref = launch_group("trigger-bad", "import sys; print('bad input row 7'); sys.exit(3)")
    trigger = WorkerCompletionTrigger(group=ref.to_dict())
    events = asyncio.run(_events(trigger))
    assert len(events) == 1
    payload = events[0].payload
    assert payload["status"] == "failed" and payload["reason_code"] == "TaskFailed"
    assert "exit code 3" in payload["reason"] and payload["failed_task"]["role"] == "worker"
    assert "bad input row 7" in payload["log_tail"]
    again = asyncio.run(_events(WorkerCompletionTrigger(**trigger.serialize()[1])))
    assert [e.payload["status"] for e in again] == ["failed"], "running the trigger twice is harmless"


def _poke_until_done(sensor, timeout: float = 60, context=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = sensor.poke(context=context or {})
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError("the sensor never finished")


def test_poke_mode_succeeds_with_the_per_role_counts(launch_group):
    from airflow_tf.sensors import WorkerCompletionSensor

    ref = launch_group("poke-ok", "print('trained')")
    sensor = WorkerCompletionSensor(task_id="wait", group={"group": ref.to_dict()})
    result = _poke_until_done(sensor)
    assert result.is_done and result.xcom_value["counts"]["worker"]["Succeeded"] == 2
    assert result.xcom_value["reason_code"] == "Succeeded" and result.xcom_value["reason"] == (
        "all 2 training task(s) succeeded")


def test_poke_mode_fails_fast_naming_the_task_and_quoting_its_log(launch_group):
    from airflow_tf.sensors import TrainingGroupFailed, WorkerCompletionSensor

    ref = launch_group("poke-bad", "import sys; print('cannot read shard 3'); sys.exit(4)")
    sensor = WorkerCompletionSensor(task_id="wait", group=ref.to_dict())
    ti = _TaskInstance()
    with pytest.raises(TrainingGroupFailed, match=r"(?s)poke-bad-worker-\d.*exit code 4.*cannot read shard 3"):
        _poke_until_done(sensor, context={"ti": ti})
    assert ti.pushed["failure_code"] == "TaskFailed", "code can tell why the group failed without reading prose"
    assert ti.pushed["failure_reason"].startswith("task poke-bad-worker-")


# -- a wait that never ends: the bound fails it with what the group still waits for ----------------
TRAIN_FOREVER = "import time; time.sleep(600)"


class _TaskInstance:
    """Records what the sensor pushes for the Training view."""

    def __init__(self):
        self.pushed = {}

    def xcom_push(self, key, value):
        self.pushed[key] = value


def test_the_triggers_deadline_ends_the_wait_with_what_the_group_still_waits_for(launch_group):
    from airflow.providers.common.compat.sdk import AirflowSensorTimeout

    from airflow_tf.sensors import WorkerCompletionSensor

    ref = launch_group("trigger-late", TRAIN_FOREVER)
    trigger = WorkerCompletionTrigger(group=ref.to_dict(), deadline=time.time() + 1.5,
                                      deadline_label="the sensor's timeout (1.5 s)")
    started = time.monotonic()
    events = asyncio.run(_events(WorkerCompletionTrigger(**trigger.serialize()[1])))
    assert 1.0 < time.monotonic() - started < 15
    assert [e.payload["status"] for e in events] == ["timeout"]
    reason = events[0].payload["reason"]
    assert reason.startswith("training group trigger-late did not finish within the sensor's timeout (1.5 s): "
                             "workers done 0/2"), reason
    ti = _TaskInstance()
    sensor = WorkerCompletionSensor(task_id="wait", group=ref.to_dict(), deferrable=True)
    with pytest.raises(AirflowSensorTimeout, match="did not finish within the sensor's timeout"):
        sensor.execute_complete({"ti": ti}, events[0].payload)
    assert ti.pushed["failure_reason"] == reason, "the Training view shows why the wait failed"
    assert "failure_code" not in ti.pushed, "the group did not fail: the wait's bound ended it"


def test_a_deferred_wait_is_bounded_by_the_tighter_of_timeout_and_execution_timeout(launch_group):
    from datetime import timedelta

    from airflow.providers.common.compat.sdk import TaskDeferred

    from airflow_tf.sensors import WorkerCompletionSensor

    ref = launch_group("defer-bound", TRAIN_FOREVER)
    for timeout, execution_timeout, label in [(3600, timedelta(seconds=90), "its execution_timeout (90 s)"),
                                              (45, timedelta(hours=1), "the sensor's timeout (45 s)")]:
        sensor = WorkerCompletionSensor(task_id="wait", group=ref.to_dict(), deferrable=True, timeout=timeout,
                                        execution_timeout=execution_timeout)
        with pytest.raises(TaskDeferred) as deferred:
            sensor.execute({})
        trigger = deferred.value.trigger
        bound = min(timeout, execution_timeout.total_seconds())
        assert trigger.deadline_label == label
        assert abs(trigger.deadline - (time.time() + bound)) < 5
        # Airflow's own deferral timeout comes later: it is the net when no triggerer runs.
        assert deferred.value.timeout > timedelta(seconds=bound)


def test_poke_mode_timeouts_say_what_the_group_still_waits_for(launch_group):
    from datetime import timedelta

    from airflow.providers.common.compat.sdk import AirflowSensorTimeout, AirflowTaskTimeout
    from airflow.sdk.execution_time.timeout import timeout as execution_timeout

    from airflow_tf.sensors import WorkerCompletionSensor

    ref = launch_group("poke-late", TRAIN_FOREVER)
    ti = _TaskInstance()
    sensor = WorkerCompletionSensor(task_id="wait", group=ref.to_dict(), timeout=1, poke_interval=0.2)
    with pytest.raises(AirflowSensorTimeout, match=r"^training group poke-late did not finish within the sensor's "
                                                   r"timeout \(1 s\): workers done 0/2"):
        sensor.execute({"ti": ti})
    assert ti.pushed["failure_reason"].startswith("training group poke-late did not finish")
    # execution_timeout, as Airflow's task runner applies it (SIGALRM around execute).
    sensor = WorkerCompletionSensor(task_id="wait2", group=ref.to_dict(), poke_interval=0.2,
                                    execution_timeout=timedelta(seconds=2))
    with pytest.raises(AirflowTaskTimeout, match=r"within its execution_timeout \(2 s\): workers done 0/2"):
        with execution_timeout(2):
            sensor.execute({})
