"""The JobSet workload form (``workload="jobset"``), offline: the JobSet validated against the
JobSet v0.11.1 CRD's schema (``schemas/``, vendored from the Go module) and its Jobs against the
Kubernetes schemas of every supported version; the same pods and TF_CONFIG as the Jobs form
(but for the host names the controllers give); the success, failure and startup policies; the
queue; the refusal of a queue with the Jobs form, at render, launch and DAG parse time; and the
status read from a JobSet, the Jobs its controller made and its Kueue Workload (the pure read;
test_kubernetes_kueue.py runs them on the plane with the real JobSet controller and Kueue)."""

from __future__ import annotations

import copy
import datetime as dt
import functools
import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from airflow_tf.backends import BackendError, backend_for, get_backend
from airflow_tf.backends.wait import waiting_message
from airflow_tf.backends.kubernetes.jobs import render_group
from airflow_tf.backends.kubernetes.jobset import JobSetGroup, queue_reason, render_jobset
from airflow_tf.backends.kubernetes.manifests import USER_ERROR_EXIT_CODES
from airflow_tf.backends.kubernetes.status import assess
from airflow_tf.backends.kubernetes.render import render_workload
from airflow_tf.backends.kubernetes.workloads import check_launch_options
from airflow_tf.cli import main
from airflow_tf.cluster import GroupSpec, OutcomeCode, Phase, SpecError, TrainingConfig, group_name, group_outcome

from .test_kubernetes_manifests import SUPPORTED_VERSIONS

CRD = Path(__file__).with_name("schemas") / "jobset.x-k8s.io_jobsets-v0.11.1.yaml"
ROLE_FILE = Path(__file__).resolve().parents[2] / "airflow_tf" / "rbac" / "role.yaml"
QUEUE_REFUSED = (r"queue_name: 'team-a' needs workload='jobset': with workload='jobs' every role is a Job of its own, "
                 r"and Kueue admits each Job as its own Workload, so a group would be admitted role by role")


def training(**kw):
    return TrainingConfig(dataset="/data/ds/1", run_dir="/runs/r", steps=100, **kw)


def spec(name="tf-demo", mode=None, **kw) -> GroupSpec:
    options = dict(ps=2, workers=3, image="registry.example/tf:2.21")
    options.update(kw)
    return GroupSpec.for_training(name, training(**({"mode": mode} if mode else {})), **options)


def the_jobset(objects) -> dict:
    return next(o for o in objects if o["kind"] == "JobSet")


def replicated(jobset) -> dict[str, dict]:
    return {r["name"]: r for r in jobset["spec"]["replicatedJobs"]}


def tf_config(pod) -> dict:
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    return json.loads(env["TF_CONFIG"])


def _strict(schema):
    """The CRD's schema with unknown fields refused where the API server would silently prune
    them (an object with properties and no preserve-unknown-fields), so a misspelt key fails."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def crd_validator() -> jsonschema.Draft4Validator:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2")
    assert version["served"] and version["storage"]
    # OpenAPI 3.0's schema keywords are JSON Schema draft 4's (exclusiveMinimum is a boolean there).
    return jsonschema.Draft4Validator(_strict(version["schema"]["openAPIV3Schema"]))


def validate_jobset(jobset: dict) -> None:
    """The JobSet against the CRD, and each replicated job's Job against every supported
    Kubernetes version (the CRD leaves the templates' metadata unchecked; the API server checks
    the Jobs when the JobSet controller creates them)."""
    crd_validator().validate(jobset)
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    for rjob in jobset["spec"]["replicatedJobs"]:
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {**rjob["template"]["metadata"], "name": f"{jobset['metadata']['name']}-{rjob['name']}-0"},
               "spec": rjob["template"]["spec"]}
        for version in SUPPORTED_VERSIONS:
            kubernetes_validate.validate(job, version, strict=True)


# -- the manifest ----------------------------------------------------------------------------------------
def test_the_jobset_validates_against_the_jobset_crd_and_its_jobs_against_every_kubernetes_version(tmp_path):
    objects = render_jobset(spec(chief=1, role_options={"worker": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}}),
                            "ml", network_policy=True, cluster_domain="cluster.local", pod_defaults={
                                "queue_name": "team-a", "volumes": [{"claim": "tf-runs", "mount_path": "/runs"}],
                                "sidecars": [{"name": "log-shipper", "image": "fluent/fluent-bit:3.0"}]})
    assert [o["kind"] for o in objects] == ["JobSet", "NetworkPolicy"], "the JobSet first; no Job, no Service of ours"
    validate_jobset(objects[0])
    for version in SUPPORTED_VERSIONS:
        kubernetes_validate.validate(objects[1], version, strict=True)
    assert [r["name"] for r in objects[0]["spec"]["replicatedJobs"]] == ["ps", "worker", "chief"]
    assert {r["replicas"] for r in objects[0]["spec"]["replicatedJobs"]} == {1}


def test_a_schema_violation_is_caught_by_the_crd_validation():
    # The validation must be able to fail: a misspelt key, a value outside an enum, a missing field.
    for break_it in (lambda js: js["spec"].update(startupPolicy={"startupPolicyOrdre": "InOrder"}),
                     lambda js: js["spec"]["successPolicy"].update(operator="Most"),
                     lambda js: js["spec"]["replicatedJobs"][0].pop("template"),
                     lambda js: js["spec"]["failurePolicy"]["rules"][0].update(action="Retry")):
        jobset = the_jobset(render_jobset(spec(), "ml"))
        break_it(jobset)
        with pytest.raises(jsonschema.ValidationError):
            crd_validator().validate(jobset)


def test_render_prints_the_jobset_with_the_workload_flag(capsys):
    code = main(["render", "--name", "demo", "--ps", "1", "--workers", "2", "--image", "tf:2.21", "--namespace", "ml",
                 "--workload", "jobset", "--queue-name", "team-a", "--network-policy", "--runs-claim", "tf-runs",
                 "--workload-priority-class", "urgent"])
    out, err = capsys.readouterr()
    assert code == 0, err
    documents = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in documents] == ["JobSet", "NetworkPolicy"]
    validate_jobset(documents[0])
    assert documents[0]["spec"]["suspend"] is True
    assert documents[0]["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "urgent"


# -- the same group as the Jobs form ---------------------------------------------------------------------
@pytest.mark.parametrize("cluster_domain", [None, "cluster.local"])
def test_tf_config_is_the_jobs_forms_but_for_the_job_index_in_each_host(cluster_domain):
    """Same roles, task counts, order, service (subdomain), namespace, domain and port; each host is
    the pod's as the controllers name it: the Job controller's ``<job>-<index>``, the Job being the
    JobSet controller's ``<jobset>-<replicated job>-<job index>``, under ``network.subdomain``."""
    group = spec(chief=1)
    by_jobs = {o["metadata"]["name"]: o for o in render_group(group, "ml", cluster_domain=cluster_domain)}
    jobset = the_jobset(render_jobset(group, "ml", cluster_domain=cluster_domain))
    subdomain = jobset["spec"]["network"]["subdomain"]
    assert subdomain == by_jobs["tf-demo"]["metadata"]["name"], "the Jobs form's headless Service's name"
    assert jobset["spec"]["network"] == {"enableDNSHostnames": True, "subdomain": subdomain,
                                         "publishNotReadyAddresses": True}
    suffix = ".ml.svc" + (f".{cluster_domain}" if cluster_domain else "")
    for role, rjob in replicated(jobset).items():
        ours = tf_config(rjob["template"]["spec"]["template"])
        theirs = tf_config(by_jobs[f"tf-demo-{role}"]["spec"]["template"])
        assert ours["task"] == theirs["task"] == {"type": role}
        assert list(ours["cluster"]) == list(theirs["cluster"]) == ["chief", "ps", "worker"]
        for name, addresses in ours["cluster"].items():
            job = f"{jobset['metadata']['name']}-{name}-0"  # the JobSet controller's Job name
            assert addresses == [f"{job}-{i}.{subdomain}{suffix}:2222" for i in range(len(addresses))]
            assert [re.sub(rf"^tf-demo-{name}-0-", f"tf-demo-{name}-", a) for a in addresses] == theirs["cluster"][name]


def test_each_replicated_job_is_the_jobs_forms_job_without_what_the_jobset_holds():
    """Pods, restarts, failure rules, deadlines: the Jobs form's Job; the JobSet holds the name,
    the suspension, the queue label and the TTL. The peers' readiness question is the Jobs form's
    only: a JobSet's startupPolicy waits for the ps to be Ready before it creates the trainers."""
    group = spec(chief=1, success_policy="ChiefOrWorker0", active_deadline_seconds=900)
    jobs = {o["metadata"]["name"]: o for o in render_group(group, "ml") if o["kind"] == "Job"}
    for role, rjob in replicated(the_jobset(render_jobset(group, "ml"))).items():
        job = copy.deepcopy(jobs[f"tf-demo-{role}"])
        job["spec"].pop("suspend")
        job["spec"].pop("ttlSecondsAfterFinished", None)
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert "/tmp/airflow-tf-peers-answered" in str(container.pop("readinessProbe"))
        for probe in ("livenessProbe", "startupProbe"):
            assert container[probe]["exec"]["command"][-2] == "--peers-answered"
            container[probe]["exec"]["command"] = container[probe]["exec"]["command"][:-2]
        ours = copy.deepcopy(rjob["template"])
        for pod in (ours["spec"]["template"], job["spec"]["template"]):
            pod["spec"]["containers"][0]["env"] = [e for e in pod["spec"]["containers"][0]["env"] if e["name"] != "TF_CONFIG"]
        assert ours == {"metadata": {"labels": job["metadata"]["labels"], "annotations": job["metadata"]["annotations"]},
                        "spec": job["spec"]}
        assert "ttlSecondsAfterFinished" not in rjob["template"]["spec"], "a child Job's TTL would have it recreated"


def test_ttl_is_the_jobsets_and_the_ps_keep_their_deadline():
    jobset = the_jobset(render_jobset(spec(), "ml", ps_max_lifetime_seconds=7200))
    assert jobset["spec"]["ttlSecondsAfterFinished"] == 3600
    assert replicated(jobset)["ps"]["template"]["spec"]["activeDeadlineSeconds"] == 7200
    assert "activeDeadlineSeconds" not in replicated(jobset)["worker"]["template"]["spec"]
    assert "ttlSecondsAfterFinished" not in the_jobset(render_jobset(spec(), "ml", ttl_seconds_after_finished=None))["spec"]
    assert the_jobset(render_jobset(spec(), "ml", ttl_seconds_after_finished=0))["spec"]["ttlSecondsAfterFinished"] == 0


# -- policies ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options, targets, lead", [
    ({}, ["worker"], None),
    ({"chief": 1}, ["worker", "chief"], None),
    ({"success_policy": "ChiefOrWorker0"}, ["worker"], "worker"),
    ({"chief": 1, "success_policy": "ChiefOrWorker0"}, ["chief"], "chief"),
    ({"mode": "coordinator"}, ["chief"], "chief"),
])
def test_success_policy_is_todays_on_the_trainers(options, targets, lead):
    """AllWorkers: every worker's (and the chief's) Job; ChiefOrWorker0: the lead trainer's Job,
    which completes when its index 0 succeeds. Parameter servers are never waited for (and
    coordinator-mode workers, which serve until stopped, neither)."""
    jobset = the_jobset(render_jobset(spec(**options), "ml"))
    validate_jobset(jobset)
    assert jobset["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": targets}
    for role, rjob in replicated(jobset).items():
        rules = rjob["template"]["spec"].get("successPolicy")
        assert rules == ({"rules": [{"succeededIndexes": "0", "succeededCount": 1}]} if role == lead else None)


def test_failure_policy_keeps_todays_meaning_per_restart_policy():
    """The Job controller restarts a task within its budget (a killed ps comes back), fails its
    Job at once on a program error under ExitCode, and ignores disruptions; the JobSet then fails
    as a whole on its first failed Job, never recreating the group."""
    group = spec(chief=1, backoff_limit=4, role_options={"chief": {"restart_policy": "Never"}})
    jobset = the_jobset(render_jobset(group, "ml"))
    validate_jobset(jobset)
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 0, "rules": [
        {"name": "FailGroupOnFailedJob", "action": "FailJobSet"}]}
    jobs = {role: rjob["template"]["spec"] for role, rjob in replicated(jobset).items()}
    disruption = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    # ps (OnFailure): any exit, a kill (137) included, is restarted up to backoff_limit times.
    assert jobs["ps"]["backoffLimitPerIndex"] == 4 and jobs["ps"]["podFailurePolicy"]["rules"] == [disruption]
    # worker (ExitCode): a program error (exit 1-128) fails the Job, so the group, at once.
    assert jobs["worker"]["backoffLimitPerIndex"] == 4
    assert jobs["worker"]["podFailurePolicy"]["rules"] == [disruption, {"action": "FailJob", "onExitCodes": {
        "containerName": "worker", "operator": "In", "values": USER_ERROR_EXIT_CODES}}]
    # chief (Never): no restart at all.
    assert jobs["chief"]["backoffLimitPerIndex"] == 0 and jobs["chief"]["podFailurePolicy"]["rules"] == [disruption]
    assert {job["maxFailedIndexes"] for job in jobs.values()} == {0}, "one task out of restarts fails its Job"


def test_startup_policy_starts_the_parameter_servers_first():
    jobset = the_jobset(render_jobset(spec(chief=1), "ml"))
    assert jobset["spec"]["startupPolicy"] == {"startupPolicyOrder": "InOrder"}
    assert [r["name"] for r in jobset["spec"]["replicatedJobs"]] == ["ps", "worker", "chief"]
    assert not any("dependsOn" in r for r in jobset["spec"]["replicatedJobs"]), \
        "the CRD refuses dependsOn beside startupPolicy InOrder (a CEL rule the offline check cannot run)"


# -- the queue ----------------------------------------------------------------------------------------------------
def test_a_queued_group_is_one_suspended_jobset_carrying_the_queue_label():
    jobset = the_jobset(render_jobset(spec(), "ml", pod_defaults={"queue_name": "team-a"}))
    validate_jobset(jobset)
    assert jobset["spec"]["suspend"] is True
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    for rjob in jobset["spec"]["replicatedJobs"]:
        template = rjob["template"]
        assert "kueue.x-k8s.io/queue-name" not in template["metadata"]["labels"], "Kueue admits the JobSet, not its Jobs"
        assert "kueue.x-k8s.io/queue-name" not in template["spec"]["template"]["metadata"]["labels"]
        assert "suspend" not in template["spec"], "the JobSet controller suspends and resumes its Jobs"
    unqueued = the_jobset(render_jobset(spec(), "ml"))
    assert unqueued["spec"]["suspend"] is False and "kueue.x-k8s.io/queue-name" not in unqueued["metadata"]["labels"]


def test_a_workload_priority_class_labels_the_queued_jobset_and_needs_a_queue_and_the_jobset_form():
    queued = {"queue_name": "team-a", "workload_priority_class": "urgent"}
    jobset = the_jobset(render_jobset(spec(), "ml", pod_defaults=queued))
    validate_jobset(jobset)
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "urgent"
    assert all("kueue.x-k8s.io/priority-class" not in r["template"]["spec"]["template"]["metadata"]["labels"]
               for r in jobset["spec"]["replicatedJobs"]), "Kueue reads it from the JobSet"
    with pytest.raises(SpecError, match=r"workload_priority_class: 'urgent' needs queue_name: Kueue orders and "
                                        r"preempts only the groups of its queues"):
        render_jobset(spec(), "ml", pod_defaults={"workload_priority_class": "urgent"})
    with pytest.raises(SpecError, match=r"workload_priority_class: a JobSet is admitted as one Kueue Workload, so "
                                        r"every role must name the same WorkloadPriorityClass"):
        render_jobset(spec(role_options={"ps": {"kubernetes": {"workload_priority_class": "low"}}}), "ml",
                      pod_defaults=queued)
    with pytest.raises(SpecError, match=r"workload_priority_class: 'urgent' needs workload='jobset' and a queue_name"):
        render_group(spec(), "ml", pod_defaults={"workload_priority_class": "urgent"})
    with pytest.raises(SpecError, match=r"workload_priority_class: 'Not A Name' is not a valid WorkloadPriorityClass name"):
        render_jobset(spec(), "ml", pod_defaults={**queued, "workload_priority_class": "Not A Name"})


def kueue_pod_sets(jobset) -> dict[str, int]:
    """The pod sets of the ONE Workload Kueue makes for a JobSet (its jobset integration, v0.17):
    one per replicated job, counting replicas x min(parallelism, completions) pods."""
    return {r["name"]: r["replicas"] * min(r["template"]["spec"]["parallelism"], r["template"]["spec"]["completions"])
            for r in jobset["spec"]["replicatedJobs"]}


def test_kueue_sees_one_workload_with_a_pod_set_per_role_counting_every_task():
    jobset = the_jobset(render_jobset(spec(chief=1), "ml", pod_defaults={"queue_name": "team-a"}))
    assert kueue_pod_sets(jobset) == {"ps": 2, "worker": 3, "chief": 1}
    assert len(kueue_pod_sets(jobset)) <= 8, "a Kueue Workload holds at most 8 pod sets"


def test_one_jobset_takes_one_queue():
    with pytest.raises(SpecError, match=r"queue_name: a JobSet is admitted as one Kueue Workload, so every role must "
                                        r"name the same queue .*ps: None, worker: 'team-b'"):
        render_jobset(spec(role_options={"worker": {"kubernetes": {"queue_name": "team-b"}}}), "ml")
    jobset = the_jobset(render_jobset(spec(role_options={"ps": {"kubernetes": {"queue_name": "team-b"}}}), "ml",
                                      pod_defaults={"queue_name": "team-b"}))
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-b"


def test_a_queue_with_the_jobs_form_is_refused_at_render_saying_why_and_naming_jobset(capsys):
    with pytest.raises(SpecError, match=QUEUE_REFUSED) as refused:
        render_group(spec(), "ml", pod_defaults={"queue_name": "team-a"})
    message = str(refused.value)
    for words in ("parameter servers holding quota and never exiting while their workers wait",
                  "a JobSet is one Workload, admitted whole or not at all",
                  "backend_options={'workload': 'jobset'}", "airflow-tf render --workload jobset"):
        assert words in message
    with pytest.raises(SpecError, match=QUEUE_REFUSED):  # one role's queue is enough
        render_group(spec(role_options={"ps": {"kubernetes": {"queue_name": "team-a"}}}), "ml")

    code = main(["render", "--name", "demo", "--image", "tf:2.21", "--queue-name", "team-a"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", "no manifest is printed"
    assert "--queue-name: 'team-a' needs --workload jobset: with --workload jobs every role is a Job of its own" in err, \
        "the command line names its own flags"


def test_a_queue_with_the_jobs_form_is_refused_at_launch_before_any_api_call():
    backend = get_backend("kubernetes", kubernetes_conn_id=None, namespace="ml", pod_defaults={"queue_name": "team-a"})
    with pytest.raises(BackendError, match=QUEUE_REFUSED):
        backend.launch(spec())
    assert "hook" not in vars(backend), "refused before connecting to anything"


def test_a_queue_or_a_kueue_priority_with_the_jobs_form_is_refused_at_dag_parse_time():
    from airflow_tf.operators import LaunchTFClusterOperator

    def launch(**kw):
        return LaunchTFClusterOperator(task_id="launch", dataset="/data/ds/1", backend="kubernetes", **kw)

    with pytest.raises(SpecError, match=QUEUE_REFUSED):
        launch(backend_options={"pod_defaults": {"queue_name": "team-a"}})
    with pytest.raises(SpecError, match=QUEUE_REFUSED):
        launch(backend_options={"workload": "jobs"}, role_options={"worker": {"kubernetes": {"queue_name": "team-a"}}})
    # A Kueue priority: only for a queued JobSet, wherever it is set.
    with pytest.raises(SpecError, match=r"^workload_priority_class: 'urgent' needs workload='jobset' and a queue_name"):
        launch(backend_options={"pod_defaults": {"workload_priority_class": "urgent"}})
    with pytest.raises(SpecError, match=r"^workload_priority_class: 'urgent' needs queue_name: Kueue orders"):
        launch(backend_options={"workload": "jobset"},
               role_options={"ps": {"kubernetes": {"workload_priority_class": "urgent"}}})
    launch(backend_options={"workload": "jobset", "pod_defaults": {"queue_name": "team-a"}},
           role_options={"ps": {"kubernetes": {"workload_priority_class": "urgent"}}})
    with pytest.raises(SpecError, match=r"backend_options.workload: 'jobsets' is not a workload form; the forms are: "
                                        r"'jobs' \(one Indexed Job per role \(default\)\); 'jobset' \("):
        launch(backend_options={"workload": "jobsets"})
    # Accepted: the JobSet form; values only known when the task runs (checked again at launch);
    # a queue on another backend's options is not this check's business.
    launch(backend_options={"workload": "jobset", "pod_defaults": {"queue_name": "team-a"}})
    launch(backend_options={"pod_defaults": {"queue_name": "{{ var.value.queue }}"}})
    launch(backend_options={"workload": "{{ var.value.workload }}", "pod_defaults": {"queue_name": "team-a"}})
    LaunchTFClusterOperator(task_id="local", dataset="/data/ds/1", backend_options={"workload": "anything"})


# -- the option ----------------------------------------------------------------------------------------------------
def test_the_workload_option_is_validated_naming_the_argument_and_the_forms(capsys):
    with pytest.raises(BackendError, match=r"^backend_options: workload: got 'JobSet'; expected a workload form, one of "
                                           r"'jobs' \(one Indexed Job per role \(default\)\); 'jobset' \(the group as "
                                           r"one JobSet"):
        get_backend("kubernetes", kubernetes_conn_id=None, namespace="ml", workload="JobSet")
    with pytest.raises(SpecError, match=r"^backend_options.workload: None is not a workload form"):
        check_launch_options({"workload": None})
    with pytest.raises(SpecError, match="workload: 'pods' is not a workload form"):
        render_workload("pods", spec(), "ml")
    with pytest.raises(SystemExit):
        main(["render", "--name", "demo", "--image", "tf:2.21", "--workload", "pods"])
    assert "argument --workload: invalid choice: 'pods' (choose from 'jobs', 'jobset')" in capsys.readouterr().err


def test_the_backend_renders_its_workload_and_its_reference_keeps_it():
    jobset = get_backend("kubernetes", kubernetes_conn_id=None, namespace="ml", workload="jobset")
    assert [o["kind"] for o in jobset.render(spec())] == ["JobSet", "NetworkPolicy"], "a NetworkPolicy by default"
    jobs = get_backend("kubernetes", kubernetes_conn_id=None, namespace="ml")
    assert jobs.workload == "jobs" and [o["kind"] for o in jobs.render(spec())] == ["Job", "Service", "NetworkPolicy",
                                                                                     "Job"]
    open_group = get_backend("kubernetes", kubernetes_conn_id=None, namespace="ml", network_policy=False)
    assert [o["kind"] for o in open_group.render(spec())] == ["Job", "Service", "Job"]
    ref = jobset._ref("tf-demo", "AllWorkers")
    assert ref.options["workload"] == "jobset" and backend_for(ref).workload == "jobset"


def test_a_cluster_without_the_jobset_crd_is_named_in_the_launchs_error(monkeypatch):
    from kubernetes.client.exceptions import ApiException

    class NoJobSetResource:
        def list_namespaced_custom_object(self, *args, **kwargs):
            raise ApiException(status=404, reason="Not Found")

    monkeypatch.setattr(JobSetGroup, "_custom", property(lambda self: NoJobSetResource()))
    backend = get_backend("kubernetes", kubernetes_conn_id=None, namespace="ml", workload="jobset")
    with pytest.raises(BackendError, match=r"list jobsets of group tf-demo in namespace ml: HTTP 404 Not Found .*; or "
                                           r"the JobSet CRD \(jobset.x-k8s.io/v1alpha2\) is not installed in this "
                                           r"cluster: install the JobSet controller \(v0.11\), or launch with "
                                           r"workload='jobs'"):
        backend.launch(spec())


def test_names_too_long_for_the_jobset_webhook_are_refused_naming_the_limit():
    """The JobSet webhook checks that the longest pod name, ``<jobset>-<job>-0-<index>-xxxxx``, is a
    DNS-1035 label; the render says so first, with the longest group name that fits."""
    auto = group_name("a_rather_long_dag_id_for_the_example", "train_the_model", "manual__2026-01-01")
    validate_jobset(the_jobset(render_jobset(spec(name=auto, workers=99), "ml")))
    with pytest.raises(SpecError, match=r"name: with workload='jobset' the worker pods are named like "
                                        r"'a{46}-worker-0-99-abcde' \(64 characters\).*at most 45 characters"):
        render_jobset(spec(name="a" * 46, workers=100), "ml")
    with pytest.raises(SpecError, match=r"starting with a letter.*that starts with a letter"):
        render_jobset(spec(name="1demo"), "ml")


# -- RBAC ------------------------------------------------------------------------------------------------------------
def test_the_role_grants_create_list_delete_on_jobsets_and_list_on_workloads_each_explained():
    role = yaml.safe_load(ROLE_FILE.read_text())
    jobset_rules = [r for r in role["rules"] if "jobset.x-k8s.io" in r["apiGroups"]]
    assert jobset_rules == [{"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"],
                             "verbs": ["create", "list", "delete"]}]
    header = ROLE_FILE.read_text().split("apiVersion:")[0]
    explained = re.search(r"#   jobsets +(.*?)(?=\n#   \w|\napiVersion|\Z)", header + "\napiVersion", re.S)
    assert explained, "role.yaml's header explains the jobsets rule"
    for verb in ("create", "list", "delete"):
        assert f"{verb} (" in explained.group(1), f"{verb} on jobsets is not explained"
    workloads = [r for r in role["rules"] if "kueue.x-k8s.io" in r["apiGroups"]]
    assert workloads == [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list"]}]
    assert re.search(r"#   workloads +list \(kueue\.x-k8s\.io\): only with a Kueue queue_name", header)


# -- status of a JobSet's group (the pure read) ------------------------------------------------------------
NOW = dt.datetime(2026, 11, 26, 10, 0, tzinfo=dt.UTC)


def child_job(jobset: dict, role: str, *, suspend: bool = False, conditions=(), **status) -> dict:
    """A Job as the JobSet controller makes it from the replicated job ``role``."""
    template = replicated(jobset)[role]["template"]
    return {"metadata": {"name": f"{jobset['metadata']['name']}-{role}-0", "labels": dict(template["metadata"]["labels"]),
                         "annotations": dict(template["metadata"]["annotations"])},
            "spec": {**template["spec"], "suspend": suspend},
            "status": {**status, "conditions": [{"type": t, "status": "True", "reason": r, "message": m}
                                                for t, r, m in conditions]}}


def task_pod(role: str, index: int, phase: str = "Running", **state) -> dict:
    return {"metadata": {"name": f"tf-demo-{role}-0-{index}-abcde", "creationTimestamp": "2026-11-26T09:59:00Z",
                         "labels": {"airflow-tf/group": "tf-demo", "airflow-tf/role": role,
                                    "batch.kubernetes.io/job-completion-index": str(index)}},
            "status": {"phase": phase, **({"containerStatuses": [{"name": role, "state": state}]} if state else {})}}


def with_conditions(jobset: dict, *conditions) -> dict:
    return {**jobset, "status": {"conditions": [{"type": t, "status": "True", "reason": r, "message": m}
                                                for t, r, m in conditions]}}


def test_a_queued_jobset_without_jobs_yet_is_a_group_waiting_for_its_queue():
    jobset = the_jobset(render_jobset(spec(), "ml", pod_defaults={"queue_name": "team-a"}))
    status = assess("tf-demo", [], [], NOW, jobset=jobset)
    assert status.exists and status.failure is None
    assert [(t.name, t.phase) for t in status.tasks] == [
        ("tf-demo-ps-0-0", Phase.PENDING), ("tf-demo-ps-0-1", Phase.PENDING), ("tf-demo-worker-0-0", Phase.PENDING),
        ("tf-demo-worker-0-1", Phase.PENDING), ("tf-demo-worker-0-2", Phase.PENDING)]
    assert {t.reason for t in status.tasks} == {
        "JobSet tf-demo is suspended: waiting for the queue team-a to admit the whole group"}
    assert not group_outcome(status).done
    # Its Jobs, made suspended by the JobSet controller (or suspended again when Kueue evicts the
    # group), carry no queue label: the JobSet's wait is theirs.
    status = assess("tf-demo", [child_job(jobset, "ps", suspend=True), child_job(jobset, "worker", suspend=True)], [],
                    NOW, jobset=jobset)
    assert status.task("worker", 2).reason == (
        "JobSet tf-demo is suspended: waiting for the queue team-a to admit the whole group")


def workload(*conditions) -> dict:
    """Kueue's Workload of a JobSet, with ``(type, status, reason, message)`` conditions."""
    return {"metadata": {"name": "jobset-tf-demo-1a2b3"}, "status": {"conditions": [
        {"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]}}


def test_a_queued_group_says_why_kueue_holds_it_from_its_workloads_condition():
    jobset = the_jobset(render_jobset(spec(), "ml", pod_defaults={"queue_name": "team-a"}))
    quota = ("couldn't assign flavors to pod set ps: insufficient unused quota for cpu in flavor default, "
             "2 more needed")
    reason = queue_reason([workload(("QuotaReserved", "False", "Pending", quota))])
    assert reason == quota
    status = assess("tf-demo", [], [], NOW, jobset=jobset, queue_reason=reason)
    assert {t.reason for t in status.tasks} == {
        f"JobSet tf-demo is suspended: waiting for the queue team-a to admit the whole group ({quota})"}
    # Preempted by a higher-priority group: evicted, the whole group suspended again.
    evicted = queue_reason([workload(("QuotaReserved", "False", "Pending", "waiting"),
                                     ("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: 1)"))])
    # The sensor's and trigger's log line says it too.
    assert waiting_message(status, "AllWorkers") == (
        "workers done 0/3; no training progress yet; waiting: JobSet tf-demo is suspended: waiting for the queue "
        f"team-a to admit the whole group ({quota})")
    assert evicted == "evicted by Kueue (Preempted): Preempted to accommodate a workload (UID: 1)"
    assert queue_reason([]).startswith("Kueue has made no Workload for it yet")
    assert queue_reason([workload(("QuotaReserved", "True", "QuotaReserved", "ok"))]) is None


def test_in_order_the_workers_wait_for_the_jobset_controller_not_a_failure():
    jobset = the_jobset(render_jobset(spec(), "ml"))
    status = assess("tf-demo", [child_job(jobset, "ps", active=2)], [task_pod("ps", 0), task_pod("ps", 1)], NOW,
                    jobset=jobset)
    assert status.failure is None and status.task("ps", 1).phase is Phase.RUNNING
    assert status.task("worker", 0).phase is Phase.PENDING
    assert status.task("worker", 0).reason == ("waiting for the JobSet controller to create Job tf-demo-worker-0 "
                                               "(startupPolicy InOrder: once every pod of the roles before it is ready)")
    # Admitted by Kueue, the JobSet controller makes the workers' Job suspended and starts it in turn.
    queued = the_jobset(render_jobset(spec(), "ml", pod_defaults={"queue_name": "team-a"}))
    queued["spec"]["suspend"] = False
    status = assess("tf-demo", [child_job(queued, "ps", active=2), child_job(queued, "worker", suspend=True)],
                    [task_pod("ps", 0), task_pod("ps", 1)], NOW, jobset=queued)
    assert status.task("worker", 2).reason == ("waiting for the JobSet controller to start Job tf-demo-worker-0 "
                                               "(startupPolicy InOrder: once every pod of the roles before it is ready)")
    # The Jobs form, missing its workers' Job, says it was deleted.
    jobs_form = {o["metadata"]["name"]: o for o in render_group(spec(), "ml")}
    assert "deleted outside airflow-tf" in assess("tf-demo", [jobs_form["tf-demo-ps"]], [], NOW).failure


def test_a_completed_jobset_succeeds_though_its_controller_deleted_the_ps_and_other_jobs():
    jobset = with_conditions(the_jobset(render_jobset(spec(chief=1, success_policy="ChiefOrWorker0"), "ml")),
                             ("Completed", "AllJobsCompleted", "jobset completed successfully"))
    chief = child_job(jobset, "chief", completedIndexes="0", conditions=[("Complete", "", "")])
    status = assess("tf-demo", [chief], [task_pod("chief", 0, "Succeeded")], NOW, jobset=jobset)
    assert status.failure is None
    assert [(t.name, t.phase) for t in status.tasks] == [("tf-demo-chief-0-0", Phase.SUCCEEDED)]
    assert group_outcome(status, "ChiefOrWorker0").succeeded


def test_a_failed_jobset_fails_the_group_with_the_jobs_reason_or_its_own():
    jobset = with_conditions(the_jobset(render_jobset(spec(), "ml")),
                             ("Failed", "FailedJobs", "jobset failed due to one or more job failures"))
    worker = child_job(jobset, "worker", conditions=[("Failed", "PodFailurePolicy", "Container worker exited 2")])
    pods = [task_pod("worker", 0, "Failed", terminated={"exitCode": 2, "message": "model refused"}),
            task_pod("worker", 1)]
    outcome = group_outcome(assess("tf-demo", [worker], pods, NOW, jobset=jobset))
    assert outcome.done and not outcome.succeeded and outcome.code is OutcomeCode.TASK_FAILED
    assert outcome.failed_task.name == "tf-demo-worker-0-0" and "podFailurePolicy" in outcome.reason
    # Its Jobs gone (deleted by its controller): the JobSet's own condition is the reason.
    status = assess("tf-demo", [], [], NOW, jobset=jobset)
    assert status.tasks == [] and status.failure == (
        "JobSet tf-demo failed: FailedJobs: jobset failed due to one or more job failures")
    assert not group_outcome(status).succeeded and group_outcome(status).code is OutcomeCode.GROUP_FAILED
