"""Several training steps per session call (``steps_per_call``), in real groups (a ps and a worker
over gRPC on loopback): K chained steps learn what K single steps learn, the target step is
reached exactly, progress counts single steps, and the automatic choice is logged."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from airflow_tf.cluster import TrainingConfig
from airflow_tf.cluster.progress import parse_progress
from airflow_tf.runtime import models

pytestmark = pytest.mark.slow

STEPS = 203  # not a multiple of the chain: the last steps run one per call


def weights(run_dir) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(models.latest_checkpoint(run_dir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map() if name.startswith("model/")}


@pytest.fixture(scope="module")
def one_and_four(linear_dataset, train, tmp_path_factory):
    """The same single-worker training with 1 and with 4 steps per call (same seed, same data order)."""
    runs = {}
    for k in (1, 4):
        runs[k] = train(f"spc-{k}", linear_dataset, tmp_path_factory.mktemp(f"spc{k}") / "run", workers=1,
                        steps=STEPS, steps_per_call=k, intra_op_threads=1, inter_op_threads=1)
    return runs


def test_four_steps_per_call_learn_what_four_single_steps_learn(one_and_four):
    for run in one_and_four.values():
        assert run.succeeded, run.report
    single, chained = weights(one_and_four[1].run_dir), weights(one_and_four[4].run_dir)
    assert single.keys() == chained.keys()
    for name in single:
        np.testing.assert_allclose(chained[name], single[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_chained_steps_stop_exactly_at_the_target_and_report_single_steps(one_and_four):
    run = one_and_four[4]
    assert models.latest_checkpoint(run.run_dir).endswith(f"model.ckpt-{STEPS}")
    assert run.lines("worker-0", f"status=succeeded global_step={STEPS} ")
    last = parse_progress(run.logs["worker-0"])
    assert last["global_step"] == STEPS and last["percent"] == 100.0
    # ProgressReport lines fall between chains too: their steps are the global step after a call.
    steps = [parse_progress(line)["global_step"] for line in run.lines("worker-0", "airflow-tf progress")]
    assert steps == sorted(steps) and steps[0] >= 1


def test_the_automatic_choice_is_logged_with_the_step_time(linear_dataset, train, tmp_path):
    run = train("spc-auto", linear_dataset, tmp_path / "run", workers=1, steps=400)
    assert run.succeeded, run.report
    (chosen,) = run.lines("worker-0", "airflow-tf steps per call:")
    assert "automatic, set steps_per_call to choose" in chosen and " ms;" in chosen
    assert run.lines("worker-0", "status=succeeded global_step=400 ")


def test_steps_per_call_is_checked_and_named():
    with pytest.raises(ValueError, match=r"steps_per_call: sync mode runs one step per call"):
        TrainingConfig(dataset="/d", run_dir="/r", steps=10, sync=True, steps_per_call=4)
    with pytest.raises(ValueError, match=r"steps_per_call: must be between 1 and 1,000"):
        TrainingConfig(dataset="/d", run_dir="/r", steps=10, steps_per_call=0)
    assert TrainingConfig(dataset="/d", run_dir="/r", steps=10, steps_per_call="8").steps_per_call == 8
    assert "--steps-per-call" not in TrainingConfig(dataset="/d", run_dir="/r", steps=10).to_args(), \
        "unset means automatic"


@pytest.mark.parametrize("on_nan", ["fail", "stop"])
def test_a_loss_that_becomes_inf_inside_a_chain_is_caught_at_its_own_global_step(on_nan, capsys):
    """In-process (no group needed): 4 steps per call, the third step's loss is inf."""
    from airflow_tf.runtime.errors import NonFiniteError
    from airflow_tf.runtime.loop import NanPolicy
    from airflow_tf.runtime.steps import StepsPerCall, TrainingHook, chain_steps

    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()

        def one_step():  # as in training, the update depends on the loss (through its gradients)
            loss = 1.0 / (2.0 - tf.cast(global_step.read_value(), tf.float32))  # inf at the step from 2 to 3
            with tf.control_dependencies([loss]):
                return loss, global_step.assign_add(1).op

        calls = StepsPerCall(chain_steps(1, one_step, global_step), chain_steps(4, one_step, global_step),
                             target=100, trainers=1, fixed=4)
        policy = NanPolicy(on_nan)
        hook = TrainingHook(global_step, 100, calls, [policy])
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            if on_nan == "fail":
                with pytest.raises(NonFiniteError, match="loss became inf at global step 3"):
                    session.run(hook.next_op())
                return
            while not session.should_stop():
                session.run(hook.next_op())
    assert policy.stopped == "loss became inf at global step 3"
    assert hook.last_step == 4, "the call ran its 4 steps, then training stopped"
