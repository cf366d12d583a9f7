"""A group and its nodes, offline: the tolerations that bound how long a pod stays on a lost node,
the spread over nodes, the PodDisruptionBudget that makes a drain wait, which pods stuck on a lost
node the backend force-deletes, and what the status says when a task moved to another node (from
pods shaped as the API server returned them on a three-node plane), and how a task cut off from
its group (its node's pod network cut) is moved off its node."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path

import kubernetes_validate
import pytest

from airflow_tf.backends import BackendOptionError
from airflow_tf.backends.kubernetes import KubernetesBackend
from airflow_tf.backends.kubernetes.jobs import render_group
from airflow_tf.backends.kubernetes.jobset import render_jobset
from airflow_tf.backends.kubernetes.labels import GROUP_LABEL, ROLE_LABEL
from airflow_tf.backends.kubernetes.manifests import PEERS_ANSWERED_CHECK
from airflow_tf.backends.kubernetes.nodes import (
    MOVED,
    MOVING,
    cut_nodes,
    cut_off_pods,
    force_deletion,
    job_patches,
    lost_pods,
    node_of,
)
from airflow_tf.backends.kubernetes.status import assess, next_wakeup
from airflow_tf.cluster import Phase

from .test_kubernetes_manifests import pods, spec

UNREACHABLE, NOT_READY = "node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"


def node_tolerations(pod: dict) -> dict[str, int | None]:
    return {t["key"]: t.get("tolerationSeconds") for t in pod["spec"].get("tolerations") or []
            if t.get("effect") == "NoExecute"}


def test_every_task_leaves_a_lost_node_after_30_s_not_kubernetes_300():
    for name, pod in pods(render_group(spec(chief=1), "ml")).items():
        assert node_tolerations(pod) == {UNREACHABLE: 30, NOT_READY: 30}, name
        assert all(t["operator"] == "Exists" for t in pod["spec"]["tolerations"]), name
    seconds = pods(render_group(spec(), "ml", unreachable_toleration_seconds=5))
    assert {name: node_tolerations(pod)[UNREACHABLE] for name, pod in seconds.items()} == {
        "tf-demo-worker": 5, "tf-demo-ps": 5}
    # None: the backend adds none, the API server's admission gives Kubernetes' 300 s.
    assert all("tolerations" not in pod["spec"] for pod in pods(render_group(spec(), "ml",
                                                                             unreachable_toleration_seconds=None)).values())


def test_a_roles_own_toleration_for_a_node_taint_wins_and_others_are_kept():
    own = [{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 600},
           {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    rendered = pods(render_group(spec(role_options={"ps": {"kubernetes": {"tolerations": own}}}), "ml"))
    assert node_tolerations(rendered["tf-demo-ps"]) == {UNREACHABLE: 600, NOT_READY: 30}
    assert {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"} in rendered["tf-demo-ps"]["spec"]["tolerations"]
    assert node_tolerations(rendered["tf-demo-worker"]) == {UNREACHABLE: 30, NOT_READY: 30}
    template = {"spec": {"tolerations": [{"key": NOT_READY, "operator": "Exists", "effect": "NoExecute"}]}}
    rendered = pods(render_group(spec(), "ml", pod_defaults={"pod_template": template}))
    assert node_tolerations(rendered["tf-demo-ps"]) == {NOT_READY: None, UNREACHABLE: 30}, "the pod template's too"


def anti_affinity(pod: dict) -> list[tuple[int, list[str]]]:
    """(weight, roles avoided) of each preferred anti-affinity term, checked to be of this group."""
    terms = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    out = []
    for term in terms:
        selector = term["podAffinityTerm"]["labelSelector"]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert selector["matchLabels"] == {GROUP_LABEL: "tf-demo"}
        [roles] = [e["values"] for e in selector["matchExpressions"] if e["key"] == ROLE_LABEL]
        out.append((term["weight"], roles))
    return out


def test_the_ps_prefer_nodes_without_trainers_and_workers_nodes_without_another_worker():
    rendered = pods(render_group(spec(chief=1), "ml"))
    assert anti_affinity(rendered["tf-demo-ps"]) == [(100, ["chief", "worker"])]
    assert anti_affinity(rendered["tf-demo-worker"]) == [(50, ["worker"])]
    assert "affinity" not in rendered["tf-demo-chief"]["spec"], "the ps avoid the chief (the scheduler weighs both ways)"
    # A preference only: never a required term, which would leave a group on too few nodes pending.
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in rendered["tf-demo-ps"]["spec"]["affinity"]["podAntiAffinity"]


def test_a_roles_affinity_replaces_the_spread_and_spread_over_nodes_false_turns_it_off():
    mine = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ps"]}]}]}}}
    rendered = pods(render_group(spec(role_options={"ps": {"kubernetes": {"affinity": mine}}}), "ml"))
    assert rendered["tf-demo-ps"]["spec"]["affinity"] == mine
    assert anti_affinity(rendered["tf-demo-worker"]) == [(50, ["worker"])]
    off = pods(render_group(spec(), "ml", spread_over_nodes=False))
    assert all("affinity" not in pod["spec"] for pod in off.values())


def test_a_disruption_budget_is_made_only_when_asked_and_lets_no_pod_of_the_group_be_evicted():
    assert "PodDisruptionBudget" not in [o["kind"] for o in render_group(spec(), "ml")]
    objects = render_group(spec(), "ml", disruption_budget=True)
    [budget] = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert objects[0]["kind"] == "Job", "the root first: the budget is owned by it (launch sets the reference)"
    assert budget["spec"] == {"maxUnavailable": 0, "selector": {"matchLabels": {GROUP_LABEL: "tf-demo"}}}
    assert (budget["metadata"]["name"], budget["metadata"]["namespace"]) == ("tf-demo", "ml")
    assert budget["metadata"]["labels"][GROUP_LABEL] == "tf-demo", "listed and torn down with the group"
    kubernetes_validate.validate(budget, "1.31.0", strict=True)
    for pod in pods(objects).values():
        assert pod["metadata"]["labels"][GROUP_LABEL] == "tf-demo", "every pod is under the budget's selector"
    [jobset_budget] = [o for o in render_jobset(spec(), "ml", disruption_budget=True) if o["kind"] == "PodDisruptionBudget"]
    assert jobset_budget["spec"] == budget["spec"]


def test_the_jobset_form_places_its_pods_the_same_way():
    [jobset] = [o for o in render_jobset(spec(), "ml") if o["kind"] == "JobSet"]
    templates = {r["name"]: r["template"]["spec"]["template"] for r in jobset["spec"]["replicatedJobs"]}
    assert node_tolerations(templates["ps"]) == {UNREACHABLE: 30, NOT_READY: 30}
    assert anti_affinity(templates["ps"]) == [(100, ["chief", "worker"])]


@pytest.mark.parametrize(("value", "expected"), [(-1, "a whole number of seconds >= 0, or null"),
                                                 (2.5, "a whole number of seconds >= 0, or null"),
                                                 ("30", "a whole number of seconds >= 0, or null")])
def test_a_bad_toleration_is_refused_naming_the_option(value, expected):
    with pytest.raises(BackendOptionError, match=f"unreachable_toleration_seconds: got {value!r}; expected {expected}"):
        KubernetesBackend(kubernetes_conn_id=None, unreachable_toleration_seconds=value)


def test_the_backend_renders_with_its_node_settings():
    backend = KubernetesBackend(kubernetes_conn_id=None, namespace="ml", unreachable_toleration_seconds=12,
                                spread_over_nodes=False, disruption_budget=True)
    objects = backend.render(spec())
    assert "PodDisruptionBudget" in [o["kind"] for o in objects]
    assert {node_tolerations(p)[UNREACHABLE] for p in pods(objects).values()} == {12}
    assert all("affinity" not in p["spec"] for p in pods(objects).values())


# A group (ps=1, workers=2) on a three-node plane whose node-1 was killed: its pods as the API
# server returned them (see the file's _about).
LOST = json.loads((Path(__file__).with_name("node_lost_pods.json")).read_text())


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(f"2026-11-29T{text}+00:00")


def tasks(pods: list[dict], now: dt.datetime) -> dict[str, tuple[Phase, str | None]]:
    status = assess("lose", copy.deepcopy(LOST["jobs"]), copy.deepcopy(pods), now)
    return {t.name: (t.phase, t.reason) for t in status.tasks}


def test_a_pod_evicted_from_a_lost_node_is_released_only_once_its_grace_period_is_long_over():
    evicted = [LOST["ps_evicted"], LOST["worker0_evicted"], LOST["worker1"]]
    # The ps's grace period (5 s) ended at 10:25:24, a worker's (30 s) at 10:25:49.
    assert lost_pods(evicted, at("10:25:30")) == []
    assert [p["metadata"]["name"] for p in lost_pods(evicted, at("10:25:34"))] == ["lose-ps-0-v7pdd"]
    assert [p["metadata"]["name"] for p in lost_pods(evicted, at("10:26:00"))] == ["lose-ps-0-v7pdd",
                                                                                  "lose-worker-0-4tbrw"]
    # Not a pod being deleted for another reason (a teardown), nor one already terminal.
    running = copy.deepcopy(LOST["worker1"])
    running["metadata"]["deletionTimestamp"] = "2026-11-29T10:25:00Z"
    assert lost_pods([running, LOST["ps_failed"]], at("10:30:00")) == []


def test_the_watch_wakes_when_a_release_falls_due_not_at_its_next_poll():
    # A lost node sends no event: the watch must wake by itself when a release is due.
    evicted = [LOST["ps_evicted"], LOST["worker0_evicted"], LOST["worker1"]]
    assert next_wakeup(evicted, at("10:25:20")) == at("10:25:34"), "the ps's: 10 s past its 5 s grace"
    assert next_wakeup(evicted, at("10:25:40")) == at("10:25:59"), "then the worker's: past its 30 s grace"
    assert next_wakeup([LOST["ps_failed"], LOST["worker1"]], at("10:25:40")) is None, "nothing left to release"


def test_the_release_marks_that_very_pod_failed_naming_its_node_then_deletes_it_at_once():
    release = force_deletion(LOST["ps_evicted"], "ml")
    uid = LOST["ps_evicted"]["metadata"]["uid"]
    assert release.status_patch["metadata"] == {"uid": uid}, "a newer pod of the name is spared"
    assert release.status_patch["status"]["phase"] == "Failed"
    assert "node node-1" in release.status_patch["status"]["message"]
    # The same body from the sync and the async client: no grace period, and only that very pod.
    assert release.delete_options == {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
    assert release.deleting == "force-delete pod lose-ps-0-v7pdd in namespace ml"


def test_the_status_says_a_task_waits_on_a_lost_node_then_where_it_runs_again_and_after_how_long():
    waiting = tasks([LOST["ps_evicted"], LOST["worker0_evicted"], LOST["worker1"]], at("10:25:30"))
    assert waiting["lose-ps-0"] == (Phase.RESTARTING, "ps-0 lost with node node-1: evicted 12 s ago, "
                                                      "waiting for its replacement")
    assert waiting["lose-worker-0"][0] is Phase.RESTARTING, "a trainer too"
    assert waiting["lose-worker-1"] == (Phase.RUNNING, None)
    pending = tasks([LOST["ps_failed"], LOST["ps_replacement"], LOST["worker0_evicted"],
                     LOST["worker0_replacement_pending"], LOST["worker1"]], at("10:26:36"))
    assert pending["lose-worker-0"] == (Phase.PENDING, "worker-0 lost with node node-1, replacement pending on node-3 "
                                                      "(ContainerCreating)")
    moved = tasks([LOST["ps_failed"], LOST["ps_replacement"], LOST["worker0_evicted"], LOST["worker0_replacement"],
                   LOST["worker1"]], at("10:26:40"))
    # From the eviction (10:25:18) to the new container running (10:26:27, 10:26:38).
    assert moved["lose-ps-0"] == (Phase.RUNNING, "ps-0 lost with node node-1, replaced on node-3 after 69 s")
    assert moved["lose-worker-0"] == (Phase.RUNNING, "worker-0 lost with node node-1, replaced on node-3 after 80 s")


def test_a_task_still_on_its_lost_node_is_not_called_replaced_there_by_an_older_attempts_eviction():
    # An earlier attempt of the ps had ended on node-1; the node's eviction marks it too, while the
    # attempt running now (created before) is not evicted yet: it is no replacement.
    older = copy.deepcopy(LOST["ps_failed"])
    older["metadata"].update(name="lose-ps-0-older", uid="older", creationTimestamp="2026-11-29T10:19:00Z")
    running = copy.deepcopy(LOST["ps_evicted"])
    for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
        running["metadata"].pop(key)
    running["status"]["conditions"] = [c for c in running["status"]["conditions"] if c["type"] != "DisruptionTarget"]
    phase, reason = tasks([older, running, LOST["worker0_evicted"], LOST["worker1"]], at("10:25:20"))["lose-ps-0"]
    assert phase is Phase.RUNNING
    assert "replaced on" not in (reason or ""), reason


# A group on node-2, drained with kubectl drain (see the file's _about).
DRAINED = json.loads((Path(__file__).with_name("node_drained_pods.json")).read_text())


def test_a_drained_task_says_it_was_evicted_then_where_it_runs_again_and_after_how_long():
    def drained(pods, now):
        status = assess("drain", copy.deepcopy(DRAINED["jobs"]), copy.deepcopy(pods), at(now))
        return {t.name: (t.phase, t.reason) for t in status.tasks}

    gap = drained([DRAINED["ps_evicted"], DRAINED["worker0"], DRAINED["worker1"]], "10:32:40")
    assert gap["drain-ps-0"] == (Phase.RESTARTING, "Evicted: pod drain-ps-0-hch69 evicted from node node-2 through "
                                                   "the Eviction API (a drain?) (exit code 137 (SIGKILL))")
    pending = drained([DRAINED["ps_evicted"], DRAINED["ps_replacement_pending"], DRAINED["worker0"],
                       DRAINED["worker1"]], "10:32:50")
    assert pending["drain-ps-0"] == (Phase.PENDING, "ps-0 evicted from node-2 (drain), replacement pending (waiting for "
                                                    "a node: 0/3 nodes are available: 1 node(s) were unschedulable, 2 "
                                                    "node(s) had untolerated taint(s). preemption: 0/3 nodes are "
                                                    "available: 3 Preemption is not helpful for scheduling.)")
    # From the eviction (10:32:27) to the new container running (10:33:17): node-2, the only node
    # left, was uncordoned at 10:33:13.
    moved = drained([DRAINED["ps_evicted"], DRAINED["ps_replacement"], DRAINED["worker0"], DRAINED["worker1"]],
                    "10:33:20")
    assert moved["drain-ps-0"] == (Phase.RUNNING, "ps-0 evicted from node-2 (drain), replaced on node-2 after 50 s")
    assert moved["drain-worker-0"] == (Phase.RUNNING, None), "the workers' old pods are not in this list"


# -- a task cut off from its group: its node's pod network cut while its kubelet stays Ready ------
def _probed(pod: dict, ready: bool, since: str) -> dict:
    """``pod`` (running since 10:20:02) with the peers' readiness probe, Ready or not since ``since``."""
    pod = copy.deepcopy(pod)
    pod["spec"]["containers"][0]["readinessProbe"] = {"exec": {"command": ["python", "-c", PEERS_ANSWERED_CHECK]}}
    for cond in pod["status"]["conditions"]:
        if cond["type"] in ("Ready", "ContainersReady"):
            cond.update(status="True" if ready else "False", lastTransitionTime=f"2026-11-29T{since}Z")
    return pod


def _running(pod: dict, name: str, node: str) -> dict:
    """A running pod of another task, shaped from ``pod``."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["name"], pod["spec"]["nodeName"] = name, node
    return pod


def test_a_task_whose_peers_stopped_answering_is_cut_off_while_the_others_reach_each_other():
    cut = _probed(LOST["worker1"], ready=False, since="10:30:00")
    other = _probed(_running(LOST["worker1"], "lose-worker-0-abcde", "node-2"), ready=True, since="10:21:00")
    assert cut_off_pods([cut, other], at("10:30:04")) == [], "one more question first"
    assert cut_off_pods([cut, other], at("10:30:05")) == [cut]
    assert next_wakeup([cut, other], at("10:30:01")) == at("10:30:05"), "the watch wakes for the verdict"
    # A peer Ready only since it turned not Ready (a trainer restarted meanwhile, Ready by reaching
    # this very task) proves nothing: its next question will likely find the peer.
    assert cut_off_pods([cut, _probed(other, ready=True, since="10:30:02")], at("10:31:00")) == []
    # Nobody Ready: the others cannot tell who is cut off.
    assert cut_off_pods([cut, _probed(other, ready=False, since="10:30:00")], at("10:31:00")) == []
    # Never Ready since its container started (10:20:02): its peers may not be up yet.
    assert cut_off_pods([_probed(LOST["worker1"], ready=False, since="10:19:57"), other], at("10:31:00")) == []
    # A pod of a node judged lost: the node lifecycle controller marks it not Ready, its kubelet
    # (gone) left its containers ready. That is the lost node's to handle, not a cut.
    lost = _probed(LOST["worker1"], ready=False, since="10:30:00")
    next(c for c in lost["status"]["conditions"] if c["type"] == "ContainersReady").update(status="True")
    assert cut_off_pods([lost, other], at("10:31:00")) == []
    # A readiness probe of the user's own says nothing of the group.
    own = copy.deepcopy(cut)
    own["spec"]["containers"][0]["readinessProbe"] = {"httpGet": {"path": "/ready", "port": 8080}}
    assert cut_off_pods([own, other], at("10:31:00")) == []


def _suspended(job: dict) -> dict:
    """``job`` as the Job controller leaves it once a suspension took its pods."""
    job = copy.deepcopy(job)
    job["spec"]["suspend"] = True
    job["status"] = {"active": 0, "conditions": [{"type": "Suspended", "status": "True"}]}
    return job


def test_a_cut_off_task_moves_off_its_node_its_job_suspended_then_resumed_without_the_node():
    cut = _probed(LOST["worker1"], ready=False, since="10:30:00")
    other = _probed(_running(LOST["ps_replacement"], "lose-ps-0-abcde", "node-2"), ready=True, since="10:21:00")
    jobs = copy.deepcopy(LOST["jobs"])
    [suspend] = job_patches(jobs, [cut, other], "ml", at("10:30:06"))
    assert (suspend.job, suspend.patch["spec"]) == ("lose-worker", {"suspend": True})
    note = json.loads(suspend.patch["metadata"]["annotations"][MOVING])
    assert note == {"task": "worker-1", "node": node_of(cut), "at": "2026-11-29T10:30:06Z"}
    assert "worker-1 cut off from its group on node" in suspend.done
    worker_job = next(j for j in jobs if j["metadata"]["name"] == "lose-worker")
    worker_job["metadata"].setdefault("annotations", {})[MOVING] = json.dumps(note)
    worker_job["spec"]["suspend"] = True
    assert job_patches(jobs, [cut, other], "ml", at("10:30:08")) == [], "one move at a time, and not before its pods are gone"
    # Suspended and its pods gone: resumed with the node excluded, whatever node affinity the role had.
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["train"]}]}]}}}
    jobs = [_suspended(worker_job) if j is worker_job else j for j in jobs]
    jobs[[j["metadata"]["name"] for j in jobs].index("lose-worker")]["spec"]["template"]["spec"]["affinity"] = own
    [resume] = job_patches(jobs, [other], "ml", at("10:30:20"))
    assert resume.patch["spec"]["suspend"] is False
    assert resume.patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["train"]},
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [node_of(cut)]}]}]}}
    annotations = resume.patch["metadata"]["annotations"]
    assert annotations[MOVING] is None and json.loads(annotations[MOVED]) == [note]
    # Resumed: the cut-off pod, from before the move and on its way out, starts no second move.
    resumed = copy.deepcopy(jobs)
    for job in resumed:
        if job["metadata"]["name"] == "lose-worker":
            job["spec"]["suspend"] = False
            job["metadata"]["annotations"] = {MOVED: annotations[MOVED]}
    assert job_patches(resumed, [cut, other], "ml", at("10:30:30")) == []


def test_a_task_started_on_a_node_its_group_was_cut_off_on_moves_too_if_it_never_turns_ready():
    """The ps moved off node-2 (cut); worker-1, restarted onto node-2 (the scheduler spreads onto
    the emptied node), never reaches its group. Elsewhere a pod never Ready is still starting."""
    jobs = copy.deepcopy(LOST["jobs"])
    ps_job = next(j for j in jobs if j["metadata"]["name"] == "lose-ps")
    ps_job["metadata"].setdefault("annotations", {})[MOVED] = json.dumps(
        [{"task": "ps-0", "node": "node-2", "at": "2026-11-29T10:19:00Z"}])
    assert cut_nodes(jobs) == {"node-2"}
    started = _probed(LOST["worker1"], ready=False, since="10:19:57")  # on node-2, running since 10:20:02
    other = _probed(_running(LOST["ps_replacement"], "lose-ps-0-abcde", "node-3"), ready=True, since="10:20:30")
    assert job_patches(jobs, [started, other], "ml", at("10:21:31")) == [], "its start gets 90 s"
    assert next_wakeup([started, other], at("10:21:00"), cut_nodes(jobs)) == at("10:21:32")
    [suspend] = job_patches(jobs, [started, other], "ml", at("10:21:32"))
    assert (suspend.job, suspend.patch["spec"]) == ("lose-worker", {"suspend": True})
    assert json.loads(suspend.patch["metadata"]["annotations"][MOVING])["node"] == "node-2"
    elsewhere = _running(started, started["metadata"]["name"], "node-1")
    assert job_patches(jobs, [elsewhere, other], "ml", at("10:40:00")) == []


def test_the_status_says_a_cut_off_task_is_moving_then_where_it_runs_again_and_after_how_long():
    jobs = copy.deepcopy(LOST["jobs"])
    worker_job = next(j for j in jobs if j["metadata"]["name"] == "lose-worker")
    note = {"task": "worker-1", "node": "node-2", "at": "2026-11-29T10:30:06Z"}
    worker_job["metadata"].setdefault("annotations", {})[MOVING] = json.dumps(note)
    moving = {t.name: (t.phase, t.reason) for t in assess("lose", jobs, [LOST["ps_replacement"]], at("10:30:16")).tasks}
    assert moving["lose-worker-1"] == (Phase.RESTARTING, "worker-1 cut off from its group on node node-2 (no other "
                                       "task answered its health question): Job lose-worker suspended 10 s ago, to "
                                       "start again on another node once its pods are gone")
    assert moving["lose-worker-0"][1].startswith("worker-0 stopped with worker-1, cut off from its group on node node-2")
    del worker_job["metadata"]["annotations"][MOVING]
    worker_job["metadata"]["annotations"][MOVED] = json.dumps([note])
    again = copy.deepcopy(LOST["worker1"])
    again["metadata"]["creationTimestamp"], again["spec"]["nodeName"] = "2026-11-29T10:30:20Z", "node-3"
    again["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": "2026-11-29T10:30:47Z"}}
    status = assess("lose", jobs, [LOST["ps_replacement"], again], at("10:31:00"))
    task = status.task("worker", 1)
    assert (task.phase, task.reason) == (Phase.RUNNING, "worker-1 cut off from its group on node node-2, replaced on "
                                                         "node-3 after 41 s")
    assert task.restarts == 1 and status.replacements() == [
        "lose-worker-1 restarted 1 time(s), last: worker-1 cut off from its group on node node-2, replaced on node-3 "
        "after 41 s"]
