"""The Kubernetes manifests: what `airflow-tf render` prints and the backend creates.
Offline: validated against the Kubernetes OpenAPI schemas shipped with kubernetes-validate."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest
import yaml

from airflow_tf.backends.kubernetes.default_requests import ROLE_REQUESTS
from airflow_tf.backends.kubernetes.jobs import render_group
from airflow_tf.backends.kubernetes.labels import GROUP_LABEL
from airflow_tf.backends.kubernetes.manifests import PEERS_ANSWERED_CHECK, to_yaml
from airflow_tf.backends.kubernetes.nodes import PEERS_ANSWERED
from airflow_tf.cli import main
from airflow_tf.cluster import GroupSpec, SpecError, TrainingConfig, group_name
from airflow_tf.cluster.names import is_dns1123_label

# The Kubernetes versions the README claims; every one is checked with the strict schemas
# (unknown fields are errors, so a misspelt key cannot pass).
SUPPORTED_VERSIONS = ["1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0"]
HOSTILE = "My_Model; rm -rf /\"\n  injected: true\nkind: Secret"


def training(**kw):
    return TrainingConfig(dataset="/data/ds/1", run_dir="/runs/r", steps=100, **kw)


def spec(**kw) -> GroupSpec:
    options = dict(ps=2, workers=2, image="registry.example/tf:2.21")
    options.update(kw)
    return GroupSpec.for_training(options.pop("name", "tf-demo"), training(), **options)


def jobs(objects):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "Job"}


def pods(objects):
    """Each role's pod template, by Job name (the Job controller makes the pods from it)."""
    return {name: job["spec"]["template"] for name, job in jobs(objects).items()}


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
    assert [d["kind"] for d in documents] == ["Job", "Service", "NetworkPolicy", "Job"], "the root Job first"
    for version in SUPPORTED_VERSIONS:
        for document in documents:
            kubernetes_validate.validate(document, version, strict=True)
    assert jobs(documents)["demo-worker"]["spec"]["completions"] == 3
    worker = pods(documents)["demo-worker"]
    assert worker["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "1"},
                                                            "requests": ROLE_REQUESTS["worker"]}
    mounts = {m["mountPath"]: m["readOnly"] for m in worker["spec"]["containers"][0]["volumeMounts"]}
    assert mounts == {"/data": True, "/runs": False}
    assert {v["persistentVolumeClaim"]["claimName"] for v in worker["spec"]["volumes"]} == {"tf-data", "tf-runs"}
    command = worker["spec"]["containers"][0]["command"]
    assert command[:3] == ["python", "-m", "airflow_tf.runtime"]
    assert command[command.index("--run-dir") + 1] == "/runs/demo"


def test_a_schema_violation_is_caught_by_the_validation():
    # The validation must be able to fail: a pod with a misspelt field is rejected.
    job = jobs(render_group(spec(), "ml"))["tf-demo-ps"]
    job["spec"]["template"]["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, SUPPORTED_VERSIONS[0], strict=True)


def test_render_refuses_bad_input_naming_the_field(capsys):
    assert main(["render", "--name", "x", "--ps", "0", "--workers", "1", "--image", "i"]) == 2
    assert "  --ps: parameter-server training needs at least one ps task" in capsys.readouterr().err


def test_tf_config_names_every_task_by_its_stable_dns_name_and_port():
    objects = render_group(spec(port=2300), "ml", cluster_domain="cluster.local")
    service, = [o for o in objects if o["kind"] == "Service"]
    expected_cluster = {
        "ps": [f"tf-demo-ps-{i}.tf-demo.ml.svc.cluster.local:2300" for i in range(2)],
        "worker": [f"tf-demo-worker-{i}.tf-demo.ml.svc.cluster.local:2300" for i in range(2)],
    }
    assert sorted(pods(objects)) == ["tf-demo-ps", "tf-demo-worker"]
    for name, pod in pods(objects).items():
        config = json.loads(env_of(pod)["TF_CONFIG"])
        # One TF_CONFIG per Job: the index comes from JOB_COMPLETION_INDEX.
        assert config == {"cluster": expected_cluster, "task": {"type": name.rsplit("-", 1)[1]}}
        # As a local task: the runtime titles the container's process after its group and run.
        assert (env_of(pod)["AIRFLOW_TF_GROUP"], env_of(pod)["AIRFLOW_TF_RUN"]) == ("tf-demo", training().run_dir)
        # <job>-<index> is the pod's hostname in an Indexed Job; the Service is its subdomain.
        assert pod["spec"]["subdomain"] == service["metadata"]["name"] == "tf-demo"
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == 2300
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"][0]["port"] == 2300


def test_jobs_let_kubernetes_own_restarts_failures_deadline_and_cleanup():
    group = spec(backoff_limit=4, active_deadline_seconds=7200, success_policy="ChiefOrWorker0")
    objects = render_group(group, "ml", ttl_seconds_after_finished=900)
    ps, worker = jobs(objects)["tf-demo-ps"]["spec"], jobs(objects)["tf-demo-worker"]["spec"]
    for job in (ps, worker):
        assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"] == 2
        assert job["backoffLimitPerIndex"] == 4 and job["maxFailedIndexes"] == 0
        assert job["activeDeadlineSeconds"] == 7200
        assert job["template"]["spec"]["restartPolicy"] == "Never"
        assert job["podFailurePolicy"]["rules"][0] == {
            "action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    # Workers (ExitCode): a program error (exit 1-128) fails the group at once; a signal is retried.
    fail = worker["podFailurePolicy"]["rules"][1]
    assert fail["action"] == "FailJob" and fail["onExitCodes"]["containerName"] == "worker"
    assert fail["onExitCodes"]["values"] == list(range(1, 129))
    assert len(ps["podFailurePolicy"]["rules"]) == 1, "parameter servers (OnFailure) are restarted on any exit"
    assert worker["ttlSecondsAfterFinished"] == 900 and "ttlSecondsAfterFinished" not in ps, "the root's TTL"
    assert worker["successPolicy"] == {"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}
    # Without a group deadline the ps Job still has one: it never completes by itself.
    assert jobs(render_group(spec(), "ml"))["tf-demo-ps"]["spec"]["activeDeadlineSeconds"] == 7 * 24 * 3600
    assert "activeDeadlineSeconds" not in jobs(render_group(spec(), "ml"))["tf-demo-worker"]["spec"]
    never = spec(role_options={"worker": {"restart_policy": "Never"}})
    assert jobs(render_group(never, "ml"))["tf-demo-worker"]["spec"]["backoffLimitPerIndex"] == 0


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
        if name.endswith("-ps"):
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
    worker = pods(render_group(group, "ml"))["tf-demo-worker"]
    pod_spec = worker["spec"]
    assert pod_spec["nodeSelector"] == {"pool": "gpu"}
    assert pod_spec["tolerations"][0] == settings["tolerations"][0], "the role's first, then the lost-node ones"
    assert pod_spec["serviceAccountName"] == "trainer" and pod_spec["automountServiceAccountToken"] is True
    assert pod_spec["imagePullSecrets"] == [{"name": "regcred"}]
    container = pod_spec["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "s3-credentials"}},
                                    {"configMapRef": {"name": "tf-settings"}, "prefix": "TF_"}]
    assert env_of(worker)["WANDB_API_KEY"] == {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
    assert env_of(worker)["LOG_LEVEL"] == "debug"
    ps = pods(render_group(group, "ml"))["tf-demo-ps"]
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
    with pytest.raises(SpecError, match=r"roles\.ps\.env\.AIRFLOW_TF_GROUP: set by the backend"):
        render_group(spec(role_options={"ps": {"env": {"AIRFLOW_TF_GROUP": "another"}}}), "ml")


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
            assert "injected" not in json.dumps(sorted(meta)) and obj["kind"] in ("Job", "Service")
            for value in meta["labels"].values():
                assert re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", value) and len(value) <= 63
            assert meta["labels"][GROUP_LABEL] == name
        worker = pods(objects)[f"{name}-worker"]
        assert env_of(worker)["NOTE"] == HOSTILE  # the exact string, as a value
        assert jobs(objects)[f"{name}-worker"]["metadata"]["annotations"]["airflow-tf/dag_id"] == HOSTILE
        assert worker["metadata"]["annotations"]["note"] == HOSTILE
        assert set(worker["spec"]) >= {"containers", "securityContext"} and "injected" not in worker["spec"]
        rendered[name] = {o["metadata"]["name"] for o in objects}
    all_names = [n for group_names in rendered.values() for n in group_names]
    assert len(all_names) == len(set(all_names)), "two groups must never share an object name"


def test_template_values_are_always_json_escaped():
    # Even a value outside the BMP or with YAML line separators survives unchanged.
    tricky = "a\u2028b\x85c😀 #x: &y *z {{ }}"
    group = spec(role_options={"ps": {"env": {"TRICKY": tricky}}})
    ps = pods(yaml.safe_load_all(to_yaml(render_group(group, "ml"))))["tf-demo-ps"]
    assert env_of(ps)["TRICKY"] == tricky


def test_invalid_namespace_is_refused():
    with pytest.raises(SpecError, match="namespace: 'ML_Team'"):
        render_group(spec(), "ML_Team")


@pytest.mark.parametrize("argv, message", [
    (["--image", "registry.example/tf:2.21\n  command: [sh]"], "--image: 'registry.example/tf:2.21\\n  command: [sh]' "
                                                               "is not a container image reference"),
    (["--image", "Registry/TF:latest"], "is not a container image reference"),
    (["--image", "tf:2.21; rm -rf /"], "is not a container image reference"),
    (["--worker-gpus", "-1"], "--worker-gpus: -1 is not a GPU count (>= 0)"),
    (["--service-account", "Trainer Account"], "--service-account: 'Trainer Account' is not a valid service account name"),
    (["--service-account", "../admin"], "is not a valid service account name"),
    (["--cluster-domain", "cluster.local."], "--cluster-domain: 'cluster.local.' is not a valid cluster domain"),
    (["--cluster-domain", "evil.com:53 #"], "is not a valid cluster domain"),
    (["--queue-name", "team a"], "--queue-name: 'team a' is not a Kueue LocalQueue name"),
    (["--shm-size", "-1Gi"], "--shm-size: '-1Gi' is not a Kubernetes quantity"),
])
def test_render_refuses_hostile_values_with_a_clear_error_and_no_manifest(capsys, argv, message):
    base = {"--name": "demo", "--image": "tf:2.21"}
    for flag, value in zip(argv[::2], argv[1::2]):
        base[flag] = value
    code = main(["render", *[f"{flag}={value}" for flag, value in base.items()]])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", "a bad value never prints a manifest"
    assert message in err


@pytest.mark.parametrize("resources, message", [
    ({"limits": {"nvidia.com/gpu": "-1"}}, "limits.nvidia.com/gpu: '-1' is not a Kubernetes quantity"),
    ({"limits": {"nvidia.com/gpu": "0.5"}}, "a GPU count is a whole number >= 0"),
    ({"limits": {"memory": "4 GiB"}}, "limits.memory: '4 GiB' is not a Kubernetes quantity"),
    ({"limits": {"cpu": float("nan")}}, "limits.cpu: nan is not a Kubernetes quantity"),
])
def test_resources_are_real_quantities_and_gpu_counts_whole_numbers(resources, message):
    with pytest.raises(SpecError) as e:
        render_group(spec(role_options={"worker": {"resources": resources}}), "ml")
    assert message in str(e.value)


def test_the_platform_knobs_reach_the_jobs_and_validate_against_every_supported_version(tmp_path):
    template = tmp_path / "pod-template.yaml"
    template.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"labels": {"team": "vision"}, "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}},
        "spec": {
            "priorityClassName": "batch-low", "dnsPolicy": "ClusterFirst",
            "securityContext": {"supplementalGroups": [2000], "runAsUser": 0},
            "containers": [{"name": "base", "env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
                                                    {"name": "TF_CONFIG", "value": "overridden"}],
                            "resources": {"requests": {"cpu": "1"}}}],
            "volumes": [{"name": "ca", "configMap": {"name": "corp-ca"}}],
        },
    }))
    settings = {
        "pod_template": str(template),
        "labels": {"cost-center": "ml-42"}, "annotations": {"owner": "ml-platform"},
        "volumes": [{"secret": "gcs-key", "mount_path": "/secrets/gcs"},
                    {"config_map": "tf-settings", "mount_path": "/etc/tf"},
                    {"empty_dir": {"medium": "Memory", "size_limit": "512Mi"}, "mount_path": "/scratch"}],
        "shm_size": "2Gi",
        "init_containers": [{"name": "fetch-data", "image": "busybox:1.36", "command": ["true"]}],
        "sidecars": [{"name": "log-shipper", "image": "fluent/fluent-bit:3.0"}],
        "node_selector": {"pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    group = spec(role_options={"worker": {"kubernetes": settings,
                                          "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "8Gi"}}}})
    objects = render_group(group, "ml")
    for version in SUPPORTED_VERSIONS:
        for document in objects:
            kubernetes_validate.validate(document, version, strict=True)
    job = jobs(objects)["tf-demo-worker"]
    assert job["spec"]["suspend"] is False and "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    assert job["metadata"]["labels"]["cost-center"] == "ml-42" and job["metadata"]["annotations"]["owner"] == "ml-platform"
    pod = job["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "vision" and pod["metadata"]["labels"]["cost-center"] == "ml-42"
    assert pod["spec"]["priorityClassName"] == "batch-low" and pod["spec"]["dnsPolicy"] == "ClusterFirst"
    assert pod["spec"]["securityContext"]["supplementalGroups"] == [2000]
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000, "what the backend sets wins over the template"
    container = pod["spec"]["containers"][0]
    assert container["name"] == "worker" and len(pod["spec"]["containers"]) == 1
    env = env_of(pod)
    assert env["HTTPS_PROXY"] == "http://proxy:3128" and env["TF_CONFIG"] != "overridden"
    assert container["resources"] == {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "1", "memory": "8Gi"}}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["ca"] == {"name": "ca", "configMap": {"name": "corp-ca"}}
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}
    assert volumes["volume-0"]["secret"] == {"secretName": "gcs-key"}
    assert volumes["volume-2"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "512Mi"}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/dev/shm"]["name"] == "dshm" and mounts["/secrets/gcs"]["readOnly"] is True
    init = {c["name"]: c for c in pod["spec"]["initContainers"]}
    assert "restartPolicy" not in init["fetch-data"] and init["log-shipper"]["restartPolicy"] == "Always"
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"} and pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    ps = jobs(objects)["tf-demo-ps"]
    assert ps["spec"]["suspend"] is False and "volumes" not in ps["spec"]["template"]["spec"]


def test_a_bad_pod_template_or_sidecar_is_refused_naming_it(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError, match=r"roles\.worker\.kubernetes\.pod_template: cannot read the pod template file"):
        render_group(spec(role_options={"worker": {"kubernetes": {"pod_template": str(missing)}}}), "ml")
    with pytest.raises(SpecError, match=r"pod_template: must be a Pod manifest"):
        render_group(spec(role_options={"worker": {"kubernetes": {"pod_template": {"kind": "Deployment"}}}}), "ml")
    with pytest.raises(SpecError, match=r"sidecars\[0\]\.image: 'bad image!' is not a container image reference"):
        render_group(spec(role_options={"worker": {"kubernetes": {"sidecars": [{"name": "s", "image": "bad image!"}]}}}),
                     "ml")
    with pytest.raises(SpecError, match=r"sidecars: must be a list of Kubernetes containers \(\{name, image"):
        render_group(spec(role_options={"worker": {"kubernetes": {"sidecars": {"name": "s", "image": "i:1"}}}}), "ml")
    with pytest.raises(SpecError, match=r"tolerations: must be a list of Kubernetes tolerations"):
        render_group(spec(role_options={"worker": {"kubernetes": {"tolerations": ["gpu"]}}}), "ml")


def test_a_group_wide_restart_budget_is_refused_as_kubernetes_counts_per_task():
    with pytest.raises(SpecError, match=r"group_backoff_limit: the Kubernetes backend counts restarts per task"):
        render_group(spec(group_backoff_limit=2), "ml")


def test_ps_and_workers_are_probed_by_their_health_question_with_the_groups_bounds():
    """A frozen ps still accepts TCP connections: its liveness probe asks its TensorFlow server
    (tests/runtime/test_health.py runs the probe's command against live and frozen servers)."""
    def probes(group):
        return {name: (c.get("livenessProbe"), c.get("startupProbe"))
                for name, pod in pods(render_group(group, "ml")).items() for c in pod["spec"]["containers"][:1]}

    found = probes(spec(evaluator=1, health_timeout=4, port=2345))
    for name in ("tf-demo-ps", "tf-demo-worker"):
        liveness, startup = found[name]
        question = ["python", "-m", "airflow_tf.runtime.health", "127.0.0.1:2345", "--timeout", "4",
                    "--peers-answered", PEERS_ANSWERED]
        assert liveness == {"exec": {"command": question}, "periodSeconds": 4, "failureThreshold": 3,
                            "timeoutSeconds": 14}, "3 unanswered questions of 4 s, 4 s apart: killed"
        # TensorFlow's import and the server's start get 10 minutes before the first answer is due.
        assert startup["exec"] == liveness["exec"] and startup["periodSeconds"] * startup["failureThreshold"] >= 600
        assert startup["timeoutSeconds"] == liveness["timeoutSeconds"]
    assert found["tf-demo-evaluator"] == (None, None), "the runtime's evaluator serves nothing"
    # A frozen ps ignores SIGTERM: its pod is killed 5 s after the probe gave up, not 30 s.
    graces = {name: pod["spec"].get("terminationGracePeriodSeconds")
              for name, pod in pods(render_group(spec(health_timeout=4), "ml")).items()}
    assert graces == {"tf-demo-ps": 5, "tf-demo-worker": None}, graces
    assert set(probes(spec(health_timeout=None)).values()) == {(None, None)}, "health_timeout=None asks nothing"
    own = spec(role_options={"worker": {"command": ["my-trainer"]}})
    assert probes(own)["tf-demo-worker"] == (None, None), "a command of one's own may serve no TensorFlow server"


def test_a_task_is_ready_while_another_task_of_its_group_answers_it():
    """The liveness probe also asks the group's other tasks and keeps a file while one answers;
    the readiness probe reads it (tests/runtime/test_health.py asks real servers)."""
    def readiness(group):
        return {name: pod["spec"]["containers"][0].get("readinessProbe")
                for name, pod in pods(render_group(group, "ml")).items()}

    found = readiness(spec(health_timeout=4))
    for name in ("tf-demo-ps", "tf-demo-worker"):
        assert found[name] == {"exec": {"command": ["python", "-c", PEERS_ANSWERED_CHECK]}, "periodSeconds": 4,
                               "failureThreshold": 3, "timeoutSeconds": 10}, name
    # Two tasks cannot tell which of them is cut off: neither is asked.
    alone = pods(render_group(spec(ps=1, workers=1), "ml"))
    assert all("readinessProbe" not in p["spec"]["containers"][0] for p in alone.values())
    assert all("--peers-answered" not in p["spec"]["containers"][0]["livenessProbe"]["exec"]["command"]
               for p in alone.values())
    assert set(readiness(spec(health_timeout=None)).values()) == {None}


def test_the_backend_image_is_the_training_image_of_groups_that_name_none():
    from airflow_tf.backends.base import BackendError
    from airflow_tf.backends.kubernetes import KubernetesBackend

    backend = KubernetesBackend(kubernetes_conn_id=None, namespace="ml", image="registry.example/tf:deployment")
    images = {c["image"] for o in backend.render(spec(image=None)) if o["kind"] == "Job"
              for c in o["spec"]["template"]["spec"]["containers"]}
    assert images == {"registry.example/tf:deployment"}
    # A group's own image wins.
    images = {c["image"] for o in backend.render(spec()) if o["kind"] == "Job"
              for c in o["spec"]["template"]["spec"]["containers"]}
    assert images == {"registry.example/tf:2.21"}
    with pytest.raises(BackendError, match="^KubernetesBackend: image: got 'not an image!'; expected a container image"):
        KubernetesBackend(kubernetes_conn_id=None, namespace="ml", image="not an image!")
