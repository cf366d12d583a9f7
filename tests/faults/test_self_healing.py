"""A local group heals itself: a task that stops answering its health question (frozen by
SIGSTOP, or its ps cut off from the group's network) is killed and restarted by the supervisor
within the bound docs/reference/faults.md gives, training moves again within 90 s, the run
finishes, and no more steps are lost than since the last checkpoint. Each test counts only its
own processes (the ``local_state_dir`` fixture)."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable

import pytest
from processes import can_cut, cut_port, restore_network
from test_local_group import SESSION_READY, linear_group

from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.wait import wait_for_group, waiting_message
from airflow_tf.cluster import GroupStatus
from airflow_tf.cluster.progress import parse_progress
from airflow_tf.files import read_json
from airflow_tf.runtime import models
from airflow_tf.sensors.worker_completion import REPLACEMENTS_XCOM_KEY, WorkerCompletionSensor

pytestmark = pytest.mark.slow

MOVES_AGAIN_WITHIN = 90.0
"""The issue's bound from the fault to training moving again, on a loaded 2-core machine."""
STEPS = 2000
"""Long enough that the fault lands mid-run (at the first checkpoint past step 300, which comes
every 0.5 s), and no longer: the steps after the recovery only cost the other tests CPU (a
frozen chief's other worker may even train to the end meanwhile; the chief, restoring the
checkpoint, trains the rest alone). Only the chief writes checkpoints: with two workers, a chief
held up on a loaded machine (one CI run: 5 s in a save) sees the other worker train far past its
newest checkpoint, so a test whose fault must meet a worker still training runs the chief alone."""
STUCK = re.compile(r"stuck: its TensorFlow server left 3 health questions in a row unanswered")


def checkpoint_step(run_dir) -> int:
    newest = models.latest_checkpoint(run_dir)
    return int(newest.rsplit("-", 1)[1]) if newest else 0


RESTART = "--- airflow-tf: restart"


def since_restart(backend, ref) -> dict | None:
    """The chief's newest progress report since it was last restarted."""
    return parse_progress(backend.logs(ref, "worker", 0).rsplit(RESTART, 1)[-1])


def heal(linear_dataset, tmp_path, wait_until, name: str, fault: Callable[[LocalBackend, object], None],
         replaced: str, repair: Callable[[LocalBackend, object], None] | None = None,
         workers: int = 2, steps: int = STEPS) -> GroupStatus:
    """Launch a group, apply ``fault`` mid-run, check that ``replaced`` (a task name) is killed as
    stuck, ``repair`` the fault, and check that the chief resumes from the newest checkpoint,
    training moves again within the bound and the run finishes."""
    run_dir = tmp_path / "run"
    backend = LocalBackend()
    ref = backend.launch(linear_group(name, linear_dataset, run_dir, steps=steps, workers=workers))
    try:
        wait_until(lambda: checkpoint_step(run_dir) >= 300, 600, what="a checkpoint past step 300")
        # And the supervisor has read a progress line of the chief's: a chief frozen before its first
        # one (and before its first health answer) is rightly judged stuck while starting.
        wait_until(lambda: (backend.status(ref).progress or {}).get("global_step", 0) > 0, 60,
                   what="the supervisor to see the chief step")
        faulted_at = time.monotonic()
        saved = checkpoint_step(run_dir)
        fault(backend, ref)
        replaced_status = wait_until(lambda: (t := next(t for t in backend.status(ref).tasks if t.name == replaced))
                                     .restarts and t, 120, what=f"{replaced} to be replaced")
        assert STUCK.search(replaced_status.reason or ""), replaced_status.reason
        # What the sensor logs while it waits.
        assert f"; replaced: {replaced} restarted 1 time(s), last: stuck: its TensorFlow server" in waiting_message(
            backend.status(ref), "AllWorkers")
        # What the sensor records for the Training view's "Replaced" column.
        pushed = {}
        WorkerCompletionSensor(task_id="wait", group=ref.to_dict()).poke({"ti": XComRecorder(pushed)})
        assert pushed[REPLACEMENTS_XCOM_KEY][0].startswith(f"{replaced} restarted 1 time(s), last: stuck: its"), pushed
        detected = time.monotonic() - faulted_at
        if repair is not None:
            repair(backend, ref)
        # The chief was restarted (alone, or with its group after a ps): its new session restores the newest checkpoint.
        ready = wait_until(lambda: RESTART in (log := backend.logs(ref, "worker", 0)) and SESSION_READY.findall(
            log.rsplit(RESTART, 1)[1]), 120, what="the chief's session after the replacement")
        assert int(ready[0]) >= saved, f"the chief resumed at step {ready[0]}, before the checkpoint at step {saved}"
        resumed = int(ready[0])
        moving = wait_until(lambda: (p := since_restart(backend, ref)) and p["global_step"] >= resumed + 100 and p,
                            MOVES_AGAIN_WITHIN, what="training to move again")
        moved = time.monotonic() - faulted_at
        print(f"{name}: {replaced} replaced {detected:.1f} s after the fault; training moved again "
              f"{moved:.1f} s after it (global step {moving['global_step']})")
        assert moved <= MOVES_AGAIN_WITHIN
        outcome, status = wait_for_group(backend, ref, timeout=900)
        assert outcome.succeeded, outcome.reason
        assert status.progress["global_step"] >= steps
        return status
    finally:
        backend.teardown(ref)


class XComRecorder:
    """What the sensor pushes, as a task instance would store it."""

    def __init__(self, pushed: dict) -> None:
        self.pushed = pushed

    def xcom_push(self, key: str, value) -> None:
        self.pushed[key] = value


def freeze(task: str) -> Callable[[LocalBackend, object], None]:
    def fault(backend, ref) -> None:
        os.kill(backend.processes(ref)[task], signal.SIGSTOP)
    return fault


def test_a_frozen_ps_is_replaced_and_the_group_trains_on_from_its_checkpoint(local_state_dir, linear_dataset,
                                                                             tmp_path, wait_until):
    # Worker 1 must still train when the ps freezes, however far it got past the chief's checkpoint.
    status = heal(linear_dataset, tmp_path, wait_until, "frozen-ps", freeze("frozen-ps-ps-0"),
                  "frozen-ps-ps-0", steps=3 * STEPS)
    worker = status.task("worker", 1)
    assert worker.restarts == 1 and worker.reason.startswith("group restarted: frozen-ps-ps-0 stuck:"), worker.reason
    # The view lists the ps as replaced, not every task its restart took along.
    assert worker.code == "GroupRestarted" and not any(r.startswith("frozen-ps-worker") for r in status.replacements())


def test_a_frozen_chief_is_replaced_and_training_moves_again(local_state_dir, linear_dataset, tmp_path, wait_until):
    status = heal(linear_dataset, tmp_path, wait_until, "frozen-chief",
                  freeze("frozen-chief-worker-0"), "frozen-chief-worker-0")
    assert status.task("ps", 0).restarts == 0 and status.task("worker", 1).restarts == 0, "only the chief is replaced"


def test_a_ps_cut_off_from_the_network_is_replaced_and_training_moves_again(local_state_dir, linear_dataset,
                                                                           tmp_path, wait_until):
    if not can_cut():
        pytest.skip("cutting a task off needs root, nsenter and tc")

    def cut_ps(backend, ref) -> None:
        port = read_json(local_state_dir / "cut-ps" / "state.json")["processes"]["cut-ps-ps-0"]["port"]
        cut_port(backend.supervisor_pid(ref), port)

    # Restored once the ps was replaced; the namespace, and the cut with it, ends with the group anyway.
    heal(linear_dataset, tmp_path, wait_until, "cut-ps", cut_ps, "cut-ps-ps-0",
         repair=lambda backend, ref: restore_network(backend.supervisor_pid(ref)), workers=1)


def test_a_worker_frozen_while_it_starts_is_replaced(local_state_dir, linear_dataset, tmp_path, wait_until):
    """Before its first answer a task may simply not listen yet; one that also uses no CPU time
    (stopped while importing TensorFlow) is stuck all the same."""
    backend = LocalBackend()
    ref = backend.launch(linear_group("frozen-start", linear_dataset, tmp_path / "run", steps=1500))
    try:
        pid = wait_until(lambda: backend.processes(ref).get("frozen-start-worker-1"), 60, what="worker 1 to start")
        os.kill(pid, signal.SIGSTOP)
        assert not SESSION_READY.search(backend.logs(ref, "worker", 1)), "frozen before it trained"
        outcome, status = wait_for_group(backend, ref, timeout=900)
        assert outcome.succeeded, outcome.reason
        worker = status.task("worker", 1)
        assert worker.restarts == 1 and worker.reason.startswith(
            "stuck while starting: it never answered its health question and used no CPU time for 3 questions"), \
            worker.reason
    finally:
        backend.teardown(ref)
