"""A sole trainer keeps the variables it trains (``variable_placement="auto"``) and pushes them to
their copies on the ps after each call, in real groups (two ps and one worker over gRPC on
loopback): it learns exactly what the same training with the variables on the ps learns, and the
checkpoint, saved from the copies, holds the same names, spread over the ps the same way. Resuming
and warm-starting a sole trainer (the pull after a restore) are tested in test_training.py."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from airflow_tf.cluster import TrainingConfig
from airflow_tf.runtime import models

pytestmark = pytest.mark.slow

STEPS = 203  # not a multiple of the chain: the last calls are single steps, each pushing too


def checkpoint(run_dir) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(models.latest_checkpoint(run_dir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def placed(run) -> dict[str, list[str]]:
    """The checkpoint's variables by the ps that holds them, from the worker's placement line."""
    (line,) = run.lines("worker-0", "airflow-tf variables ")
    return {device: names.split(",") for device, names in
            (pair.split("=") for pair in line.split("airflow-tf variables ")[1].split())}


def test_a_sole_trainer_keeps_its_variables_and_learns_what_it_would_on_the_ps(linear_dataset, train, tmp_path):
    options = dict(ps=2, workers=1, steps=STEPS, steps_per_call=4, learning_rate=0.1,
                   intra_op_threads=1, inter_op_threads=1)
    kept = train("kept-auto", linear_dataset, tmp_path / "kept", **options)
    on_ps = train("kept-ps", linear_dataset, tmp_path / "on-ps", variable_placement="ps", **options)
    for run in (kept, on_ps):
        assert run.succeeded, run.report
    assert "variables=kept (copies on the ps)" in kept.lines("worker-0", "airflow-tf train ")[0]
    assert "variables=on the ps" in on_ps.lines("worker-0", "airflow-tf train ")[0]
    # The copies are spread over both ps (round robin, as the variables would be), under the same names.
    assert placed(kept).keys() == placed(on_ps).keys() == {"/job:ps/task:0", "/job:ps/task:1"}, placed(kept)
    assert sorted(sum(placed(kept).values(), [])) == sorted(sum(placed(on_ps).values(), []))

    ours, theirs = checkpoint(kept.run_dir), checkpoint(on_ps.run_dir)
    assert sorted(ours) == sorted(theirs), sorted(ours)
    assert int(ours["global_step"]) == STEPS
    for name in theirs:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-4, atol=1e-5, err_msg=name)
    # Trained, not the initial values pushed back: the line y = 2x + 10 is found.
    assert abs(float(ours["model/001_bias"].squeeze()) - 10.0) < 2.0, ours["model/001_bias"]


def test_a_sole_trainers_optimizer_state_is_kept_and_pushed_with_its_weights(linear_dataset, train, tmp_path):
    """Adam's moments and step powers live beside the weights; the checkpoint holds what the
    trainer reached, not their initial values. (Adam runs differ in the last digits from run to
    run with the variables on the ps too, so the comparison above uses SGD.)"""
    run = train("kept-adam", linear_dataset, tmp_path / "run", workers=1, steps=STEPS, optimizer="adam",
                learning_rate=0.1)
    assert run.succeeded, run.report
    saved = checkpoint(run.run_dir)
    moments = [name for name in saved if name.endswith(("/Adam", "/Adam_1"))]
    assert len(moments) == 4 and all(np.abs(saved[name]).max() > 0 for name in moments), sorted(saved)
    assert float(saved["beta1_power"]) == pytest.approx(0.9 ** (STEPS + 1), rel=1e-3)
    assert abs(float(saved["model/001_bias"].squeeze()) - 10.0) < 2.0, saved["model/001_bias"]


def test_variable_placement_is_checked_and_named():
    with pytest.raises(ValueError, match=r"variable_placement: 'worker' is not one of auto, ps"):
        TrainingConfig(dataset="/d", run_dir="/r", steps=10, variable_placement="worker")
    assert TrainingConfig(dataset="/d", run_dir="/r", steps=10).to_args().count("--variable-placement") == 1
