"""The Kubernetes manifests: what `airflow-tf render` prints and the backend creates.
Offline: validated against the Kubernetes OpenAPI schemas shipped with kubernetes-validate."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest
import yaml

from airflow_tf.backends.kubernetes_manifests import GROUP_LABEL, render_group, to_yaml
from airflow_tf.cli import main
from airflow_tf.cluster import GroupSpec, SpecError, TrainingConfig, group_name
from airflow_tf.cluster.names import is_dns1123_label

# The Kubernetes versions the README claims; every one is checked with the strict schemas
# (unknown fields are errors, so a misspelt key cannot pass).
SUPPORTED_VERSIONS = ["1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0"]
HOSTILE = "My_Model; rm -rf /\"\n  injected: true\nkind: Secret"


def training(**kw):
    return TrainingConfig(dataset="/data/ds/1", run_dir="/runs/r", steps=100, **kw)


def spec(**kw) -> GroupSpec:
    options = dict(ps=2, workers=2, image="registry.example/tf:2.21")
    options.update(kw)
    return GroupSpec.for_training(options.pop("name", "tf-demo"), training(), **options)


def pods(objects):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "Pod"}


def env_of(pod) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.slow
def test_render_output_validates_against_the_kubernetes_schemas(capsys):
    code = main(["render", "--name", "demo", "--ps", "2", "--workers", "3", "--image", "tf:2.21",
                 "--namespace", "ml", "--dataset", "/data/linear/1", "--steps", "500", "--port", "2300",
                 "--network-policy", "--data-claim", "tf-data", "--runs-claim", "tf-runs", "--worker-gpus", "1",
                 "--service-account", "trainer"])
    assert code == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert sorted(d["kind"] for d in documents) == ["NetworkPolicy"] + ["Pod"] * 5 + ["Service"] * 5
    for version in SUPPORTED_VERSIONS:
        for document in documents:
            kubernetes_validate.validate(document, version, strict=True)
    worker = pods(documents)["demo-worker-2"]
    assert worker["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    mounts = {m["mountPath"]: m["readOnly"] for m in worker["spec"]["containers"][0]["volumeMounts"]}
    assert mounts == {"/data": True, "/runs": False}
    assert {v["persistentVolumeClaim"]["claimName"] for v in worker["spec"]["volumes"]} == {"tf-data", "tf-runs"}
    command = worker["spec"]["containers"][0]["command"]
    assert command[:3] == ["python", "-m", "airflow_tf.runtime"]
    assert command[command.index("--run-dir") + 1] == "/runs/demo"


def test_a_schema_violation_is_caught_by_the_validation():
    # The validation must be able to fail: a pod with a misspelt field is rejected.
    pod = pods(render_group(spec(), "ml"))["tf-demo-ps-0"]
    pod["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, SUPPORTED_VERSIONS[0], strict=True)


def test_render_refuses_bad_input_naming_the_field(capsys):
    assert main(["render", "--name", "x", "--ps", "0", "--workers", "1", "--image", "i"]) == 2
    assert "roles.ps.replicas" in capsys.readouterr().err


def test_tf_config_names_every_task_by_its_service_dns_name_and_port():
    objects = render_group(spec(port=2300), "ml", cluster_domain="cluster.local")
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    expected_cluster = {
        "ps": [f"tf-demo-ps-{i}.ml.svc.cluster.local:2300" for i in range(2)],
        "worker": [f"tf-demo-worker-{i}.ml.svc.cluster.local:2300" for i in range(2)],
    }
    for name, pod in pods(objects).items():
        config = json.loads(env_of(pod)["TF_CONFIG"])
        role, index = name.rsplit("-", 2)[1:]
        assert config == {"cluster": expected_cluster, "task": {"type": role, "index": int(index)}}
        service = services[name]  # one headless Service per pod, selecting exactly that pod
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert service["spec"]["ports"][0]["port"] == 2300
        assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == 2300


def test_pods_run_with_secure_defaults_and_ps_stays_off_gpus():
    group = spec(role_options={"worker": {"resources": {"limits": {"nvidia.com/gpu": "2"}}}})
    for name, pod in pods(render_group(group, "ml")).items():
        assert pod["spec"]["restartPolicy"] == "Never"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["spec"]["securityContext"]["runAsUser"] != 0
        container = pod["spec"]["containers"][0]["securityContext"]
        assert container["allowPrivilegeEscalation"] is False
        assert container["capabilities"]["drop"] == ["ALL"]
        assert pod["spec"]["automountServiceAccountToken"] is False
        if "-ps-" in name:
            assert env_of(pod)["CUDA_VISIBLE_DEVICES"] == ""
            assert "limits" not in pod["spec"]["containers"][0]["resources"]
        else:
            assert "CUDA_VISIBLE_DEVICES" not in env_of(pod)


def test_role_settings_reach_the_pod_and_secrets_stay_references():
    settings = {
        "node_selector": {"pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "service_account": "trainer", "image_pull_secrets": ["regcred"],
        "env_from": [{"secret": "s3-credentials"}, {"config_map": "tf-settings", "prefix": "TF_"}],
        "secret_env": {"WANDB_API_KEY": {"secret": "wandb", "key": "api-key"}},
        "volumes": [{"claim": "tf-data", "mount_path": "/data", "read_only": True}],
    }
    group = spec(role_options={"worker": {"kubernetes": settings, "env": {"LOG_LEVEL": "debug"}}})
    worker = pods(render_group(group, "ml"))["tf-demo-worker-0"]
    pod_spec = worker["spec"]
    assert pod_spec["nodeSelector"] == {"pool": "gpu"}
    assert pod_spec["tolerations"] == settings["tolerations"]
    assert pod_spec["serviceAccountName"] == "trainer" and pod_spec["automountServiceAccountToken"] is True
    assert pod_spec["imagePullSecrets"] == [{"name": "regcred"}]
    container = pod_spec["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "s3-credentials"}},
                                    {"configMapRef": {"name": "tf-settings"}, "prefix": "TF_"}]
    assert env_of(worker)["WANDB_API_KEY"] == {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
    assert env_of(worker)["LOG_LEVEL"] == "debug"
    ps = pods(render_group(group, "ml"))["tf-demo-ps-0"]
    assert "nodeSelector" not in ps["spec"] and "envFrom" not in ps["spec"]["containers"][0]


@pytest.mark.parametrize("settings, message", [
    ({"nodeSelector": {"a": "b"}}, r"roles\.worker\.kubernetes\.nodeSelector: unknown setting; the settings are: node_selector"),
    ({"tolerations": [{"key": "k", "toleration_seconds": 5}]}, r"tolerations\[0\]: unknown field\(s\) toleration_seconds"),
    ({"volumes": [{"claim": "data"}]}, r"volumes\[0\]\.mount_path: an absolute path"),
    ({"secret_env": {"TOKEN": "hunter2"}}, r"secret_env\.TOKEN: must be \{secret: NAME, key: KEY\}"),
    ({"env_from": [{"secret": "s", "config_map": "c"}]}, r"env_from\[0\]"),
    ({"run_as_user": 0}, r"run_as_user: must be a positive numeric id"),
    ({"schedule_timeout_seconds": -1}, r"schedule_timeout_seconds"),
])
def test_bad_kubernetes_settings_are_refused_naming_role_and_key(settings, message):
    with pytest.raises(SpecError, match=message):
        render_group(spec(role_options={"worker": {"kubernetes": settings}}), "ml")


def test_gpu_requested_without_a_limit_and_a_missing_image_are_refused():
    with pytest.raises(SpecError, match=r"roles\.worker\.resources\.limits\.nvidia\.com/gpu"):
        render_group(spec(role_options={"worker": {"resources": {"requests": {"nvidia.com/gpu": "1"}}}}), "ml")
    with pytest.raises(SpecError, match="needs a container image"):
        render_group(spec(image=None), "ml")
    with pytest.raises(SpecError, match=r"roles\.worker\.env\.TF_CONFIG"):
        render_group(spec(role_options={"worker": {"env": {"TF_CONFIG": "{}"}}}), "ml")


def test_hostile_dag_id_gives_valid_unique_names_and_cannot_add_yaml_keys():
    names = {group_name(HOSTILE, "train", run) for run in ("manual__1", "manual__2")}
    names.add(group_name("my-model-rm-rf", "train", "manual__1"))
    assert len(names) == 3
    rendered = {}
    for name in sorted(names):
        group = spec(name=name, labels={"dag_id": HOSTILE, "run_id": "manual__2026-01-01T00:00:00+00:00"},
                     role_options={"worker": {"env": {"NOTE": HOSTILE}, "kubernetes": {"annotations": {"note": HOSTILE}}}})
        objects = render_group(group, "ml")
        text = to_yaml(objects)
        assert list(yaml.safe_load_all(text)) == objects, "printing and reading back must not change anything"
        for obj in objects:
            meta = obj["metadata"]
            assert is_dns1123_label(meta["name"])
            assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
            assert "injected" not in json.dumps(sorted(meta)) and obj["kind"] in ("Pod", "Service")
            for value in meta["labels"].values():
                assert re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", value) and len(value) <= 63
            assert meta["labels"][GROUP_LABEL] == name
        worker = pods(objects)[f"{name}-worker-0"]
        assert env_of(worker)["NOTE"] == HOSTILE  # the exact string, as a value
        assert worker["metadata"]["annotations"]["airflow-tf/dag_id"] == HOSTILE
        assert worker["metadata"]["annotations"]["note"] == HOSTILE
        assert set(worker["spec"]) >= {"containers", "securityContext"} and "injected" not in worker["spec"]
        rendered[name] = {o["metadata"]["name"] for o in objects}
    all_names = [n for group_names in rendered.values() for n in group_names]
    assert len(all_names) == len(set(all_names)), "two groups must never share an object name"


def test_template_values_are_always_json_escaped():
    # Even a value outside the BMP or with YAML line separators survives unchanged.
    tricky = "a\u2028b\x85c😀 #x: &y *z {{ }}"
    group = spec(role_options={"ps": {"env": {"TRICKY": tricky}}})
    ps = pods(yaml.safe_load_all(to_yaml(render_group(group, "ml"))))["tf-demo-ps-0"]
    assert env_of(ps)["TRICKY"] == tricky


def test_invalid_namespace_is_refused():
    with pytest.raises(SpecError, match="namespace: 'ML_Team'"):
        render_group(spec(), "ML_Team")
