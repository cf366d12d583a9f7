"""One scheduled run of the demo DAG on three real nodes (real Airflow, the Kubernetes backend's
defaults) during which the nodes go away under it, one after another, each after a checkpoint:
the ps's node stopped as a lost machine goes, then a worker's that is not the chief, then the
chief's, then a node holding a group pod drained. Each time Kubernetes judges the node lost (or
the drain evicts the pod), the task is replaced on another node, training moves again from the
newest checkpoint, and the DAG's wait says what happened in a user's words; the run ends at its
final step."""

from __future__ import annotations

import os
import re

import pytest

from k8s.plane import wait_for

from .faults import DRAIN, STOP, Faults
from .scheduled import ScheduledRun

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="a kubelet and containerd run as root")]

STEPS = 100_000
"""Enough that the training outlasts the four faults and no more (each step costs the other tests
CPU): the ps's loss stops it for 1.5-2 minutes, a worker's or the chief's leaves the other worker
training alone for as long, a drain costs under a minute."""


def _reason(dag_run: ScheduledRun, recovery) -> re.Match:
    """The wait's task log line that says where the task went: ``ps-0 lost with node node-2,
    replaced on node-3 after 41 s`` (the wait logs its group's status every 10 s)."""
    how = (f"lost with node {re.escape(recovery.node)}" if recovery.fault == STOP
           else rf"evicted from {re.escape(recovery.node)} \(drain\)")
    pattern = re.compile(rf"\b{recovery.task} {how}, replaced on (node-\d+) after (\d+) s")
    return wait_for(lambda: pattern.search(dag_run.task_logs()), 60,
                    f"the wait's log to say {recovery.task} {how}, replaced ... ({recovery.describe()})", interval=2)


@pytest.mark.timeout(3000)  # four node faults and their recoveries on a real Airflow: 15-20 minutes under load,
# and the package plane when this test starts it (3-12 minutes)
def test_a_dag_run_survives_losing_the_ps_a_worker_and_the_chief_with_their_nodes_and_a_drain(nodes_plane, tmp_path):
    directory = nodes_plane[0]
    faults = Faults(directory, Faults.pods_now(directory))
    dag_run = ScheduledRun(tmp_path / "airflow", directory, STEPS)
    try:
        dag_run.trigger()
        wait_for(lambda: faults.running("ps", 0), 300, "the group's ps running", interval=1)
        chief, worker = faults.trainer_roles()
        checkpoint = 500
        recoveries = []
        for fault, task in ((STOP, "ps-0"), (STOP, worker), (STOP, chief), (DRAIN, "ps-0")):
            recovery = faults.fault(fault, task, checkpoint)
            print(f"{recovery.describe()}; training moving again {recovery.marks['moving']:.0f} s after the fault")
            assert recovery.new_node != recovery.node, recovery.describe()
            assert recovery.step < STEPS - 5000, f"the training was at step {recovery.step} of {STEPS}: raise STEPS"
            reason = _reason(dag_run, recovery)
            assert reason.group(1) == recovery.new_node, (reason.group(0), recovery.describe())
            faults.restore(recovery)
            recoveries.append(recovery)
            checkpoint = faults.progress().get("checkpoint_step") or checkpoint
        state = wait_for(dag_run.state, 1200, "the DAG run's end", interval=2)
        logs = dag_run.task_logs()
        assert state == "success", logs[-4000:]
    finally:
        dag_run.stop()
    final = faults.progress()
    # The final checkpoint is at or past the final step (its name is the global step the chief read
    # before saving; the other worker's last step may land after that read).
    saved = int(final["checkpoint"].rsplit("-", 1)[-1])
    assert final["done"] and final["global_step"] >= STEPS and STEPS <= saved <= final["global_step"], final
    assert [r.task for r in recoveries] == ["ps-0", worker, chief, "ps-0"]
