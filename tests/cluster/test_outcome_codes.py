"""Every kind of group outcome carries its code, so code can branch without reading the prose."""

import pytest

from airflow_tf.cluster import GroupStatus, OutcomeCode, Phase, ReasonCode, TaskStatus, group_outcome


def _group(*workers: TaskStatus, failure=None, failure_code=None, exists=True) -> GroupStatus:
    return GroupStatus("g", [TaskStatus("ps", 0, "g-ps-0", Phase.RUNNING), *workers], failure=failure,
                       failure_code=failure_code, exists=exists)


def _worker(index, phase, reason=None, code=None) -> TaskStatus:
    return TaskStatus("worker", index, f"g-worker-{index}", phase, reason=reason, code=code)


def test_an_outcome_not_done_says_whether_training_started():
    assert group_outcome(GroupStatus("g", [TaskStatus("ps", 0, "g-ps-0", Phase.RUNNING)])).code is OutcomeCode.WAITING
    running = group_outcome(_group(_worker(0, Phase.SUCCEEDED), _worker(1, Phase.RUNNING)))
    assert (running.done, running.code) == (False, OutcomeCode.RUNNING)


@pytest.mark.parametrize("policy", ["AllWorkers", "ChiefOrWorker0"])
def test_success_under_either_policy_is_succeeded(policy):
    outcome = group_outcome(_group(_worker(0, Phase.SUCCEEDED), _worker(1, Phase.SUCCEEDED)), policy)
    assert outcome.succeeded and outcome.code is OutcomeCode.SUCCEEDED


def test_a_group_that_does_not_exist_is_not_found():
    outcome = group_outcome(_group(exists=False))
    assert (outcome.done, outcome.succeeded, outcome.code) == (True, False, OutcomeCode.GROUP_NOT_FOUND)


@pytest.mark.parametrize("task_code, expected", [
    (None, OutcomeCode.TASK_FAILED),
    (ReasonCode.OOM_KILLED, OutcomeCode.OUT_OF_MEMORY),
    (ReasonCode.IMAGE_PULL, OutcomeCode.IMAGE_PULL),
    (ReasonCode.CONFIG_MISSING, OutcomeCode.CONFIG_MISSING),
    (ReasonCode.UNSCHEDULABLE, OutcomeCode.UNSCHEDULABLE),
    (ReasonCode.EVICTED, OutcomeCode.EVICTED),
    (ReasonCode.PREEMPTED, OutcomeCode.PREEMPTED),
    (ReasonCode.DEADLINE_EXCEEDED, OutcomeCode.DEADLINE_EXCEEDED),
    (ReasonCode.STUCK, OutcomeCode.STUCK),
    (ReasonCode.NO_PROGRESS, OutcomeCode.NO_PROGRESS),
    (ReasonCode.GROUP_RESTARTED, OutcomeCode.TASK_FAILED),
])
def test_a_failed_task_gives_the_group_the_code_of_its_reason(task_code, expected):
    failed = _worker(1, Phase.FAILED, reason="the words people read", code=task_code)
    outcome = group_outcome(_group(_worker(0, Phase.RUNNING), failed))
    assert (outcome.done, outcome.succeeded, outcome.code, outcome.failed_task) == (True, False, expected, failed)
    assert outcome.reason == "task g-worker-1 (worker 1) failed: the words people read", "the message is kept"


def test_the_groups_own_failure_carries_its_code_and_keeps_it_through_the_state_file():
    status = _group(_worker(0, Phase.RUNNING), failure="the active deadline of 5 s passed",
                    failure_code=OutcomeCode.DEADLINE_EXCEEDED)
    outcome = group_outcome(status)
    assert (outcome.done, outcome.code, outcome.reason) == (True, OutcomeCode.DEADLINE_EXCEEDED,
                                                           "the active deadline of 5 s passed")
    assert group_outcome(GroupStatus.from_dict(status.to_dict())).code is OutcomeCode.DEADLINE_EXCEEDED


def test_a_group_failure_without_a_code_is_group_failed():
    outcome = group_outcome(_group(_worker(0, Phase.RUNNING), failure="something went wrong"))
    assert outcome.done and outcome.code is OutcomeCode.GROUP_FAILED


def test_the_group_failure_wins_over_a_task_stopped_because_of_it():
    stopped = _worker(0, Phase.FAILED, reason="stopped: the launcher exited")
    outcome = group_outcome(_group(stopped, failure="the launcher exited", failure_code=OutcomeCode.LAUNCHER_EXITED))
    assert outcome.code is OutcomeCode.LAUNCHER_EXITED and outcome.failed_task is None
