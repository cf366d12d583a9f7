"""The deferrable sensor's trigger against real local groups (tiny stand-in task commands)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from airflow_tf.backends import get_backend
from airflow_tf.cluster import GroupSpec, RoleSpec
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
    assert payload["status"] == "success"
    assert payload["counts"]["worker"]["Succeeded"] == 2
    assert payload["counts"]["ps"]["Running"] == 1, "parameter servers are not expected to finish"


def test_one_failure_event_naming_the_task_and_quoting_its_log(launch_group):
    ref = launch_group("trigger-bad", "import sys; print('bad input row 7'); sys.exit(3)")
    trigger = WorkerCompletionTrigger(group=ref.to_dict())
    events = asyncio.run(_events(trigger))
    assert len(events) == 1
    payload = events[0].payload
    assert payload["status"] == "failed"
    assert "exit code 3" in payload["reason"] and payload["failed_task"]["role"] == "worker"
    assert "bad input row 7" in payload["log_tail"]
    again = asyncio.run(_events(WorkerCompletionTrigger(**trigger.serialize()[1])))
    assert [e.payload["status"] for e in again] == ["failed"], "running the trigger twice is harmless"


def _poke_until_done(sensor, timeout: float = 60):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = sensor.poke(context={})
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


def test_poke_mode_fails_fast_naming_the_task_and_quoting_its_log(launch_group):
    from airflow_tf.sensors import TrainingGroupFailed, WorkerCompletionSensor

    ref = launch_group("poke-bad", "import sys; print('cannot read shard 3'); sys.exit(4)")
    sensor = WorkerCompletionSensor(task_id="wait", group=ref.to_dict())
    with pytest.raises(TrainingGroupFailed, match=r"(?s)poke-bad-worker-\d.*exit code 4.*cannot read shard 3"):
        _poke_until_done(sensor)
