"""Pods that act out a test's scenario for real, on the plane's real node.

A test that needs a task to exit with a given code, print given lines, write a termination
message, be OOMKilled or stay Terminating launches its group as a user would (the real backend,
the training image), with :func:`scripted_manifests` applied to the Jobs and JobSets the backend
creates: each container's command becomes :data:`HOLD`, a loop of the image's ``/bin/sh`` that
waits for the test to tell it what to do. :class:`ScriptedPods` tells it, by ``kubectl exec``
through the API server (as a person would), and the real kubelet reports what followed: the
pod's phase, exit code, reason, termination message and log.

The backend's own command is kept in the pod template's :data:`COMMAND_ANNOTATION` (see
:func:`original_command`), and the probes are dropped: they ask a TensorFlow server that the
loop does not run.
"""

from __future__ import annotations

import functools
import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .plane import wait_for

ROOT = Path(__file__).resolve().parents[2]
COMMAND_ANNOTATION = "airflow-tf-test/command"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
ABSENT_IMAGE = "127.0.0.1:1/airflow-tf-test/absent:0"
"""An image no registry serves: the node's pull is refused on this machine's loopback (no name
is looked up, nothing leaves the machine), so its pods wait with ``ErrImagePull``."""

HOLD = """\
trap 'exit 143' TERM
n=0
while :; do
  if [ -e /tmp/act.$n ]; then
    if [ -e /tmp/sender.$n ]; then
      while [ -e /proc/$(cat /tmp/sender.$n) ]; do sleep 0.05; done
    fi
    n=$((n + 1)); . /tmp/act.$((n - 1)); : > /tmp/done.$((n - 1))
  fi
  sleep 0.2
done
"""
"""The containers' command: run each act ``/tmp/act.N`` the test sends, in order. SIGTERM ends
it as it ends a task (exit 143), unless an act said to ignore it. An act the sender does not wait
for runs once the sender's ``kubectl exec`` process is gone: an act that ends the container would
otherwise kill that process mid-exit (the exec fails with 137 on a loaded node)."""

_SEND = """\
n=0; while [ -e /tmp/act.$n ]; do n=$((n + 1)); done
cat > /tmp/.act
[ "$1" = wait ] || echo $$ > /tmp/sender.$n
mv /tmp/.act /tmp/act.$n
if [ "$1" = wait ]; then until [ -e /tmp/done.$n ]; do sleep 0.1; done; fi
"""


@functools.cache
def training_image() -> str:
    """The built training image, as loaded into the nodes' containerd."""
    return subprocess.run([str(ROOT / "scripts" / "images"), "ref", "training"], check=True, capture_output=True,
                          text=True).stdout.strip()


def _pod_specs(obj: dict) -> list[dict]:
    """The pod templates of a Job or of each Job of a JobSet."""
    if obj.get("kind") == "JobSet":
        return [job["template"]["spec"]["template"] for job in obj["spec"]["replicatedJobs"]]
    return [obj["spec"]["template"]]


def scripted_manifests(obj: dict, unready: frozenset[str] = frozenset()) -> dict:
    """``obj`` with every container running :data:`HOLD` instead of its command (kept in the
    template's annotation) and without probes, but for the containers named in ``unready``:
    they are not Ready until told (:meth:`ScriptedPods.ready`). Other objects are returned as
    they are."""
    if obj.get("kind") not in ("Job", "JobSet"):
        return obj
    obj = json.loads(json.dumps(obj))
    for template in _pod_specs(obj):
        containers = template["spec"]["containers"]
        annotations = template.setdefault("metadata", {}).setdefault("annotations", {})
        annotations[COMMAND_ANNOTATION] = json.dumps({c["name"]: c.get("command") for c in containers})
        for container in containers:
            container["command"] = ["/bin/sh", "-c", HOLD]
            container.pop("args", None)
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                container.pop(probe, None)
            if container["name"] in unready:
                container["readinessProbe"] = {"exec": {"command": ["test", "-e", "/tmp/ready"]}, "periodSeconds": 1}
    return obj


def original_command(obj: dict, container: str | None = None) -> list[str]:
    """The command the backend gave a container of a Job (or of its pod), before
    :func:`scripted_manifests`; the first container's by default."""
    template = obj["spec"]["template"] if "template" in obj["spec"] else obj
    commands = json.loads(template["metadata"]["annotations"][COMMAND_ANNOTATION])
    return commands[container or template["spec"]["containers"][0]["name"]]


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
    """kubectl's output; AssertionError with its complaint when it fails."""
    result = subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", *args], input=stdin, capture_output=True,
                            text=True, timeout=timeout)
    if result.returncode:
        raise AssertionError(f"kubectl {' '.join(args[:6])}: {result.stderr.strip()}")
    return result.stdout


class ScriptedPods:
    """What the pods of one test's namespace do, told to them as they run on the real node."""

    def __init__(self, kube) -> None:
        self.kube = kube
        self.unready: set[str] = set()
        """Names of the containers that are not Ready until :meth:`ready` (Jobs created from now on)."""

    def pod(self, job: str, index: int, timeout: float = 60.0, other_than: str | None = None) -> str:
        """The newest pod the Job controller made for ``index`` of ``job`` (and, with
        ``other_than``, not that one), once the scheduler placed it on a node."""

        def newest() -> str | None:
            pods = [p for p in self.kube.objects("pods", f"batch.kubernetes.io/job-name={job},{INDEX_LABEL}={index}")
                    if p["spec"].get("nodeName") and p["metadata"]["name"] != other_than
                    and not p["metadata"].get("deletionTimestamp")]
            return max(pods, key=lambda p: p["metadata"]["creationTimestamp"])["metadata"]["name"] if pods else None

        return wait_for(newest, timeout, f"a pod of Job {job} index {index} on a node")

    def running(self, pod: str, timeout: float = 120.0) -> dict:
        """The pod once its container runs (the kubelet started it)."""

        def started() -> dict | None:
            found = self.kube.get("pods", pod)
            assert found is not None, f"pod {pod} is gone"
            statuses = (found.get("status") or {}).get("containerStatuses") or []
            return found if statuses and all("running" in (s.get("state") or {}) for s in statuses) else None

        return wait_for(started, timeout, f"the container of pod {pod} to run", interval=0.2)

    def act(self, pod: str, script: str, wait: bool = True) -> None:
        """Have the pod's :data:`HOLD` loop run ``script`` (sh); with ``wait``, return once it ran."""
        self.running(pod)
        kubectl(self.kube.plane.admin_kubeconfig, "-n", self.kube.ns, "exec", "-i", pod, "--", "sh", "-c", _SEND,
                 "send", "wait" if wait else "", stdin=script)

    def ready(self, pod: str) -> None:
        """The pod's container (one named in :attr:`unready`) passes its readiness probe from now on."""
        self.act(pod, ": > /tmp/ready\n")

    def say(self, pod: str, text: str) -> None:
        """The container prints ``text`` (its log)."""
        self.act(pod, f"printf '%s' {shlex.quote(text)}\n")

    def exit(self, pod: str, code: int, log: str = "", message: str | None = None, wait: bool = True) -> None:
        """The container prints ``log``, writes ``message`` to its termination-log file, and exits
        with ``code``; with ``wait``, return once the kubelet reported it."""
        script = f"printf '%s' {shlex.quote(log)}\n" if log else ""
        if message is not None:
            script += f"printf '%s' {shlex.quote(message)} > /dev/termination-log\n"
        self.act(pod, script + f"exit {int(code)}\n", wait=False)
        if wait:
            self.ended(pod, int(code))

    def succeed(self, pod: str, log: str = "", message: str | None = None, wait: bool = True) -> None:
        self.exit(pod, 0, log, message, wait)

    def fail(self, pod: str, exit_code: int = 1, log: str = "", message: str | None = None,
             wait: bool = True) -> None:
        self.exit(pod, exit_code, log, message, wait)

    def oom(self, pod: str) -> None:
        """The container allocates 1 GiB (python from the image), past its memory limit; returns
        once the kubelet reported it OOMKilled."""
        self.act(pod, "exec python -c 'data = b\"x\" * (1 << 30)'\n", wait=False)
        self.ended(pod, 137)

    def ended(self, pod: str, code: int, timeout: float = 60.0) -> None:
        """Wait until the pod's status says a container ended with ``code`` (restarted since, or
        not), or the pod is gone or being deleted."""

        def ended() -> bool:
            found = self.kube.get("pods", pod)
            if found is None or found["metadata"].get("deletionTimestamp"):
                return True
            return any((state.get("terminated") or {}).get("exitCode") == code
                       for status in (found.get("status") or {}).get("containerStatuses") or []
                       for state in (status.get("state") or {}, status.get("lastState") or {}))

        wait_for(ended, timeout, f"pod {pod} to end with exit code {code}", interval=0.2)

    def evict(self, pod: str) -> None:
        """Evict the pod through the Eviction API, as a node drain does."""
        self.kube.plane.core.create_namespaced_pod_eviction(pod, self.kube.ns, {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": self.kube.ns}})

    def terminating(self, pod: str) -> None:
        """Delete the pod gracefully (30 s) with its container ignoring SIGTERM: it stays Terminating."""
        from kubernetes import client

        self.act(pod, "trap '' TERM\n")
        self.kube.plane.core.delete_namespaced_pod(pod, self.kube.ns,
                                                   body=client.V1DeleteOptions(grace_period_seconds=30))


@pytest.fixture
def scripted(kube, monkeypatch) -> ScriptedPods:
    """This test's Jobs and JobSets are created with :func:`scripted_manifests` applied; the
    pods act as told through the returned :class:`ScriptedPods`."""
    from kubernetes import client

    create_job = client.BatchV1Api.create_namespaced_job
    create_custom = client.CustomObjectsApi.create_namespaced_custom_object

    pods = ScriptedPods(kube)

    def job(self: Any, namespace: str, body: dict, **kwargs: Any) -> Any:
        return create_job(self, namespace, scripted_manifests(body, frozenset(pods.unready)), **kwargs)

    def custom(self: Any, group: str, version: str, namespace: str, plural: str, body: dict, **kwargs: Any) -> Any:
        return create_custom(self, group, version, namespace, plural,
                             scripted_manifests(body, frozenset(pods.unready)), **kwargs)

    monkeypatch.setattr(client.BatchV1Api, "create_namespaced_job", job)
    monkeypatch.setattr(client.CustomObjectsApi, "create_namespaced_custom_object", custom)
    return pods
