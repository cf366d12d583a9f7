"""Faults of a training run, each through a real group (ps and workers over gRPC, launched by the
local backend): a diverging run, a NaN loss with on_nan=stop, a truncated newest checkpoint, a
stuck step, and a TensorFlow error reported by its cause rather than a traceback frame."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from processes import task_pid
from runtime.conftest import train_group

from airflow_tf.runtime import models
from airflow_tf.runtime.errors import failure_reason

pytestmark = pytest.mark.slow

DIVERGING = dict(learning_rate=1e3, steps=3000)
"""The seed's linear regression with a learning rate a million times too big: the loss
overflows within a few steps (a learning rate of nan/inf itself is refused by the options)."""
NOT_ASKED = {"health_timeout": None}
"""The trainers' own stuck-step bound is under test: the supervisor must not replace the frozen ps first."""
NON_FINITE = re.compile(r"(loss|variables) became (NaN|inf)[^ ]* at global step (\d+)")


def checkpoints(run_dir: Path) -> list[str]:
    """Every checkpoint prefix in the run directory, oldest first."""
    prefixes = [str(p)[: -len(".index")] for p in run_dir.glob("model.ckpt-*.index")]
    return sorted(prefixes, key=lambda p: int(p.rsplit("-", 1)[1]))


def step_of(prefix: str) -> int:
    return int(prefix.rsplit("-", 1)[1])


def assert_every_checkpoint_finite(run_dir: Path) -> None:
    assert checkpoints(run_dir), f"no checkpoint in {run_dir}"
    for prefix in checkpoints(run_dir):
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            value = reader.get_tensor(name)
            if np.issubdtype(np.asarray(value).dtype, np.floating):
                assert np.isfinite(value).all(), f"{prefix} holds a non-finite {name}: {value}"


MODES = ["between_graph", "coordinator"]
"""Both training modes apply the NaN policy through the loop's core: the same lines, the same exits."""


def trainer(mode: str) -> str:
    """The task that trains and reports: the first worker, or the coordinator's chief."""
    return "chief-0" if mode == "coordinator" else "worker-0"


@pytest.mark.parametrize("mode", MODES)
def test_a_diverging_run_fails_naming_the_step_and_never_checkpoints_nan(linear_dataset, tmp_path, mode):
    run = train_group(f"fault-diverge-{mode[:5]}", linear_dataset, tmp_path / "run", tmp_path / "state", workers=1,
                      mode=mode, **DIVERGING)
    assert not run.succeeded, "a run whose loss became NaN reported success"
    reason = run.report.splitlines()[0]
    assert NON_FINITE.search(reason), reason
    assert 'File "' not in reason and "Traceback" not in reason
    (exit_line,) = run.lines(trainer(mode), "airflow-tf task exit")
    assert "status=failed" in exit_line and NON_FINITE.search(exit_line)
    assert run.logs[trainer(mode)].rstrip().splitlines()[-1] == exit_line, "the cause is the log's last line"
    assert_every_checkpoint_finite(run.run_dir)
    assert step_of(models.latest_checkpoint(run.run_dir)) < DIVERGING["steps"]


@pytest.mark.parametrize("mode", MODES)
def test_on_nan_stop_ends_the_run_at_once_and_keeps_the_last_finite_checkpoint(linear_dataset, tmp_path, mode):
    run = train_group(f"fault-nanstop-{mode[:5]}", linear_dataset, tmp_path / "run", tmp_path / "state", workers=2,
                      on_nan="stop", mode=mode, **DIVERGING)
    assert run.succeeded, run.report
    (stopping,) = run.lines(trainer(mode), "stopping (on_nan=stop)")
    assert re.search(r"airflow-tf loss became (NaN|inf) at global step \d+: stopping \(on_nan=stop\); "
                     r"the last finite checkpoint is kept$", stopping), stopping
    nan_step = int(NON_FINITE.search(stopping).group(3))
    assert nan_step < DIVERGING["steps"]
    (exit_line,) = run.lines(trainer(mode), "airflow-tf task exit")
    assert "status=stopped" in exit_line and "on_nan=stop" in exit_line
    assert_every_checkpoint_finite(run.run_dir)
    latest = models.latest_checkpoint(run.run_dir)
    assert step_of(latest) <= nan_step
    progress = json.loads((run.run_dir / "progress.json").read_text())
    assert progress["done"] and progress["checkpoint"] == latest


def test_a_truncated_newest_checkpoint_is_skipped_and_the_run_resumes_from_the_one_before(linear_dataset,
                                                                                          tmp_path):
    run_dir, state_dir = tmp_path / "run", tmp_path / "state"
    first = train_group("fault-ckpt-a", linear_dataset, run_dir, state_dir, workers=1, steps=400,
                        checkpoint_every_secs=0.2)
    assert first.succeeded, first.report
    *_, intact, newest = checkpoints(run_dir)
    (data_file,) = Path(run_dir).glob(Path(newest).name + ".data-*")
    data_file.write_bytes(data_file.read_bytes()[: data_file.stat().st_size // 2])  # a disk that filled up

    second = train_group("fault-ckpt-b", linear_dataset, run_dir, state_dir, workers=1, steps=600)
    assert second.succeeded, second.report
    chief = second.logs["worker-0"]
    assert f"checkpoint {newest} is unreadable" in chief and "skipped" in chief
    assert f"resuming from the newest intact checkpoint {intact}" in chief
    assert f"session ready global_step={step_of(intact)} " in chief
    assert Path(str(data_file) + ".corrupt").exists(), "the unreadable checkpoint is kept, set aside"
    assert step_of(models.latest_checkpoint(run_dir)) >= 600
    assert_every_checkpoint_finite(run_dir)


def test_a_step_stuck_on_a_stopped_ps_times_out_and_the_session_recovers(linear_dataset, tmp_path):
    """The ps is SIGSTOPped for longer than operation_timeout_secs mid-run, then continued."""
    run_dir, state_dir = tmp_path / "run", tmp_path / "state"
    stopped: list[int] = []
    lock = threading.Lock()

    def stop_ps_once(status) -> None:
        try:
            step = json.loads((run_dir / "progress.json").read_text())["global_step"]
        except (OSError, ValueError):
            return
        with lock:
            # As soon as the chief reports: at full speed the run has only seconds left after this,
            # and a busy machine may see its progress late.
            if stopped or step < 50:
                return
            ps = task_pid(state_dir, "fault-stuck-ps-0")
            os.kill(ps, signal.SIGSTOP)
            stopped.append(ps)
            threading.Timer(12.0, os.kill, (ps, signal.SIGCONT)).start()

    try:
        run = train_group("fault-stuck", linear_dataset, run_dir, state_dir, workers=2, steps=3000,
                          operation_timeout_secs=3.0, checkpoint_every_secs=0.5, on_status=stop_ps_once,
                          group_options=NOT_ASKED)
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert stopped, "the run ended before the ps could be stopped"
    assert run.succeeded, run.report
    assert run.lines("worker-0", "(recreated: a step timed out or a ps was lost)"), \
        "the chief's stuck step neither timed out nor recovered"
    assert step_of(models.latest_checkpoint(run_dir)) >= 3000


def test_a_stuck_step_is_cut_at_the_bound_from_the_runs_own_step_times_and_the_recovery_shows(linear_dataset,
                                                                                              tmp_path):
    """With the default 300 s operation timeout, a step (or checkpoint save) stuck on a SIGSTOPped
    ps is cancelled after the step bound (the 30 s floor: this run's steps take milliseconds), not 300 s; the
    chief's log names the step and the cause, and the progress (sensor's log) counts it."""
    from datetime import datetime

    from airflow_tf.cluster.progress import describe, parse_progress
    from airflow_tf.runtime.step_bound import STALL_FLOOR_SECS

    run_dir, state_dir = tmp_path / "run", tmp_path / "state"
    stopped: list[tuple[int, float]] = []
    lock = threading.Lock()

    def stop_ps_once(status) -> None:
        try:
            step = json.loads((run_dir / "progress.json").read_text())["global_step"]
        except (OSError, ValueError):
            return
        with lock:
            if stopped or step < 300:
                return
            ps = task_pid(state_dir, "fault-bound-ps-0")
            os.kill(ps, signal.SIGSTOP)
            stopped.append((ps, time.time()))
            threading.Timer(STALL_FLOOR_SECS + 10, os.kill, (ps, signal.SIGCONT)).start()

    try:
        run = train_group("fault-bound", linear_dataset, run_dir, state_dir, workers=2, steps=2000,
                          checkpoint_every_secs=2.0, on_status=stop_ps_once, group_options=NOT_ASKED)
    finally:
        for pid, _ in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert stopped, "the run ended before the ps could be stopped"
    assert run.config.operation_timeout_secs == 300, "the default cap"
    assert run.succeeded, run.report

    (stuck,) = run.lines("worker-0", "airflow-tf step stuck")
    assert f"past its bound of {STALL_FLOOR_SECS:g} s (max of the {STALL_FLOOR_SECS:g} s floor" in stuck, stuck
    assert re.search(r"; waiting on ps:0 \(127\.0\.0\.1:\d+ no answer within 5 s\)$", stuck), "names the frozen ps"
    noticed = datetime.fromisoformat(stuck.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()
    after_stop = noticed - stopped[0][1]
    # Cut at the bound (plus the watcher's 1 s tick and a loaded machine's slack), far from 300 s.
    assert STALL_FLOOR_SECS - 1 <= after_stop <= STALL_FLOOR_SECS + 15, f"noticed {after_stop:.1f} s after the stop"
    (recovered,) = run.lines("worker-0", "airflow-tf stalled step recovered")
    assert re.search(r"the (step|checkpoint save) after global step \d+: it ran past its bound of 30 s and TensorFlow "
                     r"cancelled it; "
                     r"the session was recreated at global step \d+", recovered), recovered

    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["done"] and len(progress["stalls"]) == 1 and progress["stalls"][0]["bound_secs"] == 30
    last = parse_progress(run.logs["worker-0"])
    assert last["stalls"] == 1 and "1 stuck step(s) recovered" in describe(last)
    assert step_of(models.latest_checkpoint(run_dir)) >= 2000


def test_a_tensorflow_error_is_reported_by_its_cause(linear_dataset, tmp_path):
    """A train shard corrupted after prepare: the read fails inside a step."""
    dataset = tmp_path / "dataset"
    shutil.copytree(linear_dataset, dataset)
    for shard in sorted((dataset / "train").glob("part-*")):
        data = bytearray(shard.read_bytes())
        data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64
        shard.write_bytes(bytes(data))
    run = train_group("fault-tf-error", str(dataset), tmp_path / "run", tmp_path / "state", workers=1, steps=2000)
    assert not run.succeeded
    reason = run.report.splitlines()[0]
    assert "DataLossError" in reason or "corrupted record" in reason, reason
    assert 'File "' not in reason and "line " not in reason.split("last log line:")[-1], reason


def test_the_reason_of_a_graph_error_is_its_message_without_stack_frames():
    with tf.Graph().as_default():
        a = tf.compat.v1.placeholder(tf.float32, [None])
        b = tf.compat.v1.placeholder(tf.float32, [None, 5])
        with tf.compat.v1.Session() as session, pytest.raises(tf.errors.InvalidArgumentError) as info:
            session.run(a - b, {a: np.ones(64), b: np.ones((64, 5))})
    assert "from_node_def" in str(info.value), "TensorFlow's message changed; this test needs a new example"
    assert failure_reason(info.value) == "InvalidArgumentError: Incompatible shapes: [64] vs. [64,5] (node sub)"
