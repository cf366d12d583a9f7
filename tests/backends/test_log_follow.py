"""Following a task's log as it is written (the wait's ``follow_logs``) and keeping its end in the
run directory (``[airflow_tf] kept_log_bytes``), on a local group's real log files."""

from __future__ import annotations

import pytest

from airflow_tf.backends import GroupRef
from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.follow import LogFollower, check_follow_logs
from airflow_tf.backends.kubernetes.backend import _log_time
from airflow_tf.backends.local.files import GroupDir, read_since
from airflow_tf.backends.wait import kept_log
from airflow_tf.cluster import GroupStatus, Phase, TaskStatus
from airflow_tf.storage import kept_log_bytes


def _status(*tasks: tuple[str, int]) -> GroupStatus:
    return GroupStatus(name="g", tasks=[TaskStatus(role, index, f"g-{role}-{index}", Phase.RUNNING)
                                        for role, index in tasks])


@pytest.fixture
def group(tmp_path):
    backend = LocalBackend(state_dir=tmp_path / "groups")
    logs = GroupDir(backend.state_dir / "g").logs
    logs.mkdir(parents=True)
    return backend, GroupRef(backend="local", name="g", options={"state_dir": str(backend.state_dir)}), logs


def test_each_read_returns_the_whole_lines_written_since_the_last_and_nothing_twice(group):
    backend, ref, logs = group
    follower = LogFollower(backend, ref, "chief")
    status = _status(("ps", 0), ("worker", 0), ("worker", 1))
    assert follower.read(status) == ("g-worker-0", [])  # no log yet
    with open(logs / "worker-0.log", "a") as log:
        log.write("started\nstep 1\nhalf a li")
        log.flush()
        assert follower.read(status) == ("g-worker-0", ["started", "step 1"])
        assert follower.read(status) == ("g-worker-0", [])
        log.write("ne\nstep 2\n")
    # The cursor is JSON: a trigger given the sensor's goes on where the sensor stopped.
    resumed = LogFollower(backend, ref, "chief", follower.state())
    assert resumed.read(status) == ("g-worker-0", ["half a line", "step 2"])


def test_the_chief_is_the_chief_role_when_there_is_one_and_another_task_is_named(group):
    backend, ref, logs = group
    (logs / "chief-0.log").write_text("the chief\n")
    (logs / "worker-1.log").write_text("worker one\n")
    assert LogFollower(backend, ref, "chief").read(_status(("chief", 0), ("worker", 0))) == ("g-chief-0", ["the chief"])
    assert LogFollower(backend, ref, "worker-1").read(_status(("worker", 0), ("worker", 1))) == \
        ("g-worker-1", ["worker one"])
    with pytest.raises(ValueError, match=r"follow_logs='worker-7': group g has no such task; its tasks are "
                                         r"worker-0, worker-1"):
        LogFollower(backend, ref, "worker-7").read(_status(("worker", 0), ("worker", 1)))


@pytest.mark.parametrize("value", ["chef", "worker", "worker-01", "worker--1", "../x-0", 3, True])
def test_a_follow_logs_that_names_no_task_is_refused_naming_the_argument(value):
    with pytest.raises(ValueError, match=r"^follow_logs: expected 'chief' \(the lead trainer\), a task as "
                                         r"<role>-<index>"):
        check_follow_logs(value)
    assert check_follow_logs(None) is None and check_follow_logs("ps-0") == "ps-0"


def test_a_replaced_log_is_read_from_its_start_and_a_long_line_comes_in_pieces(tmp_path):
    path = tmp_path / "worker-0.log"
    path.write_text("first attempt\n")
    text, cursor = read_since(path, None, 100)
    assert text == "first attempt\n"
    path.unlink()
    path.write_text("new\n")  # another file (a new attempt's), shorter
    assert read_since(path, cursor, 100)[0] == "new\n"
    path.write_text("x" * 250 + "\n")
    text, cursor = read_since(path, None, 100)
    assert text == "x" * 100
    assert read_since(path, cursor, 100)[0] == "x" * 100


def test_a_kept_log_is_its_end_in_whole_lines_within_the_bound_and_says_what_was_left_out():
    data = b"".join(b"line %04d\n" % i for i in range(1000))  # 10000 bytes
    assert kept_log(data, 20000) == data and kept_log(data, None) == data
    kept = kept_log(data, 1000)
    assert len(kept) <= 1000
    first, *rest = kept.decode().splitlines()
    assert rest[-1] == "line 0999" and all(line.startswith("line ") and len(line) == 9 for line in rest)
    left_out = 10000 - sum(len(line) + 1 for line in rest)
    assert first == (f"[airflow-tf: the first {left_out} bytes of this log are left out: "
                     "[airflow_tf] kept_log_bytes is 1000]")
    # The end of a file read from an offset: the bytes before it count as left out.
    assert kept_log(data[-500:], 1000, 9500).decode().splitlines()[0].startswith(
        f"[airflow-tf: the first {9500 + 10} bytes")


def test_the_bound_comes_from_the_setting_and_a_bad_one_is_refused_naming_it(monkeypatch):
    monkeypatch.delenv("AIRFLOW__AIRFLOW_TF__KEPT_LOG_BYTES", raising=False)
    monkeypatch.delenv("AIRFLOW_TF_KEPT_LOG_BYTES", raising=False)
    assert kept_log_bytes() == 10 * 1024 * 1024
    monkeypatch.setenv("AIRFLOW_TF_KEPT_LOG_BYTES", "4096")
    assert kept_log_bytes() == 4096
    for bad in ("0", "-1", "10MiB"):
        monkeypatch.setenv("AIRFLOW_TF_KEPT_LOG_BYTES", bad)
        with pytest.raises(ValueError, match=r"^\[airflow_tf\] kept_log_bytes / \$AIRFLOW_TF_KEPT_LOG_BYTES: "
                                             r"expected a positive whole number of bytes"):
            kept_log_bytes()


def test_kubelet_log_timestamps_order_lines_to_the_nanosecond():
    assert _log_time("2026-11-29T06:40:01.123456789Z") - _log_time("2026-11-29T06:40:01.12345678Z") == 9
    assert _log_time("2026-11-29T06:40:01Z") == 1795934401 * 10**9
    for bad in ("2026-11-29T06:40:01.1x2Z", "2026-11-29T06:40:01", "step"):
        with pytest.raises(ValueError):
            _log_time(bad)
