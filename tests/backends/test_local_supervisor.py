"""The local backend's supervisor mechanics, with tiny Python programs as tasks (real
processes, no TensorFlow, so each test takes about a second). Deadlines are generous and
waited for, never asserted as short durations: the suite shares two cores with other work."""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from airflow_tf.backends import GroupRef, backend_for
from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.local.files import STATE_DIR_ENV, write_group_file
from airflow_tf.backends.local.processes import STOP_GRACE, is_running, process_start_time, stop_processes
from airflow_tf.backends.wait import failure_report, wait_for_group
from airflow_tf.cluster import GroupSpec, OutcomeCode, Phase, RoleSpec, SpecError, TrainingConfig
from airflow_tf.data import DatasetNotReadyError
from airflow_tf.files import read_json


def alive(pid: int) -> bool:
    # Zombies do not count: this machine's init does not reap orphans, other systems' do.
    return process_start_time(pid) is not None


PROMPT = STOP_GRACE + 8.0
"""Seconds within which a stop is "prompt" on a loaded machine: SIGTERM, then SIGKILL after
STOP_GRACE, well before the teardown's own 15 s limit or a task's 600 s sleep."""
SETTLE = 20.0
"""Generous deadline for something that happens at once on an idle machine."""


def program(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


SERVE_FOREVER = program("import time\ntime.sleep(600)")
PRINT_TF_CONFIG = program("import os\nprint('TF_CONFIG=' + os.environ['TF_CONFIG'])\nprint('COLOR=' + os.environ['COLOR'])")


def group(name: str, worker: list[str], ps: list[str] = SERVE_FOREVER, workers: int = 2, **options) -> GroupSpec:
    worker_options = {k[7:]: options.pop(k) for k in list(options) if k.startswith("worker_")}
    return GroupSpec(name=name, roles={
        "ps": RoleSpec(replicas=1, restart_policy="OnFailure", command=ps),
        "worker": RoleSpec(replicas=workers, command=worker, **worker_options),
    }, **options)


def phase(backend, ref, name):
    task = next((t for t in backend.status(ref).tasks if t.name == name), None)
    return task.phase if task else None


def test_a_stop_returns_only_once_a_killed_process_is_gone():
    """A teardown that returns while a SIGKILLed ps is still unmapping its tables would let the
    next run (or a check for leftovers) see it alive: a process that ignores SIGTERM and holds
    1 GiB is killed, and gone when the stop returns."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "held = b'x' * 2**30\nprint('ready', flush=True)\ntime.sleep(600)"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        target = (holder.pid, process_start_time(holder.pid))
        stop_processes([target], grace=0.2)
        assert not is_running(*target), "stop_processes returned while the killed process was still running"
        assert holder.wait(timeout=5) == -signal.SIGKILL
    finally:
        holder.kill()
        holder.wait()


def test_tasks_see_their_tf_config_and_the_ps_waits_for_teardown(local_state_dir, group_processes, wait_until):
    backend = LocalBackend()
    ps = program("import time\nprint('serving', flush=True)\ntime.sleep(600)")
    ref = backend.launch(group("cfg", PRINT_TF_CONFIG, ps=ps, worker_env={"COLOR": "blue"}))
    assert ref.options == {"state_dir": str(local_state_dir)}

    outcome, status = wait_for_group(backend, ref, timeout=30)
    assert outcome.succeeded, outcome.reason
    configs = [json.loads(backend.logs(ref, "worker", i).split("TF_CONFIG=")[1].splitlines()[0]) for i in (0, 1)]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    cluster = configs[0]["cluster"]
    assert configs[1]["cluster"] == cluster and set(cluster) == {"ps", "worker"}
    addresses = cluster["ps"] + cluster["worker"]
    assert all(a.startswith("127.0.0.1:") for a in addresses) and len(set(addresses)) == 3
    assert "COLOR=blue" in backend.logs(ref, "worker", 1)

    # Parameter servers never exit by themselves: the ps is still serving.
    ps_pid = backend.processes(ref)["cfg-ps-0"]
    assert status.task("ps", 0).phase is Phase.RUNNING
    started = time.monotonic()
    assert backend.teardown(ref, ["ps"]) == ["cfg-ps-0"]
    assert time.monotonic() - started < PROMPT
    assert not alive(ps_pid)
    # The finished group stays readable (status, logs) until it is torn down as a whole.
    after = backend.status(ref)
    assert [t.name for t in after.tasks] == ["cfg-worker-0", "cfg-worker-1"] and after.exists
    assert backend.logs(ref, "ps", 0, tail_lines=5) == "serving\n"
    wait_until(lambda: not group_processes(local_state_dir), SETTLE, what="the supervisor to exit")

    assert sorted(backend.teardown(ref)) == ["cfg-worker-0", "cfg-worker-1"]
    assert backend.status(ref).exists is False
    assert backend.teardown(ref) == [], "a second teardown has nothing to delete"
    assert backend.find("cfg") is None and os.listdir(local_state_dir) == []


def test_launch_is_idempotent_and_other_processes_reconnect(local_state_dir, group_processes, wait_until):
    backend = LocalBackend()
    ref = backend.launch(group("same", SERVE_FOREVER))
    wait_until(lambda: len(backend.processes(ref)) == 3, what="3 tasks")
    running = sorted(group_processes(local_state_dir))

    again = LocalBackend().launch(group("same", SERVE_FOREVER))
    assert again == ref and sorted(group_processes(local_state_dir)) == running, "a second launch starts nothing"

    # Another process (a sensor, a teardown task) finds the group from the XCom dict alone.
    probe = subprocess.run(
        [sys.executable, "-c",
         "import json, sys\nfrom airflow_tf.backends import backend_for, GroupRef\n"
         "ref = GroupRef.from_dict(json.loads(sys.argv[1]))\n"
         "print(json.dumps(backend_for(ref).status(ref).counts()))", json.dumps(ref.to_dict())],
        capture_output=True, text=True, check=True, env={**os.environ, "AIRFLOW_TF_STATE_DIR": "/nonexistent"},
    )
    assert json.loads(probe.stdout)["worker"]["Running"] == 2
    assert backend_for(ref.to_dict()).find("same") == ref
    backend.teardown(ref)
    assert not group_processes(local_state_dir)


def test_killed_worker_is_restarted_and_finishes(local_state_dir, group_processes, wait_until, tmp_path):
    # First run: waits to be killed. Run after a restart: finds its marker and succeeds.
    marker = tmp_path / "started-once"
    worker = program(f"""
        import os, sys, time
        if os.environ['AIRFLOW_TF_TASK'].endswith('-1') and not os.path.exists({str(marker)!r}):
            open({str(marker)!r}, 'w').close()
            time.sleep(600)
        """)
    backend = LocalBackend()
    ref = backend.launch(group("restart", worker))
    victim = wait_until(lambda: marker.exists() and backend.processes(ref).get("restart-worker-1"), what="worker 1")
    os.kill(victim, signal.SIGKILL)

    outcome, status = wait_for_group(backend, ref, timeout=30)
    assert outcome.succeeded, outcome.reason
    worker1 = status.task("worker", 1)
    assert worker1.restarts == 1 and worker1.phase is Phase.SUCCEEDED
    assert status.task("worker", 0).restarts == 0
    assert "restart 1 of restart-worker-1" in backend.logs(ref, "worker", 1)
    backend.teardown(ref)


def test_program_error_fails_at_once_with_reason_and_last_log_lines(local_state_dir, group_processes, wait_until):
    worker = program("""
        import os
        if os.environ['AIRFLOW_TF_TASK'].endswith('-1'):
            raise ValueError("column 'x' is missing from the dataset")
        """)
    backend = LocalBackend()
    ref = backend.launch(group("broken", worker, backoff_limit=3))
    outcome, status = wait_for_group(backend, ref, timeout=30)

    assert outcome.done and not outcome.succeeded
    assert outcome.failed_task.name == "broken-worker-1"
    failed = status.task("worker", 1)
    # Exit code 1 is a program error: ExitCode policy does not retry it.
    assert failed.restarts == 0 and failed.exit_code == 1
    assert "exit code 1" in failed.reason and "ValueError: column 'x' is missing" in failed.reason
    report = failure_report(backend, ref, outcome)
    assert "broken-worker-1" in report and "Traceback (most recent call last)" in report
    backend.teardown(ref)


def test_a_command_that_does_not_exist_fails_its_task(local_state_dir, group_processes, wait_until):
    backend = LocalBackend()
    ref = backend.launch(group("typo", ["/nonexistent/trainer", "--fast"], workers=1))
    outcome, _ = wait_for_group(backend, ref, timeout=SETTLE)
    assert not outcome.succeeded and outcome.failed_task.name == "typo-worker-0"
    assert "cannot start '/nonexistent/trainer'" in outcome.reason and "roles.worker.command" in outcome.reason
    backend.teardown(ref)


def test_worker_that_keeps_failing_uses_up_the_backoff_limit(local_state_dir, group_processes, wait_until):
    worker = program("import sys\nprint('cannot reach the dataset')\nsys.exit(3)")
    backend = LocalBackend()
    ref = backend.launch(group("flaky", worker, workers=1, backoff_limit=2, worker_restart_policy="OnFailure"))
    outcome, status = wait_for_group(backend, ref, timeout=30)

    assert not outcome.succeeded and outcome.failed_task.name == "flaky-worker-0"
    failed = status.task("worker", 0)
    assert failed.phase is Phase.FAILED and failed.restarts == 2 and failed.exit_code == 3
    assert "backoff limit of 2" in failed.reason and "cannot reach the dataset" in failed.reason
    assert backend.logs(ref, "worker", 0).count("cannot reach the dataset") == 3
    backend.teardown(ref)


FAILS_ONCE = """
    import os, pathlib, sys
    marker = pathlib.Path(sys.argv[1]) / os.environ['AIRFLOW_TF_TASK']
    if not marker.exists():
        marker.write_text('failed once')
        sys.exit('first attempt: cannot reach the dataset')
    print('second attempt trained')
    """


def test_backoff_limit_is_per_task_as_on_kubernetes(local_state_dir, group_processes, wait_until, tmp_path):
    # Both workers fail once: one restart each is within a per-task backoff_limit of 1,
    # although the group restarted twice in all.
    worker = [*program(FAILS_ONCE), str(tmp_path)]
    backend = LocalBackend()
    ref = backend.launch(group("pertask", worker, backoff_limit=1, worker_restart_policy="OnFailure"))
    outcome, status = wait_for_group(backend, ref, timeout=20)

    assert outcome.succeeded, outcome.reason
    assert [status.task("worker", i).restarts for i in (0, 1)] == [1, 1]
    assert "second attempt trained" in backend.logs(ref, "worker", 1)
    backend.teardown(ref)


def test_group_backoff_limit_bounds_the_restarts_of_all_tasks_together(local_state_dir, group_processes,
                                                                       wait_until, tmp_path):
    worker = [*program(FAILS_ONCE), str(tmp_path)]
    backend = LocalBackend()
    ref = backend.launch(group("wholegroup", worker, backoff_limit=1, group_backoff_limit=1,
                               worker_restart_policy="OnFailure"))
    outcome, status = wait_for_group(backend, ref, timeout=20)

    assert not outcome.succeeded
    failed = [t for t in status.tasks if t.phase is Phase.FAILED and t.restarts == 0]
    assert len(failed) == 1, status.tasks
    assert "the group's backoff limit of 1 restart(s) is used up (group_backoff_limit)" in failed[0].reason
    assert "cannot reach the dataset" in failed[0].reason
    backend.teardown(ref)


def test_ps_death_restarts_the_whole_group(local_state_dir, group_processes, wait_until):
    worker = program("import os, time\nprint(os.environ['TF_CONFIG'], flush=True)\ntime.sleep(600)")
    backend = LocalBackend()
    ref = backend.launch(group("psdies", worker))
    wait_until(lambda: "cluster" in backend.logs(ref, "worker", 0), what="worker 0 to start")
    before = backend.processes(ref)
    os.kill(before["psdies-ps-0"], signal.SIGKILL)

    after = wait_until(lambda: len(p := backend.processes(ref)) == 3 and set(p.values()).isdisjoint(before.values()) and p,
                       what="every task restarted")
    status = backend.status(ref)
    assert [t.restarts for t in status.tasks] == [1, 1, 1]
    assert "killed by SIGKILL" in status.task("ps", 0).reason
    assert "group restarted: psdies-ps-0 killed by SIGKILL" in status.task("worker", 0).reason
    log = wait_until(lambda: (text := backend.logs(ref, "worker", 0)).count("cluster") == 2 and text,
                     what="the restarted worker's TF_CONFIG")
    first, second = log.split("--- airflow-tf: restart 1")
    assert json.loads(first.strip())["cluster"]["ps"] != json.loads(second.splitlines()[1])["cluster"]["ps"]
    for pid in before.values():
        assert not alive(pid)
    backend.teardown(ref)
    for pid in after.values():
        assert not alive(pid)


def test_active_deadline_fails_the_group_and_stops_everything(local_state_dir, group_processes, wait_until):
    backend = LocalBackend()
    ref = backend.launch(group("slow", SERVE_FOREVER, active_deadline_seconds=1.0))
    outcome, status = wait_for_group(backend, ref, timeout=30)
    assert not outcome.succeeded and outcome.code is OutcomeCode.DEADLINE_EXCEEDED
    assert "active deadline of 1 s passed" in outcome.reason
    wait_until(lambda: not group_processes(local_state_dir), SETTLE, what="every process to stop")
    assert all(t.phase is Phase.FAILED for t in status.tasks)
    backend.teardown(ref)


def test_tasks_die_with_a_killed_supervisor(local_state_dir, group_processes, wait_until, tmp_path, monkeypatch):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    backend = LocalBackend()
    ref = backend.launch(group("orphans", SERVE_FOREVER))
    tasks = wait_until(lambda: len(p := backend.processes(ref)) == 3 and p, what="3 tasks")
    os.kill(backend.supervisor_pid(ref), signal.SIGKILL)

    wait_until(lambda: not group_processes(local_state_dir), SETTLE, what="the tasks to die with the supervisor")
    # A task in the middle of exiting has no environment left to find it by, yet is not a zombie.
    wait_until(lambda: all(not alive(pid) for pid in tasks.values()), SETTLE, what="every task to be gone")
    outcome, _ = wait_for_group(backend, ref, timeout=SETTLE)
    assert not outcome.succeeded and outcome.code is OutcomeCode.SUPERVISOR_LOST
    assert "supervisor of group 'orphans'" in outcome.reason
    assert len(os.listdir(temporary)) == 3, "each task had a temporary directory of its own"
    assert sorted(backend.teardown(ref)) == sorted(tasks)
    assert os.listdir(temporary) == [], "the teardown removed what the dead supervisor could not"


def test_teardown_is_prompt_even_for_a_task_that_ignores_sigterm(local_state_dir, group_processes, wait_until):
    stubborn = program("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(600)")
    backend = LocalBackend()
    ref = backend.launch(group("stubborn", stubborn))
    wait_until(lambda: "ready" in backend.logs(ref, "worker", 0) and "ready" in backend.logs(ref, "worker", 1),
               what="workers to ignore SIGTERM")
    started = time.monotonic()
    deleted = backend.teardown(ref)
    elapsed = time.monotonic() - started
    assert sorted(deleted) == ["stubborn-ps-0", "stubborn-worker-0", "stubborn-worker-1"]
    assert elapsed < PROMPT, f"teardown took {elapsed:.2f} s"
    assert not group_processes(local_state_dir)


def test_teardown_waits_for_a_supervisor_that_is_still_exiting(local_state_dir, group_processes, wait_until):
    """A supervisor writes "exited" before its last log copy and its interpreter's exit; a
    teardown (the CLI's, the teardown task's) that returned in that window left it running behind
    the caller. The window is made wide here: the recorded supervisor becomes a process with the
    group's environment that takes a second to exit."""
    backend = LocalBackend()
    ref = backend.launch(group("exiting", program("pass"), ps=program("pass")))
    wait_until(lambda: not group_processes(local_state_dir), SETTLE, what="the finished group's supervisor to exit")
    state_file = backend._dir("exiting").state
    state = read_json(state_file)
    assert state["supervisor"]["state"] == "exited"
    finishing = subprocess.Popen(program("import time\ntime.sleep(1)"), env=dict(os.environ, **{STATE_DIR_ENV: str(local_state_dir)}))
    try:
        state["supervisor"].update(pid=finishing.pid, start_time=process_start_time(finishing.pid))
        write_group_file(state_file, state)
        assert group_processes(local_state_dir) == [finishing.pid]
        assert sorted(backend.teardown(ref)) == ["exiting-ps-0", "exiting-worker-0", "exiting-worker-1"]
        assert not group_processes(local_state_dir), "teardown returned while the supervisor was still running"
    finally:
        finishing.kill()
        finishing.wait()


def test_group_stops_when_its_owner_process_dies(local_state_dir, group_processes, wait_until):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        backend = LocalBackend()
        ref = backend.launch(group("owned", SERVE_FOREVER), owner_pid=owner.pid)
        wait_until(lambda: len(backend.processes(ref)) == 3, what="3 tasks")
    finally:
        owner.kill()
        owner.wait()
    wait_until(lambda: not group_processes(local_state_dir), SETTLE, what="the group to stop with its owner")
    outcome, _ = wait_for_group(backend, ref, timeout=SETTLE)
    assert outcome.code is OutcomeCode.LAUNCHER_EXITED and f"(pid {owner.pid})" in outcome.reason
    backend.teardown(ref)


def test_bad_specs_are_refused_before_anything_starts(local_state_dir, group_processes, wait_until):
    with pytest.raises(SpecError, match="roles.worker.replicas: a group needs at least one worker"):
        group("noworkers", SERVE_FOREVER, workers=0)
    with pytest.raises(SpecError, match="unknown role.*'chief'"):
        GroupSpec(name="master", roles={"master": RoleSpec(command=SERVE_FOREVER), "worker": RoleSpec(command=SERVE_FOREVER)})
    spec = group("edited", SERVE_FOREVER)
    spec.roles["worker"].restart_policy = "Always"  # edited after construction: launch validates again
    with pytest.raises(SpecError, match="roles.worker.restart_policy: 'Always'"):
        LocalBackend().launch(spec)
    assert not os.path.exists(local_state_dir) or os.listdir(local_state_dir) == []
    assert not group_processes(local_state_dir)


def test_a_dataset_without_success_marker_is_refused_before_anything_starts(local_state_dir, group_processes,
                                                                           wait_until, tmp_path):
    dataset = tmp_path / "datasets" / "half-written" / "3"
    (dataset / "train").mkdir(parents=True)
    config = TrainingConfig(dataset=str(dataset), run_dir=str(tmp_path / "run"), steps=10)
    with pytest.raises(DatasetNotReadyError, match=re.escape(str(dataset)) + ".*_SUCCESS"):
        LocalBackend().launch(GroupSpec.for_training("halfdata", config))
    assert not group_processes(local_state_dir)
    assert not local_state_dir.exists() or os.listdir(local_state_dir) == []
    assert not (tmp_path / "run").exists()


def test_status_of_an_unknown_group(local_state_dir, group_processes, wait_until):
    backend = LocalBackend()
    ref = GroupRef(backend="local", name="never-launched", options={"state_dir": str(local_state_dir)})
    assert backend.status(ref).exists is False
    assert backend.logs(ref, "worker", 0) == ""
    assert backend.teardown(ref) == []


def test_a_teardown_returns_only_once_what_a_task_left_behind_is_gone_too(local_state_dir, wait_until):
    """A task that started a process of its own in another session, deaf to SIGTERM: stopping the
    task's process group leaves it running, so the teardown finds it by the group's name in its
    environment and kills it before it returns."""
    leave_one_behind = program(f"""
        import subprocess, time
        left = subprocess.Popen([{sys.executable!r}, "-c", "import signal, time\\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\ntime.sleep(600)"],
                                start_new_session=True)
        print("left", left.pid, flush=True)
        time.sleep(600)
    """)
    backend = LocalBackend()
    ref = backend.launch(group("left", leave_one_behind, workers=1))
    try:
        found = wait_until(lambda: re.search(r"^left (\d+)$", backend.logs(ref, "worker", 0), re.M), SETTLE,
                           what="the worker to start its own process")
        left = (int(found.group(1)), process_start_time(int(found.group(1))))
        assert is_running(*left)
    finally:
        assert backend.teardown(ref) == ["left-ps-0", "left-worker-0"]
    assert not is_running(*left), "the teardown returned while a process of the group still ran"
