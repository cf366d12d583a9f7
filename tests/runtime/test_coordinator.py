"""Coordinator mode: the chief drives real ps and worker servers over gRPC (TF2
``ParameterServerStrategy``), trains the seed's y = 2x + 10 into checkpoints that evaluation reads,
and survives a worker or a ps being killed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
from serving_check import export_and_serve_elsewhere

from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.wait import wait_for_group
from airflow_tf.cluster import GroupSpec, SpecError, TrainingConfig
from airflow_tf.cluster.progress import parse_progress

pytestmark = pytest.mark.slow

SESSION_READY = re.compile(r"airflow-tf session ready global_step=(\d+)")
SUMMARY_EVERY_STEPS = 20


def coordinator_group(name, dataset, run_dir, steps, **training) -> GroupSpec:
    config = TrainingConfig(dataset=dataset, run_dir=str(run_dir), mode="coordinator", steps=steps, batch_size=32,
                            learning_rate=0.05, checkpoint_every_secs=0.5, log_every_secs=0.5, **training)
    return GroupSpec.for_training(name, config, ps=1, workers=2, active_deadline_seconds=600)


def checkpoint_step(run_dir) -> int:
    from airflow_tf.runtime.models import latest_checkpoint
    from airflow_tf.serving.evaluate import checkpoint_step as step_of

    latest = latest_checkpoint(run_dir) if os.path.isdir(run_dir) else None
    return (step_of(latest) or 0) if latest else 0


def test_run_mode_coordinator_trains_the_seed_line_and_the_checkpoint_evaluates(local_state_dir, linear_dataset,
                                                                                 tmp_path):
    from airflow_tf.serving.evaluate import evaluate_checkpoint

    run_dir = tmp_path / "run"
    cli = subprocess.run(
        [sys.executable, "-m", "airflow_tf.cli", "run", "--mode", "coordinator", "--dataset", linear_dataset,
         "--ps", "1", "--workers", "2", "--steps", "400", "--learning-rate", "0.05", "--batch-size", "32",
         "--log-every-secs", "0.5", "--summary-every-steps", str(SUMMARY_EVERY_STEPS), "--run-dir", str(run_dir),
         "--name", "coord-cli"],
        capture_output=True, text=True, timeout=600,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    summary = json.loads(cli.stdout)
    assert summary["succeeded"] and summary["global_step"] >= 400 and summary["checkpoint"]
    assert "chief" in summary["reason"]  # the chief's exit decided; the workers were servers

    (chief_log,) = [path.read_text() for path in (run_dir / "logs").rglob("coord-cli-chief-0.log")]
    progress = parse_progress(chief_log)
    assert progress["global_step"] >= 400 and progress["target_step"] == 400 and progress["examples_per_sec"] > 0
    assert "airflow-tf variables /job:ps/task:0=" in chief_log

    # The curve follows between-graph training's rule (the loop's core draws both): a point at the
    # chief's first report at or after each multiple of summary_every_steps, which here is at most
    # one scheduled function's steps later, and one at the final step.
    from airflow_tf.runtime.coordinator import STEPS_PER_CLOSURE
    from airflow_tf.serving.curves import read_scalars

    loss_steps = [step for step, _ in read_scalars(run_dir)["loss"]]
    assert loss_steps == sorted(set(loss_steps)) and loss_steps[-1] == summary["global_step"], loss_steps
    for multiple in range(SUMMARY_EVERY_STEPS, 401, SUMMARY_EVERY_STEPS):
        assert any(multiple <= step < multiple + STEPS_PER_CLOSURE for step in loss_steps), (multiple, loss_steps)

    config = {"dataset": linear_dataset, "run_dir": str(run_dir), "steps": 400}
    result = evaluate_checkpoint(run_dir, linear_dataset, config, plot=False)
    assert result["global_step"] >= 400
    assert result["metrics"]["mse"] < 1.0, result["metrics"]
    export_and_serve_elsewhere(run_dir, linear_dataset, config, tmp_path / "served")


def test_coordinator_mode_refuses_sync_updates(tmp_path, linear_dataset):
    cli = subprocess.run(
        [sys.executable, "-m", "airflow_tf.cli", "run", "--mode", "coordinator", "--sync", "--dataset",
         linear_dataset, "--steps", "10", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120,
    )
    assert cli.returncode != 0
    assert "coordinator mode updates the parameters asynchronously only" in cli.stderr
    assert not (tmp_path / "run").exists()


def test_a_killed_worker_rejoins_and_the_chief_finishes(local_state_dir, linear_dataset, tmp_path, wait_until):
    backend = LocalBackend()
    run_dir = tmp_path / "run"
    ref = backend.launch(coordinator_group("coord-killw", linear_dataset, run_dir, steps=2000))
    try:
        wait_until(lambda: (backend.status(ref).progress or {}).get("global_step", 0) > 0, 300,
                   what="the chief to schedule steps")
        os.kill(backend.processes(ref)["coord-killw-worker-1"], signal.SIGKILL)

        outcome, status = wait_for_group(backend, ref, timeout=420)
        assert outcome.succeeded, outcome.reason
        assert status.task("worker", 1).restarts == 1
        assert status.task("chief", 0).restarts == 0, "the chief carried on through the worker's death"
        assert checkpoint_step(run_dir) >= 2000
    finally:
        backend.teardown(ref)


def test_a_killed_ps_restarts_the_chief_from_the_checkpoint(local_state_dir, linear_dataset, tmp_path, wait_until):
    backend = LocalBackend()
    run_dir = tmp_path / "run"
    ref = backend.launch(coordinator_group("coord-killps", linear_dataset, run_dir, steps=2500))
    try:
        saved = wait_until(lambda: checkpoint_step(run_dir), 300, what="a first checkpoint")
        os.kill(backend.processes(ref)["coord-killps-ps-0"], signal.SIGKILL)

        outcome, status = wait_for_group(backend, ref, timeout=420)
        assert outcome.succeeded, outcome.reason
        starts = [int(s) for s in SESSION_READY.findall(backend.logs(ref, "chief", 0))]
        assert len(starts) >= 2 and starts[-1] >= saved, f"the chief did not restore the checkpoint: {starts}"
        assert checkpoint_step(run_dir) >= 2500
    finally:
        backend.teardown(ref)


def test_a_coordinator_group_gets_a_chief_whose_exit_decides(linear_dataset, tmp_path):
    config = TrainingConfig(dataset=linear_dataset, run_dir=str(tmp_path / "run"), steps=10, mode="coordinator")
    spec = GroupSpec.for_training("coord-spec", config, ps=1, workers=2)
    assert spec.replicas("chief") == 1 and spec.success_policy == "ChiefOrWorker0"
    with pytest.raises(SpecError, match="coordinator mode needs one chief"):
        GroupSpec(name="coord-spec", training=config, roles=spec.roles, success_policy="AllWorkers")


def test_coordinator_mode_refuses_towers_it_cannot_build(linear_dataset, tmp_path):
    from airflow_tf.data import load_schema
    from airflow_tf.runtime import coordinator
    from airflow_tf.runtime.errors import TaskConfigError
    from airflow_tf.runtime.task import Task

    config = TrainingConfig(dataset=linear_dataset, run_dir=str(tmp_path / "run"), steps=10, mode="coordinator",
                            devices_per_worker=2)
    task = Task("chief", 0, {"chief": ["localhost:1"], "ps": ["localhost:2"], "worker": ["localhost:3"]})
    with pytest.raises(TaskConfigError, match="devices_per_worker=2: in coordinator mode"):
        coordinator.train_with_coordinator(config, task, load_schema(linear_dataset))
    assert not (tmp_path / "run").exists()
