"""Teams isolated on the real control plane: a namespace per team from ``airflow-tf render --rbac``
(Pod Security Admission ``restricted`` enforced, the backend's Role bound to the team's service
account), the group's NetworkPolicy made by default, and the backend's own check of ``restricted``
agreeing with the API server's admission: what one refuses, the other refuses too."""

from __future__ import annotations

import io
import json
import uuid

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from airflow_tf.backends import BackendError, get_backend
from airflow_tf.backends.kubernetes.jobs import render_group
from airflow_tf.backends.kubernetes.labels import GROUP_LABEL
from airflow_tf.backends.kubernetes.manifests import merge_pod_template
from airflow_tf.backends.kubernetes.restricted import harden, violations
from airflow_tf.cli import main
from airflow_tf.cluster import GroupSpec, SpecError, TrainingConfig

from .plane import BACKEND_ACCOUNT, _write_kubeconfig, wait_for
from .scripted import ABSENT_IMAGE  # what the pods run is not under test here: they wait for it


def make_spec(name: str = "tf-team", **options) -> GroupSpec:
    training = TrainingConfig(dataset="/data/mnist/1", run_dir=f"/runs/{name}", steps=200)
    return GroupSpec.for_training(name, training, ps=1, workers=2, image=ABSENT_IMAGE, **options)


def render_rbac(namespace: str) -> list[dict]:
    out = io.StringIO()
    from contextlib import redirect_stdout

    with redirect_stdout(out):
        assert main(["render", "--rbac", "--namespace", namespace]) == 0
    return [doc for doc in yaml.safe_load_all(out.getvalue()) if doc]


@pytest.fixture
def teams(plane, tmp_path):
    """Two team namespaces applied from ``render --rbac``, and a kubeconfig of each team's account."""
    names = [f"team-{team}-{uuid.uuid4().hex[:6]}" for team in "ab"]
    kubeconfigs = []
    for name in names:
        plane.apply(render_rbac(name))
        kubeconfigs.append(tmp_path / f"{name}.kubeconfig")
        _write_kubeconfig(kubeconfigs[-1], plane.api.configuration, plane.token(name, BACKEND_ACCOUNT), name)
    yield list(zip(names, kubeconfigs))
    for name in names:
        plane.delete_namespace(name)


def _batch(kubeconfig) -> client.BatchV1Api:
    return client.BatchV1Api(config.new_client_from_config(config_file=str(kubeconfig)))


def test_a_teams_account_runs_groups_in_its_namespace_and_is_refused_in_anothers(plane, teams):
    (ns_a, kubeconfig_a), (ns_b, _) = teams
    labels = plane.core.read_namespace(ns_a).metadata.labels
    assert {labels[f"pod-security.kubernetes.io/{mode}"] for mode in ("enforce", "warn", "audit")} == {"restricted"}

    # Team A's account: create, list and delete Jobs in its namespace...
    batch_a = _batch(kubeconfig_a)
    job = next(o for o in render_group(make_spec("tf-probe"), ns_a) if o["kind"] == "Job")
    batch_a.create_namespaced_job(ns_a, job)
    assert [j.metadata.name for j in batch_a.list_namespaced_job(ns_a).items] == [job["metadata"]["name"]]
    batch_a.delete_namespaced_job(job["metadata"]["name"], ns_a, propagation_policy="Background")
    # ... and nothing in team B's: 403 from the real authorizer.
    other = next(o for o in render_group(make_spec("tf-probe"), ns_b) if o["kind"] == "Job")
    plane.batch.create_namespaced_job(ns_b, other)
    for attempt in (lambda: batch_a.create_namespaced_job(ns_b, other),
                    lambda: batch_a.list_namespaced_job(ns_b),
                    lambda: batch_a.delete_namespaced_job(other["metadata"]["name"], ns_b),
                    lambda: client.CoreV1Api(batch_a.api_client).list_namespaced_pod(ns_b)):
        with pytest.raises(ApiException) as refused:
            attempt()
        assert refused.value.status == 403, refused.value

    # The backend as team A: its group runs in A, NetworkPolicy included, and the Job controller's pods
    # are admitted under 'restricted'.
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=str(kubeconfig_a), namespace=ns_a)
    ref = backend.launch(make_spec())
    selector = f"{GROUP_LABEL}={ref.name}"
    policies = plane.networking.list_namespaced_network_policy(ns_a, label_selector=selector).items
    assert [p.metadata.name for p in policies] == ["tf-team-grpc"]
    policy = policies[0].spec
    assert policy.pod_selector.match_labels == {GROUP_LABEL: "tf-team"} and policy.policy_types == ["Ingress"]
    assert [peer.pod_selector.match_labels for peer in policy.ingress[0]._from] == [{GROUP_LABEL: "tf-team"}]
    wait_for(lambda: len(plane.core.list_namespaced_pod(ns_a, label_selector=selector).items) == 3, 30,
             "the Job controller to create the group's three pods in the restricted namespace")
    events = plane.core.list_namespaced_event(ns_a, field_selector="reason=FailedCreate").items
    assert events == [], [e.message for e in events]
    # Team A's backend pointed at team B's namespace creates nothing there.
    with pytest.raises(BackendError, match="HTTP 403"):
        get_backend("kubernetes", kubernetes_conn_id=None, config_file=str(kubeconfig_a),
                    namespace=ns_b).launch(make_spec("tf-intruder"))
    assert [j.metadata.name for j in plane.batch.list_namespaced_job(ns_b).items] == [other["metadata"]["name"]]
    backend.teardown(ref)
    wait_for(lambda: not plane.networking.list_namespaced_network_policy(ns_a, label_selector=selector).items, 30,
             "the group's NetworkPolicy to go with the group")


SIDECAR = {"name": "sidecar", "image": "busybox:1.36", "command": ["sleep", "infinity"]}
# (a pod_template a DAG author might give, the field our check names, what the admission's refusal says)
FORBIDDEN = [
    ({"containers": [{**SIDECAR, "securityContext": {"runAsUser": 0}}]}, "securityContext.runAsUser: 0", "runAsUser=0"),
    # (privileged with allowPrivilegeEscalation false is invalid, so both are set)
    ({"containers": [{**SIDECAR, "securityContext": {"privileged": True, "allowPrivilegeEscalation": True}}]},
     "securityContext.privileged: true", "privileged"),
    ({"containers": [{**SIDECAR, "securityContext": {"allowPrivilegeEscalation": True}}]},
     "securityContext.allowPrivilegeEscalation: True", "allowPrivilegeEscalation"),
    ({"containers": [{**SIDECAR, "securityContext": {"runAsNonRoot": False}}]}, "securityContext.runAsNonRoot: false",
     "runAsNonRoot"),
    ({"containers": [{**SIDECAR, "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]},
     "securityContext.capabilities.add: ['NET_ADMIN']", "unrestricted capabilities"),
    ({"containers": [{**SIDECAR, "securityContext": {"capabilities": {"drop": ["NET_RAW"]}}}]},
     "securityContext.capabilities.drop: ['NET_RAW']; must include ALL", "unrestricted capabilities"),
    ({"containers": [{**SIDECAR, "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]},
     "seccompProfile.type: 'Unconfined'", "seccompProfile"),
    ({"containers": [{**SIDECAR, "ports": [{"containerPort": 8080, "hostPort": 8080}]}]}, "ports[0].hostPort: 8080",
     "hostPort"),
    ({"initContainers": [{**SIDECAR, "restartPolicy": "Always", "securityContext": {"runAsUser": 0}}]},
     "pod_template.spec.initContainers[0] 'sidecar': securityContext.runAsUser: 0", "runAsUser=0"),
    ({"hostNetwork": True}, "spec.hostNetwork: true", "host namespaces"),
    ({"volumes": [{"name": "host", "hostPath": {"path": "/var/run"}}]}, "spec.volumes[0] 'host': hostPath volumes",
     "hostPath"),
    ({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}},
     "spec.securityContext.sysctls 'kernel.msgmax'", "forbidden sysctls"),
]


def _bypassing_our_check(template: dict, pod_template: dict) -> dict:
    """The pod the backend would make from ``pod_template`` were its check of 'restricted' skipped."""
    pod = merge_pod_template({"spec": pod_template}, template)
    pod["spec"]["containers"] = pod["spec"]["containers"][:1] + [harden(c) for c in pod["spec"]["containers"][1:]]
    pod["spec"]["initContainers"] = [harden(c) for c in pod["spec"].get("initContainers") or []]
    return pod


def _as_pod(template: dict, name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **template["metadata"]},
            "spec": template["spec"]}


@pytest.mark.parametrize(("pod_template", "field", "admission_says"), FORBIDDEN,
                         ids=[field.split(":")[0].split(" ")[-1] for _, field, _ in FORBIDDEN])
def test_our_check_and_the_admission_refuse_the_same_pods(kube, pod_template, field, admission_says):
    ours = make_spec(role_options={"worker": {"kubernetes": {"pod_template": {"spec": pod_template}}}})
    with pytest.raises(SpecError) as refused:
        render_group(ours, kube.ns)
    assert "roles.worker: Pod Security Standard 'restricted' forbids this pod" in str(refused.value)
    assert field in str(refused.value), str(refused.value)

    compliant = next(o for o in render_group(make_spec(), kube.ns) if o["metadata"]["name"] == "tf-team-worker")
    template = compliant["spec"]["template"]
    kube.plane.core.create_namespaced_pod(kube.ns, _as_pod(template, "compliant"), dry_run="All")
    pod = _bypassing_our_check(template, pod_template)
    assert violations(pod), "the bypass builds the pod our check refuses"
    with pytest.raises(ApiException) as admission:
        kube.plane.core.create_namespaced_pod(kube.ns, _as_pod(pod, "forbidden"), dry_run="All")
    message = json.loads(admission.value.body)["message"]
    if admission_says == "privileged":  # this API server forbids privileged containers at all (--allow-privileged)
        assert admission.value.status == 422 and "privileged: Forbidden" in message, message
    else:
        assert admission.value.status == 403 and 'violates PodSecurity "restricted:latest"' in message, message
    assert admission_says in message, message


def test_a_job_with_a_root_sidecar_gets_no_pod_from_the_admission(kube):
    """The case the issue names, as the Job controller meets it: the Job is stored, its pods refused."""
    job = next(o for o in render_group(make_spec(), kube.ns) if o["metadata"]["name"] == "tf-team-worker")
    job["spec"]["template"] = _bypassing_our_check(job["spec"]["template"], FORBIDDEN[0][0])
    kube.plane.batch.create_namespaced_job(kube.ns, job)
    failed = wait_for(lambda: [e.message for e in kube.plane.core.list_namespaced_event(
        kube.ns, field_selector="reason=FailedCreate,involvedObject.name=tf-team-worker").items], 30,
        "the Job controller's FailedCreate event")
    assert 'violates PodSecurity "restricted:latest"' in failed[0] and "runAsUser=0" in failed[0], failed
    assert kube.objects("pods") == []


def test_render_rbac_prints_a_teams_namespace_with_the_shipped_role(capsys):
    from airflow_tf.backends.kubernetes.access import ROLE_FILE

    assert main(["render", "--rbac", "--namespace", "team-a", "--bind", "airflow:airflow-worker"]) == 0
    namespace, account, role, binding = yaml.safe_load_all(capsys.readouterr().out)
    assert [o["kind"] for o in (namespace, account, role, binding)] == ["Namespace", "ServiceAccount", "Role",
                                                                       "RoleBinding"]
    assert {k: v for k, v in namespace["metadata"]["labels"].items() if k.startswith("pod-security")} == {
        f"pod-security.kubernetes.io/{mode}{suffix}": value for mode in ("enforce", "warn", "audit")
        for suffix, value in (("", "restricted"), ("-version", "latest"))}
    assert role["rules"] == yaml.safe_load(ROLE_FILE.read_text())["rules"], "role.yaml is the one source of the rules"
    assert {"networking.k8s.io"} in [set(rule["apiGroups"]) for rule in role["rules"]], "NetworkPolicy by default"
    assert {o["metadata"]["namespace"] for o in (account, role, binding)} == {"team-a"}
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "airflow-tf", "namespace": "team-a"},
                                   {"kind": "ServiceAccount", "name": "airflow-worker", "namespace": "airflow"}]
    assert main(["render", "--rbac"]) == 2
    assert "--rbac needs --namespace" in capsys.readouterr().err
    assert main(["render", "--rbac", "--namespace", "team-a", "--bind", "airflow-worker"]) == 2
    assert "--bind: 'airflow-worker' is not NAMESPACE:SERVICEACCOUNT" in capsys.readouterr().err
    assert main(["render", "--rbac", "--namespace", "Team_A"]) == 2
    assert "'Team_A' is not a Kubernetes namespace name" in capsys.readouterr().err


def test_render_makes_the_network_policy_unless_told_not_to(capsys):
    group = ["render", "--name", "demo", "--image", "registry.example/tf:2.21", "--namespace", "ml"]
    assert main(group) == 0
    assert [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)] == ["Job", "Service", "NetworkPolicy",
                                                                                "Job"]
    assert main([*group, "--no-network-policy"]) == 0
    assert "NetworkPolicy" not in [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert main(["render", "--name", "demo"]) == 2
    assert "--image required" in capsys.readouterr().err


def test_turning_the_network_policy_off_is_explicit_and_warned(kube, caplog):
    backend = get_backend("kubernetes", kubernetes_conn_id=None, config_file=str(kube.kubeconfig), namespace=kube.ns,
                          network_policy=False)
    with caplog.at_level("WARNING", logger="airflow_tf.backends.kubernetes.backend"):
        ref = backend.launch(make_spec())
    assert any("network_policy=False: group tf-team gets no NetworkPolicy, so any pod that can reach its pods can "
               "drive its TensorFlow gRPC servers" in r.getMessage() for r in caplog.records), caplog.text
    assert kube.objects("networkpolicies") == [] and len(kube.objects("jobs")) == 2
    backend.teardown(ref)
