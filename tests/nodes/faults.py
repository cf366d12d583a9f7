"""A node taken from a training group on a plane of real nodes, timed: the node holding one of its
tasks stopped as a lost machine goes (``scripts/kube node stop``), drained (``kubectl drain``) or
cut off from the pod network with its kubelet still Ready (``scripts/kube node cut``), and the
seconds from the fault to the node ``NotReady`` (or the task's pod not Ready, after a cut), the
task's pod evicted and released (gone or ``Failed``), its replacement running on another node, and
the training moving again. Used by ``bench/bench_node_loss.py``."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from airflow_tf.backends.kubernetes.labels import GROUP_LABEL, INDEX_LABEL, ROLE_LABEL
from airflow_tf.backends.kubernetes.nodes import NOT_READY, UNREACHABLE
from airflow_tf.demo import DEMO_NAMESPACE

from k8s.plane import KUBE_SCRIPT, wait_for

from .host import plane_env
from .scheduled import progress

STOP, DRAIN, CUT = "node stop", "drain", "network cut"
RECOVERY_BOUND = 420
"""Seconds a fault may take to recover (training moving again): NotReady after 20 s, evicted 30 s
later (the backend's toleration), released 10 s past a worker's 30 s grace, a new pod, TensorFlow
started and the session made again, under the load of the other tests."""
READY_BOUND = 180


class Moving:
    """Whether the training moves again once a task is replaced: its step grew between two reads
    after :meth:`start` (after a restore from a checkpoint it starts below the step read before,
    which the old chief may have written)."""

    def __init__(self, read: Callable[[], int]) -> None:
        self.read: Callable[[], int] = read
        self.last: int | None = None

    def start(self) -> None:
        self.last = self.read()

    def __call__(self) -> bool:
        now = self.read()
        moved, self.last = self.last is not None and now > self.last, now
        return moved


@dataclass
class Recovery:
    """One fault and how the group came back, in seconds from the fault."""

    fault: str
    task: str
    node: str
    step: int
    checkpoint: int
    new_node: str = "?"
    marks: dict[str, float] = field(default_factory=dict)
    """not_ready (a stopped node; after a cut, the task's pod), evicted, released, running, moving."""

    def describe(self) -> str:
        seen = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.marks.items())
        return (f"{self.fault} of {self.node} holding {self.task} at step {self.step} (checkpoint {self.checkpoint}): "
                f"{seen}; now on {self.new_node}")


def _pod_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


class Faults:
    """The demo group's pods on the plane in ``directory`` and the faults aimed at their nodes.
    ``earlier``: run directories and pods of trainings before this one, left out."""

    def __init__(self, directory: Path, earlier_pods: set[str]) -> None:
        from kubernetes import client, config

        self.directory, self.env = directory, plane_env(directory)
        self.core = client.CoreV1Api(config.new_client_from_config(config_file=self.env["KUBECONFIG"]))
        self.runs = Path(self.env["AIRFLOW_TF_KUBE_STORAGE"]) / "runs"
        self.earlier_runs = {run.name for run in self.runs.glob("tf-*")}
        self.earlier_pods = set(earlier_pods)
        self.group: str | None = None
        self.dead: set[str] = set()
        """Pods of a faulted task: never its replacement."""
        self.stopped: set[str] = set()
        """Nodes stopped and not started again yet (:meth:`start_stopped`)."""
        self.cut: set[str] = set()
        """Nodes whose pod network is cut and not joined again yet (:meth:`start_stopped`)."""

    @staticmethod
    def pods_now(directory: Path) -> set[str]:
        """The names of the group pods on the plane now (another test's, were one still going)."""
        from kubernetes import client, config

        core = client.CoreV1Api(config.new_client_from_config(config_file=plane_env(directory)["KUBECONFIG"]))
        return {p.metadata.name for p in core.list_namespaced_pod(DEMO_NAMESPACE, label_selector=ROLE_LABEL).items}

    def progress(self) -> dict:
        return progress(self.runs, self.earlier_runs)

    def step(self) -> int:
        return int(self.progress().get("global_step") or 0)

    def pods(self) -> list:
        """This training's group pods (the first ps seen after the trigger names the group)."""
        if self.group is None:
            for pod in self.core.list_namespaced_pod(DEMO_NAMESPACE, label_selector=f"{ROLE_LABEL}=ps").items:
                if pod.metadata.name not in self.earlier_pods:
                    self.group = pod.metadata.labels[GROUP_LABEL]
            if self.group is None:
                return []
        return self.core.list_namespaced_pod(DEMO_NAMESPACE, label_selector=f"{GROUP_LABEL}={self.group}").items

    def layout(self) -> str:
        """Each pod of the group: task, node, phase, Ready or why not scheduled, deleting or not
        (for failure messages)."""
        def unscheduled(pod) -> str:
            why = [c.message for c in pod.status.conditions or [] if c.type == "PodScheduled" and c.status == "False"]
            return f" ({why[0]})" if why else ""
        return "; ".join(f"{p.metadata.name} on {p.spec.node_name}: {p.status.phase}"
                         + (" Ready" if _pod_ready(p) else "") + unscheduled(p)
                         + (" (deleting)" if p.metadata.deletion_timestamp else "") for p in self.pods())

    def running(self, role: str, index: int):
        """The task's pod with its container running, not being deleted, not one faulted."""
        for pod in self.pods():
            labels = pod.metadata.labels or {}
            statuses = pod.status.container_statuses or []
            at = labels.get(INDEX_LABEL) or (pod.metadata.annotations or {}).get(INDEX_LABEL) or "0"
            if (labels.get(ROLE_LABEL) == role and at == str(index)
                    and pod.metadata.name not in self.dead and not pod.metadata.deletion_timestamp
                    and statuses and statuses[0].state.running):
                return pod
        return None

    def alone_on_its_node(self) -> str | None:
        """A running task (``ps-0``, ``worker-1``) with no other running task of the group on its
        node, the ps first; None if there is none. Cut off from the pod network, its node's tasks
        cannot even resolve their peers' names: only a lone task is told from the others."""
        running = [p for p in self.pods() if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        by_node: dict[str, list] = {}
        for pod in running:
            by_node.setdefault(pod.spec.node_name, []).append(pod)
        alone = sorted((pods[0].metadata.labels or {}).get(ROLE_LABEL, "") + "-" + (
            (pods[0].metadata.labels or {}).get(INDEX_LABEL) or "0") for pods in by_node.values() if len(pods) == 1)
        return alone[0] if alone else None

    def trainer_roles(self) -> tuple[str, str]:
        """(the chief's task, a worker that is not the chief): the chief role's if the group has
        one, else worker-0 is the chief."""
        roles = {(p.metadata.labels or {}).get(ROLE_LABEL) for p in self.pods()}
        return ("chief-0", "worker-0") if "chief" in roles else ("worker-0", "worker-1")

    def ready(self, node: str) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in self.core.read_node(node).status.conditions or [])

    def usable(self, node: str) -> bool:
        """Ready, schedulable, and no longer tainted as lost: the next pods may go there."""
        spec = self.core.read_node(node).spec
        return (self.ready(node) and not spec.unschedulable
                and not any(t.key in (UNREACHABLE, NOT_READY) for t in spec.taints or []))

    def terminating_on(self, node: str) -> list[str]:
        """The group's pods on ``node`` being deleted and not gone (``Terminating``)."""
        return [p.metadata.name for p in self.pods() if p.spec.node_name == node and p.metadata.deletion_timestamp]

    def _pod(self, name: str):
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_namespaced_pod(name, DEMO_NAMESPACE)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def node(self, action: str, node: str) -> None:
        subprocess.run([sys.executable, str(KUBE_SCRIPT), "node", action, str(self.directory), node], check=True,
                       capture_output=True, timeout=180)

    def kubectl(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(["kubectl", "--kubeconfig", self.env["KUBECONFIG"], *args], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def fault(self, fault: str, task: str, after_checkpoint: int, timeout: float = RECOVERY_BOUND) -> Recovery:
        """Wait for ``task`` running and a checkpoint past ``after_checkpoint``, then stop or drain
        its node and time the recovery; the node is left stopped or cordoned (:meth:`restore`)."""
        role, index = task.rsplit("-", 1)
        pod = wait_for(lambda: self.running(role, int(index)), 300, f"{task} running ({self.layout()})", interval=1)
        checkpoint = wait_for(lambda: (lambda c: c if c > after_checkpoint else None)(
                              self.progress().get("checkpoint_step") or 0), 240,
                              f"a checkpoint past step {after_checkpoint} before the {fault} of {task}'s node", interval=1)
        node, at = pod.spec.node_name, self.step()
        recovery = Recovery(fault, task, node, at, checkpoint)
        self.dead.add(pod.metadata.name)
        started = time.monotonic()
        drain = None
        if fault == STOP:
            self.stopped.add(node)
            self.node("stop", node)
        elif fault == CUT:
            self.cut.add(node)
            self.node("cut", node)
        else:
            drain = self.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=180s")
        marks, moving = recovery.marks, Moving(self.step)
        while "moving" not in marks:
            seconds = time.monotonic() - started
            if seconds > timeout:
                raise AssertionError(f"{fault} of {node} ({task}, pod {pod.metadata.name}, step {at}): no recovery "
                                     f"within {timeout} s; seen {marks}, now step {self.step()}; pods: {self.layout()}")
            if fault == STOP and "not_ready" not in marks and not self.ready(node):
                marks["not_ready"] = seconds
            old = self._pod(pod.metadata.name)
            if fault == CUT and "not_ready" not in marks and (old is None or not _pod_ready(old)):
                marks["not_ready"] = seconds
            if "evicted" not in marks and (old is None or old.metadata.deletion_timestamp):
                marks["evicted"] = seconds
            if "released" not in marks and (old is None or old.status.phase in ("Failed", "Succeeded")):
                marks["released"] = seconds
            if "running" not in marks:
                new = self.running(role, int(index))
                if new is not None:
                    marks["running"], recovery.new_node = seconds, new.spec.node_name
                    moving.start()
            elif moving():
                marks["moving"] = seconds
            time.sleep(0.5)
        if drain is not None:
            out, _ = drain.communicate(timeout=240)
            assert drain.returncode == 0, f"kubectl drain {node}: {out}"
        return recovery

    def restore(self, recovery: Recovery) -> None:
        """Start the stopped node again, join the cut one, or uncordon the drained one; wait for it Ready."""
        if recovery.fault == STOP:
            self.node("start", recovery.node)
            self.stopped.discard(recovery.node)
        elif recovery.fault == CUT:
            self.node("join", recovery.node)
            self.cut.discard(recovery.node)
        else:
            uncordon = self.kubectl("uncordon", recovery.node)
            out, _ = uncordon.communicate(timeout=60)
            assert uncordon.returncode == 0, f"kubectl uncordon {recovery.node}: {out}"
        wait_for(lambda: self.usable(recovery.node), READY_BOUND,
                 f"node {recovery.node} Ready, schedulable and untainted again", interval=1)

    def start_stopped(self) -> None:
        """Start every node a failed test left stopped, and join every one it left cut, so that the
        next tests have all of them."""
        for node in sorted(self.stopped):
            self.node("start", node)
            self.stopped.discard(node)
        for node in sorted(self.cut):
            self.node("join", node)
            self.cut.discard(node)
