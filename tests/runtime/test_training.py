"""Real parameter-server groups (ps and worker processes over gRPC on loopback) training the
seed's ``y = 2x + 10``: async, sync, two ps tasks, a resumed run, a warm start, and the trained
checkpoint read back as an eager Keras model."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from datetime import datetime

import numpy as np
import pytest
import tensorflow as tf
from serving_check import export_and_serve_elsewhere

from airflow_tf.cluster.progress import parse_progress
from airflow_tf.data import load_schema
from airflow_tf.runtime import models

pytestmark = pytest.mark.slow

STEPS = 600
SUMMARY_EVERY_STEPS = 20
SESSION_READY = re.compile(r"airflow-tf session ready global_step=(\d+)")


def checkpoint_values(run_dir) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(models.latest_checkpoint(run_dir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def line_and_bias(run_dir) -> tuple[float, float]:
    values = checkpoint_values(run_dir)
    return float(values["model/000_kernel"].squeeze()), float(values["model/001_bias"].squeeze())


def assert_learned_the_line(run) -> None:
    assert run.succeeded, run.report
    w, b = line_and_bias(run.run_dir)
    assert abs(w - 2.0) < 0.1 and abs(b - 10.0) < 0.1, f"learned y = {w:.3f}x + {b:.3f}"


def timestamp(line: str) -> datetime:
    return datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00"))


@pytest.fixture(scope="module")
def async_run(linear_dataset, train, tmp_path_factory):
    return train("rt-async", linear_dataset, tmp_path_factory.mktemp("async") / "run", steps=STEPS,
                 summary_every_steps=SUMMARY_EVERY_STEPS)


def test_async_workers_learn_the_seed_line_and_report_progress(async_run):
    assert_learned_the_line(async_run)
    for worker in ("worker-0", "worker-1"):
        assert async_run.lines(worker, "session ready"), f"{worker} never trained"
        assert async_run.lines(worker, "status=succeeded"), f"{worker} did not exit by itself"

    progress = json.loads((async_run.run_dir / "progress.json").read_text())
    assert progress["done"] and progress["global_step"] >= STEPS and progress["percent"] == 100.0
    assert progress["checkpoint"] == models.latest_checkpoint(async_run.run_dir)
    assert progress["examples_per_sec"] > 0 and progress["loss"] < 0.5
    last_line = parse_progress(async_run.logs["worker-0"])
    assert last_line["global_step"] == progress["global_step"] and last_line["target_step"] == STEPS

    (events,) = async_run.run_dir.glob("events.out.tfevents.*")
    tags = {value.tag for event in tf.compat.v1.train.summary_iterator(str(events)) for value in event.summary.value}
    assert {"loss", "examples_per_sec", "learning_rate"} <= tags, "TensorBoard has no training curves"


def curve(run) -> list[tuple[int, float]]:
    """The loss curve TensorBoard and training_curve.png draw, read as serving reads it."""
    from airflow_tf.serving.curves import read_scalars

    scalars = read_scalars(run.run_dir)
    assert np.allclose([value for _, value in scalars["learning_rate"]], run.config.learning_rate)
    return scalars["loss"]


def test_the_async_training_curve_ends_at_the_final_step(async_run):
    """In async training the other worker's steps are not the chief's to see (a loaded machine can
    give the chief only a few of them), so only the curve's end is fixed: the final global step."""
    loss = curve(async_run)
    loss_steps = [step for step, _ in loss]
    final_step = json.loads((async_run.run_dir / "progress.json").read_text())["global_step"]
    assert loss_steps == sorted(set(loss_steps)) and loss_steps[-1] == final_step, loss_steps
    assert all(np.isfinite(value) for _, value in loss)


def test_two_ps_tasks_each_hold_part_of_the_variables_and_the_curve_has_many_points(linear_dataset, train,
                                                                                     tmp_path):
    """With one worker every step is the chief's: a point at its first step at or after each multiple
    of summary_every_steps (the exact rule is tested in test_session_hooks.py), not just one per
    report every log_every_secs."""
    run = train("rt-two-ps", linear_dataset, tmp_path / "run", ps=2, workers=1, steps=STEPS,
                summary_every_steps=SUMMARY_EVERY_STEPS)
    assert_learned_the_line(run)
    (placement,) = run.lines("worker-0", "airflow-tf variables ")
    held = dict(pair.split("=") for pair in placement.split("airflow-tf variables ")[1].split())
    assert set(held) == {"/job:ps/task:0", "/job:ps/task:1"}, placement
    names = sorted(name for names in held.values() for name in names.split(","))
    assert names == ["global_step", "model/000_kernel", "model/001_bias"]

    loss_steps = [step for step, _ in curve(run)]
    crossed = {step // SUMMARY_EVERY_STEPS for step in loss_steps}
    assert crossed == set(range(min(crossed), STEPS // SUMMARY_EVERY_STEPS + 1)), loss_steps
    assert loss_steps[-1] == STEPS, loss_steps


def test_restored_model_predicts_like_the_training_graph(async_run, linear_dataset):
    schema = load_schema(linear_dataset)
    x = np.array([-1.0, 0.0, 0.5, 3.0], np.float32)
    eager = models.restore_model(async_run.run_dir, async_run.config, schema)({"x": x}).numpy()

    # The same checkpoint through TensorFlow's own graph-mode restore, as the trainers saved it.
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        model = models.build_model(async_run.config, schema)
        predictions = model({"x": tf.constant(x)})
        saver = tf.compat.v1.train.Saver({models.weight_key(i, w): w.value for i, w in enumerate(model.weights)})
        saver.restore(session, models.latest_checkpoint(async_run.run_dir))
        graph = session.run(predictions)

    np.testing.assert_allclose(eager, graph, rtol=1e-6)
    np.testing.assert_allclose(eager[:, 0], 2 * x + 10, atol=0.3)


def test_a_checkpoint_of_another_model_is_refused_naming_the_weight(async_run, linear_dataset, tmp_path,
                                                                     monkeypatch):
    (tmp_path / "wider.py").write_text(
        "import keras\n"
        "def model(schema, units):\n"
        "    x = keras.Input(shape=(), name='x')\n"
        "    hidden = keras.layers.Dense(units)(keras.ops.expand_dims(x, -1))\n"
        "    return keras.Model({'x': x}, keras.layers.Dense(1)(hidden))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    wider = dataclasses.replace(async_run.config, model="wider:model", model_kwargs={"units": 4})
    with pytest.raises(models.ModelError, match=r"'model/000_kernel' .* has shape \(1, 1\), the model expects \(1, 4\)"):
        models.restore_model(async_run.run_dir, wider, load_schema(linear_dataset))


def test_sync_workers_learn_and_neither_start_nor_exit_idles(linear_dataset, train, tmp_path):
    run = train("rt-sync", linear_dataset, tmp_path / "run", steps=400, sync=True)
    assert_learned_the_line(run)
    (train_line,) = run.lines("worker-0", "airflow-tf train ")
    assert "mode=sync replicas_to_aggregate=2" in train_line

    # TensorFlow's defaults idle here: a worker polls for the chief's initialisation every 30 s,
    # and the chief waits 120 s for its sync queue runner at exit (the margins allow for a loaded machine).
    chief_ready = timestamp(run.lines("worker-0", "session ready")[0])
    worker_built = timestamp(run.lines("worker-1", "airflow-tf train ")[0])
    worker_ready = timestamp(run.lines("worker-1", "session ready")[0])
    assert (worker_ready - max(chief_ready, worker_built)).total_seconds() < 20
    last_step = timestamp(run.lines("worker-0", "airflow-tf progress")[-1])
    exit_line = timestamp(run.lines("worker-0", "airflow-tf task exit")[0])
    assert (exit_line - last_step).total_seconds() < 30


def test_sync_aggregating_fewer_gradients_than_workers_finishes_and_learns(linear_dataset, train, tmp_path):
    # Each step takes the first gradient that arrives, so a slow worker stalls no one; the spare
    # tokens must not leave a worker waiting at the end.
    run = train("rt-sync-one", linear_dataset, tmp_path / "run", steps=400, sync=True, replicas_to_aggregate=1)
    assert_learned_the_line(run)
    assert "mode=sync replicas_to_aggregate=1" in run.lines("worker-1", "airflow-tf train ")[0]
    for worker in ("worker-0", "worker-1"):
        assert run.lines(worker, "status=succeeded"), f"{worker} did not exit by itself"


def test_a_chief_task_is_the_chief_and_the_others_exit_as_their_roles_say(linear_dataset, train, tmp_path):
    run = train("rt-chief", linear_dataset, tmp_path / "run", workers=1, chief=1, evaluator=1, steps=400,
                sync=True)
    assert_learned_the_line(run)
    (chief,) = run.lines("chief-0", "airflow-tf train ")
    (worker,) = run.lines("worker-0", "airflow-tf train ")
    assert "chief=True" in chief and "shard=0/2" in chief
    assert "chief=False" in worker and "shard=1/2" in worker
    assert not run.lines("worker-0", "airflow-tf progress"), "only the chief reports progress"
    assert run.lines("evaluator-0", "nothing to do here")
    # the ps never finishes; the teardown stops it, and it says so
    assert run.lines("ps-0", "airflow-tf task exit role=ps index=0 status=stopped signal=SIGTERM")


def test_a_new_run_on_the_same_run_dir_continues_from_its_checkpoint(async_run, linear_dataset, train, tmp_path):
    run_dir = tmp_path / "moved-run"
    shutil.copytree(async_run.run_dir, run_dir)  # checkpoints name their files relative to the run dir
    # In async training the other worker may step while the chief saves, so the global_step
    # stored in a checkpoint can be past the step in its file name: each is checked as such.
    newest = str(models.latest_checkpoint(run_dir))
    saved_step = int(checkpoint_values(run_dir)["global_step"])

    run = train("rt-resume", linear_dataset, run_dir, workers=1, steps=saved_step + 100)
    assert_learned_the_line(run)
    (train_line,) = run.lines("worker-0", "airflow-tf train ")
    assert re.search(rf"start=restoring {re.escape(newest)}(\s|$)", train_line), (newest, train_line)
    assert [int(s) for s in SESSION_READY.findall(run.logs["worker-0"])] == [saved_step]
    assert int(checkpoint_values(run_dir)["global_step"]) >= saved_step + 100


def test_a_run_dir_written_with_other_options_is_refused_not_overwritten(async_run, linear_dataset, train, tmp_path):
    run_dir = tmp_path / "adam-run"
    shutil.copytree(async_run.run_dir, run_dir)
    before = models.latest_checkpoint(run_dir)

    run = train("rt-other-opts", linear_dataset, run_dir, workers=1, steps=STEPS + 100, optimizer="adam")
    assert not run.succeeded
    assert "exit code 2" in run.report, "a refusal is not retried"
    assert "cannot restore" in run.report and "train into a new run_dir, or use that run's options" in run.report
    assert models.latest_checkpoint(run_dir) == before


def test_warm_start_takes_the_trained_weights_but_counts_steps_from_zero(async_run, linear_dataset, train,
                                                                          tmp_path):
    run = train("rt-warm", linear_dataset, tmp_path / "run", workers=1, steps=20,
                      learning_rate=0.001, warm_start_from=str(async_run.run_dir))
    # 20 steps at this learning rate move a fresh model (bias 0) by well under 1; only the
    # trained weights put the line in place.
    assert_learned_the_line(run)
    assert [int(s) for s in SESSION_READY.findall(run.logs["worker-0"])] == [0]
    assert 20 <= int(checkpoint_values(run.run_dir)["global_step"]) <= 21
    first = parse_progress(run.lines("worker-0", "airflow-tf progress")[0])
    assert first["loss"] < 0.5, "the first step did not start from the trained weights"
    export_and_serve_elsewhere(run.run_dir, linear_dataset, run.config, tmp_path / "served")


def test_a_worker_whose_streamed_share_holds_no_record_fails_the_run_naming_it(train, tmp_path):
    """One record, two workers: the second worker's every-other-record share is empty. Its input
    ends at once, which TensorFlow's session would take as training done; the run fails instead."""
    from airflow_tf.data import prepare_dataset

    ids = np.arange(1, dtype=np.float32)
    np.savez(tmp_path / "one.npz", x=ids, label=ids)
    uri = prepare_dataset(tmp_path / "one.npz", tmp_path / "out", "one", label="label", eval_fraction=0,
                          shards=1)["dataset_uri"]
    run = train("rt-empty-share", uri, tmp_path / "run", steps=50, in_memory_input_bytes=0)
    assert not run.succeeded
    (refused,) = run.lines("worker-1", "status=refused")
    assert "gave worker 1 (share 2 of 2) no record: prepare more rows" in refused, refused
    assert "worker-1" in run.report and "no record" in run.report, run.report
