"""The local backend under hostile conditions, with tiny Python programs as tasks (real
processes and sockets, no TensorFlow): network isolation, minimal task environments, the
launcher's tie and hand-over, fresh attempts after a dead launch, parameter servers stopped by
the supervisor, the progress watchdog and oversubscription."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from processes import can_connect, environ_of, external_address

from airflow_tf.backends.local import LocalBackend
from airflow_tf.backends.local.memory import mem_available_mib
from airflow_tf.backends.local.processes import remove_temporary_directory, task_environment, temporary_directory
from airflow_tf.backends.wait import completion_event, wait_for_group
from airflow_tf.cluster import GroupSpec, OutcomeCode, Phase, RoleSpec
from airflow_tf.backends import BackendError
from airflow_tf.files import read_json


def program(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


SERVE_FOREVER = program("import time\ntime.sleep(600)")
LISTENER = program("""
    import json, os, socket, time
    config = json.loads(os.environ['TF_CONFIG'])
    kind = config['task']['type']
    me = config['cluster'][kind][config['task']['index']]
    server = socket.socket()
    server.bind(('0.0.0.0', int(me.rsplit(':', 1)[1])))  # like TensorFlow's gRPC server: every interface
    server.listen()
    print('listening', flush=True)
    if kind == 'worker':
        host, port = config['cluster']['ps'][0].rsplit(':', 1)
        for _ in range(200):
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                print('reached the ps', flush=True)
                break
            except OSError:
                time.sleep(0.05)
    time.sleep(600)
    """)
# A chief that reports one global step, then hangs (no further progress).
HANGS_AFTER_ONE_STEP = program("""
    import time
    print('airflow-tf progress global_step=1 target_step=10 percent=10.0 examples_per_sec=1.0 loss=1 eta_seconds=9', flush=True)
    time.sleep(600)
    """)


def group(name: str, worker: list[str], ps: list[str] = SERVE_FOREVER, workers: int = 2, **options) -> GroupSpec:
    return GroupSpec(name=name, roles={
        "ps": RoleSpec(replicas=1, restart_policy="OnFailure", command=ps),
        "worker": RoleSpec(replicas=workers, command=worker, env=options.pop("worker_env", {})),
    }, **options)


def state_of(state_dir, name: str) -> dict:
    return read_json(state_dir / name / "state.json", missing_ok=True)


# -- isolation ------------------------------------------------------------------------------
def test_nothing_off_this_machine_reaches_a_group(local_state_dir, wait_until):
    address = external_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to probe from")
    # The probe works: a socket on every interface of this namespace is reachable at that address.
    with socket.socket() as control:
        control.bind(("0.0.0.0", 0))
        control.listen()
        assert can_connect(address, control.getsockname()[1])

    backend = LocalBackend()
    ref = backend.launch(group("walled", LISTENER, ps=LISTENER))
    try:
        wait_until(lambda: all("reached the ps" in backend.logs(ref, "worker", i) for i in (0, 1)), 20,
                   what="the workers to reach the ps over the group's loopback")
        state = state_of(local_state_dir, "walled")
        assert state["isolation"] == {"network": "private", "warning": None}
        ports = {name: p["port"] for name, p in state["processes"].items()}
        assert len(ports) == 3
        for name, port in ports.items():
            assert not can_connect(address, port), f"{name} is reachable at {address}:{port}"
        own_namespace = os.readlink("/proc/self/ns/net")
        assert all(os.readlink(f"/proc/{pid}/ns/net") != own_namespace for pid in backend.processes(ref).values())
        # Status, logs and teardown work across the namespace boundary.
        assert backend.status(ref).counts()["worker"]["Running"] == 2
    finally:
        assert len(backend.teardown(ref)) == 3


ISOLATED_LISTENER = """
import encodings.idna, os, socket, sys
from airflow_tf.backends.local.network import isolate_network
if sys.argv[1] == "unprivileged":
    os.setgid(65534); os.setuid(65534)
    import ctypes; ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable again, as any ordinary user's process is
refused = isolate_network()
server = socket.socket(); server.bind(("0.0.0.0", 0)); server.listen()
port = server.getsockname()[1]
socket.create_connection(("127.0.0.1", port), timeout=2).close()
print(os.geteuid(), port, refused, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("who", ["root", "unprivileged"])
def test_both_ways_into_a_private_network_namespace(who):
    """As root a network namespace; as an ordinary user (nobody) a user namespace owning it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start as root and to become nobody")
    address = external_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to probe from")
    child = subprocess.Popen([sys.executable, "-c", ISOLATED_LISTENER, who], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        uid, port, refused = child.stdout.readline().split()
        assert refused == "None", child.stderr.read()
        assert int(uid) == (0 if who == "root" else 65534), "the user keeps its own identity"
        assert not can_connect(address, int(port)) and not can_connect("127.0.0.1", int(port))
    finally:
        child.kill()
        child.communicate()


# Refuses unshare(2) with EPERM for this process and its children, as the default seccomp
# profile of Docker and Kubernetes does for a container without CAP_SYS_ADMIN (x86-64 numbers).
NO_UNSHARE_LAUNCHER = """
import ctypes, json, logging, sys, time
class Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]
SYS_UNSHARE, EPERM = 272, 1
rules = (Filter * 4)(Filter(0x20, 0, 0, 0), Filter(0x15, 0, 1, SYS_UNSHARE),
                     Filter(0x06, 0, 0, 0x00050000 | EPERM), Filter(0x06, 0, 0, 0x7fff0000))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0 and libc.prctl(22, 2, ctypes.byref(Program(4, rules)), 0, 0) == 0
logging.basicConfig(level=logging.WARNING, format="WARNING %(message)s", stream=sys.stderr)
from airflow_tf.backends.local import LocalBackend
from airflow_tf.cluster import GroupSpec
backend = LocalBackend(sys.argv[1])
ref = backend.launch(GroupSpec.from_dict(json.loads(sys.argv[2])))
while len(backend.processes(ref)) < 3:
    time.sleep(0.05)
print(json.dumps(backend.status(ref).counts()), flush=True)
backend.teardown(ref, ["ps", "worker"])
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the seccomp filter of this test is written for x86-64")
def test_where_the_system_refuses_a_namespace_the_group_runs_with_one_warning(local_state_dir):
    spec = group("exposed", SERVE_FOREVER)
    launch = subprocess.run([sys.executable, "-c", NO_UNSHARE_LAUNCHER, str(local_state_dir),
                             json.dumps(spec.to_dict())], capture_output=True, text=True, timeout=120)
    assert launch.returncode == 0, launch.stderr
    assert json.loads(launch.stdout.splitlines()[-1])["worker"]["Running"] == 2, launch.stdout
    # Logged once, by Python's logging or by Airflow's (structlog, on stdout) when Airflow's settings were read.
    warnings = [line for line in (launch.stderr + launch.stdout).splitlines() if "is NOT network-isolated" in line]
    assert len(warnings) == 1, (launch.stdout, launch.stderr)
    assert "training group 'exposed' is NOT network-isolated" in warnings[0]
    assert "unshare(CLONE_NEWUSER|CLONE_NEWNET): Operation not permitted" in warnings[0]
    assert "without authentication" in warnings[0] and "read and write their files" in warnings[0]
    assert "user.max_user_namespaces" in warnings[0] and "CAP_SYS_ADMIN" in warnings[0]
    state = state_of(local_state_dir, "exposed")
    assert state["isolation"]["network"] == "shared" and state["isolation"]["warning"] in warnings[0]
    LocalBackend().teardown(LocalBackend().find("exposed"))


def test_remote_storage_with_isolation_is_refused(local_state_dir, tmp_path):
    from airflow_tf.cluster import TrainingConfig

    # (A run directory must be a local or mounted path: TrainingConfig refuses gs:// there.)
    config = TrainingConfig(dataset="gs://bucket/datasets/x/1", run_dir=str(tmp_path / "run"), steps=10)
    spec = GroupSpec.for_training("remote", config)
    with pytest.raises(BackendError, match="dataset 'gs://bucket/datasets/x/1' is on remote storage.*isolate_network=False"):
        LocalBackend().launch(spec)
    assert not local_state_dir.exists() or os.listdir(local_state_dir) == []


# -- environment ----------------------------------------------------------------------------
SECRETS = {
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow:hunter2@db/airflow",
    "AIRFLOW__API_AUTH__JWT_SECRET": "jwt-secret-value",
    "AIRFLOW__CORE__FERNET_KEY": "fernet-key-value",
    "AIRFLOW_CONN_WAREHOUSE": "postgres://user:pw@warehouse/db",
    "AIRFLOW_VAR_API_TOKEN": "token-value",
    "DATABASE_URL": "postgresql://app:pw@db/app",
}


def test_tasks_get_a_minimal_environment_and_no_airflow_secrets(local_state_dir, monkeypatch, wait_until):
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MODEL_REGISTRY_URL", "http://registry.example")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    backend = LocalBackend()
    ref = backend.launch(group("clean", SERVE_FOREVER, pass_env=["MODEL_REGISTRY_URL"], worker_env={"COLOR": "blue"}))
    try:
        pids = wait_until(lambda: len(p := backend.processes(ref)) == 3 and p, what="3 tasks")
        environments = {name: environ_of(pid) for name, pid in pids.items()}
        environments["supervisor"] = environ_of(backend.supervisor_pid(ref))
        for name, env in environments.items():
            leaked = sorted(k for k in env if k in SECRETS or k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_")))
            assert not leaked, f"{name} got {leaked}"
            assert not set(SECRETS.values()) & set(env.values()), f"{name} got a secret's value"
            assert env["PATH"] == os.environ["PATH"] and env["HOME"] == os.environ["HOME"]
            assert env["LC_ALL"] == "C.UTF-8" and env["TF_ENABLE_ONEDNN_OPTS"] == "0"
            assert env["MODEL_REGISTRY_URL"] == "http://registry.example", "pass_env passes what it names"
        for name in pids:
            assert json.loads(environments[name]["TF_CONFIG"])["task"]["type"] in ("ps", "worker")
        assert environments["clean-worker-1"]["COLOR"] == "blue" and "COLOR" not in environments["clean-ps-0"]
    finally:
        backend.teardown(ref)


def test_task_environment_finds_this_package_from_anywhere(tmp_path):
    env = task_environment(environ={"PATH": os.environ["PATH"], "AIRFLOW__CORE__SQL": "x"})
    assert "AIRFLOW__CORE__SQL" not in env
    found = subprocess.run([sys.executable, "-c", "import airflow_tf.runtime"], env=env, cwd=tmp_path)
    assert found.returncode == 0


# -- tied to the launcher until handed over; a fresh attempt after a dead one ------------
def launcher(state_dir, spec: GroupSpec, hand_over: bool) -> subprocess.Popen:
    """A process that launches ``spec`` (like an Airflow launch task), optionally hands the
    group over, prints the supervisor's pid and then waits to be killed."""
    code = textwrap.dedent(f"""
        import json, sys, time
        from airflow_tf.backends.local import LocalBackend
        from airflow_tf.cluster import GroupSpec
        backend = LocalBackend({str(state_dir)!r})
        ref = backend.launch(GroupSpec.from_dict(json.loads(sys.argv[1])))
        if {hand_over!r}:
            backend.hand_over(ref)
        print(backend.supervisor_pid(ref), flush=True)
        time.sleep(600)
        """)
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(spec.to_dict())], stdout=subprocess.PIPE, text=True)


def test_a_launch_killed_before_hand_over_takes_its_group_with_it_and_the_next_launch_starts_afresh(
        local_state_dir, group_processes, wait_until):
    spec = group("tied", SERVE_FOREVER)
    first = launcher(local_state_dir, spec, hand_over=False)
    first_supervisor = int(first.stdout.readline())
    backend = LocalBackend()
    ref = backend.find("tied")
    wait_until(lambda: len(backend.processes(ref)) == 3, what="3 tasks")
    first.kill()
    first.wait()
    wait_until(lambda: not group_processes(local_state_dir), 20, what="the group to stop with its launcher")
    assert "exited before handing the group over" in backend.status(ref).failure
    (local_state_dir / "tied" / "logs" / "worker-0.log").write_text("attempt 1 was here\n")

    # The next launch of that name does not re-attach to the dead group: it starts afresh.
    again = backend.launch(spec)
    try:
        assert backend.supervisor_pid(again) not in (None, first_supervisor)
        wait_until(lambda: len(backend.processes(again)) == 3, what="the new attempt's tasks")
        assert backend.status(again).failure is None
        saved = read_json(local_state_dir / "tied" / "spec.json", missing_ok=True)
        assert saved["attempt"] == 2
        kept = local_state_dir / "tied" / "attempts" / "1"
        assert (kept / "worker-0.log").read_text() == "attempt 1 was here\n", "the dead attempt's logs are kept"
    finally:
        backend.teardown(again)


def test_a_handed_over_group_outlives_its_launcher(local_state_dir, group_processes, wait_until):
    owner = launcher(local_state_dir, group("free", SERVE_FOREVER), hand_over=True)
    supervisor = int(owner.stdout.readline())
    owner.kill()
    owner.wait()
    backend = LocalBackend()
    ref = backend.find("free")
    wait_until(lambda: len(backend.processes(ref)) == 3, what="3 tasks")
    assert backend.supervisor_pid(ref) == supervisor and backend.status(ref).failure is None
    assert backend.launch(group("free", SERVE_FOREVER)) == ref, "a live group is re-attached"
    assert backend.supervisor_pid(ref) == supervisor
    backend.teardown(ref)


# -- the supervisor ends what nobody needs ------------------------------------------------
def test_the_supervisor_stops_the_ps_after_the_workers_without_anyone_watching(local_state_dir, group_processes,
                                                                             wait_until):
    backend = LocalBackend()
    ref = backend.launch(group("alone", program("print('trained')"), ps_grace_seconds=0.5))
    backend.hand_over(ref)
    wait_until(lambda: not group_processes(local_state_dir), 20, what="the ps and the supervisor to stop by themselves")
    status = backend.status(ref)
    ps = status.task("ps", 0)
    assert ps.phase is Phase.SUCCEEDED and ps.reason == "stopped by the supervisor 0.5 s after the workers finished"
    event = completion_event(backend, ref, status, ref.success_policy)
    assert event["status"] == "success" and event["counts"]["worker"]["Succeeded"] == 2
    assert backend.teardown(ref) == ["alone-ps-0", "alone-worker-0", "alone-worker-1"]


def test_the_supervisor_stops_the_rest_of_a_group_that_failed_for_good(local_state_dir, group_processes,
                                                                       wait_until):
    worker = program("""
        import os, sys, time
        if os.environ['AIRFLOW_TF_TASK'].endswith('-1'):
            sys.exit('the model does not fit the data')
        time.sleep(600)
        """)
    backend = LocalBackend()
    ref = backend.launch(group("halfdead", worker, ps_grace_seconds=0.5))
    wait_until(lambda: not group_processes(local_state_dir), 20, what="the rest of the group to stop by itself")
    status = backend.status(ref)
    outcome = wait_for_group(backend, ref, timeout=20)[0]
    assert outcome.code is OutcomeCode.TASK_FAILED, "the group failed because a task did, not the stopping"
    assert outcome.reason.startswith("task halfdead-worker-1 (worker 1) failed: exit code 1")
    assert outcome.reason.endswith("; the rest of the group was stopped")
    assert status.task("worker", 0).reason == "stopped by the supervisor: the group had failed"
    assert status.task("ps", 0).reason == "stopped by the supervisor 0.5 s after the group failed"
    backend.teardown(ref)


# -- the progress watchdog ------------------------------------------------------------------
def test_a_task_with_no_progress_is_restarted_then_fails_the_group_by_name(local_state_dir, wait_until):
    backend = LocalBackend()
    ref = backend.launch(group("stall", HANGS_AFTER_ONE_STEP, workers=1, progress_timeout=3, backoff_limit=1))
    outcome, status = wait_for_group(backend, ref, timeout=30)
    try:
        assert not outcome.succeeded and outcome.failed_task.name == "stall-worker-0"
        assert outcome.code is OutcomeCode.NO_PROGRESS and outcome.failed_task.code == "NoProgress"
        assert "3 s" in outcome.reason and "backoff limit of 1" in outcome.reason
        assert status.task("worker", 0).restarts == 1
        assert "restart 1 of stall-worker-0" in backend.logs(ref, "worker", 0)
    finally:
        backend.teardown(ref)


def test_a_stopped_worker_is_restarted_while_the_chief_trains_on(local_state_dir, wait_until, tmp_path):
    marker = tmp_path / "second-run"
    worker = program(f"""
        import os, sys, time
        chief = os.environ['AIRFLOW_TF_TASK'].endswith('-0')
        if not chief and os.path.exists({str(marker)!r}):
            sys.exit(0)
        for step in range(1, 100000):
            if chief:
                print(f'airflow-tf progress global_step={{step}} target_step=100000 percent=0 examples_per_sec=1 '
                      'loss=1 eta_seconds=1', flush=True)
                if os.path.exists({str(marker)!r}):
                    sys.exit(0)
            sum(range(100000))  # uses CPU, as a training worker does
            time.sleep(0.1)
        """)
    backend = LocalBackend()
    # 6 s: the chief, printing every 0.1 s, must never look stalled on a loaded machine.
    ref = backend.launch(group("sigstop", worker, progress_timeout=6))
    try:
        victim = wait_until(lambda: backend.processes(ref).get("sigstop-worker-1"), what="worker 1")
        wait_until(lambda: "global_step=5 " in backend.logs(ref, "worker", 0), what="the chief's progress")
        marker.touch()  # a restarted worker 1 finishes at once
        os.kill(victim, signal.SIGSTOP)
        outcome, status = wait_for_group(backend, ref, timeout=30)
        assert outcome.succeeded, outcome.reason
        stopped = status.task("worker", 1)
        assert stopped.restarts == 1 and "no progress for 6 s" in stopped.reason
        assert status.task("worker", 0).restarts == 0, "the chief kept its progress"
    finally:
        backend.teardown(ref)


# -- oversubscription -----------------------------------------------------------------------
def test_a_group_that_does_not_fit_in_memory_is_refused_with_the_numbers(local_state_dir, group_processes):
    spec = group("huge", SERVE_FOREVER, workers=4)
    spec.roles["worker"].resources = {"requests": {"memory": "64Ti"}}
    with pytest.raises(BackendError) as refused:
        LocalBackend().launch(spec)
    message = str(refused.value)
    assert "needs about 268435456 MiB (4 worker x 67108864 MiB)" in message
    assert "MiB available (MemAvailable in /proc/meminfo)" in message and "fewer tasks" in message
    assert not group_processes(local_state_dir)
    assert not local_state_dir.exists() or os.listdir(local_state_dir) == []


def test_memory_promised_to_a_group_still_starting_is_counted_by_the_next_launch(local_state_dir, group_processes):
    # Tasks that will take a quarter of the free memory each but hold almost none yet: what
    # MemAvailable shows right after a launch, before TensorFlow is imported.
    quarter = f"{int(mem_available_mib() / 4)}Mi"

    def hungry(name):
        spec = group(name, SERVE_FOREVER)
        for role in spec.roles.values():
            role.resources = {"requests": {"memory": quarter}}
        return spec

    backend = LocalBackend()
    first = backend.launch(hungry("first"))
    try:
        with pytest.raises(BackendError) as refused:
            backend.launch(hungry("second"))
        message = str(refused.value)
        assert "training group 'second' needs about" in message
        assert "will be taken by groups still starting" in message and "wait for other trainings" in message
        assert backend.find("second") is None
    finally:
        backend.teardown(first)
    second = backend.launch(hungry("second"))  # the first one's promise is gone with it
    backend.teardown(second)
    assert not group_processes(local_state_dir)


def test_more_training_tasks_than_cores_is_a_warning(local_state_dir, caplog):
    cores = len(os.sched_getaffinity(0))
    backend = LocalBackend()
    with caplog.at_level(logging.WARNING, logger="airflow_tf.backends.local"):
        ref = backend.launch(group("crowded", SERVE_FOREVER, workers=cores + 1))
    backend.teardown(ref)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"training group 'crowded' has {cores + 1} training tasks for {cores} CPU core(s): they "
                        f"share the cores, so each trains slower and the group may be no faster than {cores} "
                        "worker(s) would be"]


def test_a_teardown_removes_only_task_directories_in_a_temporary_directory(tmp_path):
    """A state file names the directories to remove; one elsewhere, or not named as a task's, stays."""
    temporary, elsewhere = tmp_path / "tmp", tmp_path / "models"
    temporary.mkdir()
    elsewhere.mkdir()
    task_dir = temporary_directory(str(temporary))
    lookalike = elsewhere / "airflow-tf-task-saved"
    lookalike.mkdir()
    plain = temporary / "keep"
    plain.mkdir()
    for path in (str(lookalike), str(plain), task_dir):
        remove_temporary_directory(path, parents=[str(temporary)])
    assert lookalike.is_dir() and plain.is_dir(), "a directory outside the temporary one, or not a task's, is kept"
    assert not os.path.exists(task_dir)
