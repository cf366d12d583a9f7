"""The Kubernetes objects of a training group: one pod and one headless Service per task,
and optionally a NetworkPolicy, rendered from the Jinja templates in ``templates/``.

Rendering happens in a sandboxed Jinja environment where an undefined variable is an
error, and every ``{{ ... }}`` value is written as JSON (the environment's ``finalize``):
a JSON string is a YAML double-quoted scalar, so no user string (a DAG id, an env value,
an image name) can end a value and start a new YAML key. The rendered YAML is read back
with ``yaml.safe_load_all``; those dicts are what the backend sends to the API server and
what ``airflow-tf render`` prints.

Pod settings that only Kubernetes understands come from ``RoleSpec.kubernetes`` (merged
over the backend's ``pod_defaults``); :data:`POD_OPTIONS` lists the keys and
:func:`pod_options` validates them with errors that name the role and the key.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

from airflow_tf.cluster import GroupSpec, SpecError, cluster_def, label_value, task_name, tf_config_json

TEMPLATES = Path(__file__).with_name("templates")

# Labels and annotations. The group/role/index labels find and count tasks; the
# annotations carry what status() needs to judge a pod without the spec (restart policy,
# budget, schedule timeout), so any process holding only a GroupRef can decide.
PREFIX = "airflow-tf"
GROUP_LABEL = f"{PREFIX}/group"
ROLE_LABEL = f"{PREFIX}/role"
INDEX_LABEL = f"{PREFIX}/index"
RESTART_POLICY = f"{PREFIX}/restart-policy"
RESTARTS = f"{PREFIX}/restarts"
BACKOFF_LIMIT = f"{PREFIX}/backoff-limit"
SCHEDULE_TIMEOUT = f"{PREFIX}/schedule-timeout-seconds"
SUCCESS_POLICY = f"{PREFIX}/success-policy"
REPLICAS = f"{PREFIX}/replicas"
DEADLINE = f"{PREFIX}/deadline"

DEFAULT_SCHEDULE_TIMEOUT = 300.0
DEFAULT_USER = 1000
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915")

POD_OPTIONS = {
    "node_selector": "{label: value} the nodes must carry",
    "tolerations": "list of Kubernetes tolerations ({key, operator, value, effect, tolerationSeconds})",
    "affinity": "a Kubernetes affinity object ({nodeAffinity, podAffinity, podAntiAffinity})",
    "service_account": "service account the pods run as",
    "image_pull_secrets": "names of docker-registry Secrets for private images",
    "image_pull_policy": "Always, IfNotPresent or Never",
    "env_from": "list of {secret: NAME} or {config_map: NAME} (optional prefix) exported as environment",
    "secret_env": "{VAR: {secret: NAME, key: KEY}}: one variable from one Secret key",
    "volumes": "list of {claim: PVC, mount_path: /path, read_only: bool, sub_path: str}",
    "schedule_timeout_seconds": f"fail when a pod stays unschedulable this long (default {DEFAULT_SCHEDULE_TIMEOUT:.0f})",
    "run_as_user": f"numeric user id of the training process (default {DEFAULT_USER}; never root)",
    "fs_group": "group id owning mounted volumes (default: run_as_user)",
    "annotations": "extra pod annotations {key: value}",
    "priority_class": "PriorityClass name",
}
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
_AFFINITY_KEYS = {"nodeAffinity", "podAffinity", "podAntiAffinity"}
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_RESERVED_ENV = ("TF_CONFIG",)


@dataclass
class PodOptions:
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)
    affinity: dict | None = None
    service_account: str | None = None
    image_pull_secrets: list[str] = field(default_factory=list)
    image_pull_policy: str | None = None
    env_from: list[dict] = field(default_factory=list)
    secret_env: dict[str, dict[str, str]] = field(default_factory=dict)
    volumes: list[dict] = field(default_factory=list)
    schedule_timeout_seconds: float = DEFAULT_SCHEDULE_TIMEOUT
    run_as_user: int = DEFAULT_USER
    fs_group: int | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    priority_class: str | None = None


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def pod_options(role: str, options: dict[str, Any]) -> PodOptions:
    """Validate one role's Kubernetes settings; every problem is reported at once."""
    where = f"roles.{role}.kubernetes"
    errors: list[str] = []
    unknown = sorted(set(options) - set(POD_OPTIONS))
    for key in unknown:
        errors.append(f"{where}.{key}: unknown setting; the settings are: "
                      + "; ".join(f"{k} ({doc})" for k, doc in POD_OPTIONS.items()))
    o = {k: v for k, v in options.items() if k in POD_OPTIONS}

    if "node_selector" in o and not _is_str_map(o["node_selector"]):
        errors.append(f"{where}.node_selector: must map label names to string values, e.g. "
                      '{"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}')
    if "tolerations" in o:
        tolerations = o["tolerations"]
        if not isinstance(tolerations, list) or not all(isinstance(t, dict) for t in tolerations):
            errors.append(f"{where}.tolerations: must be a list of Kubernetes tolerations")
        else:
            for i, t in enumerate(tolerations):
                bad = sorted(set(t) - _TOLERATION_KEYS)
                if bad:
                    errors.append(f"{where}.tolerations[{i}]: unknown field(s) {', '.join(bad)}; "
                                  f"a toleration has {', '.join(sorted(_TOLERATION_KEYS))}")
    if "affinity" in o and (not isinstance(o["affinity"], dict) or set(o["affinity"]) - _AFFINITY_KEYS):
        errors.append(f"{where}.affinity: must be a Kubernetes affinity object with "
                      f"{', '.join(sorted(_AFFINITY_KEYS))}")
    for key in ("service_account", "priority_class"):
        if key in o and (not isinstance(o[key], str) or not o[key]):
            errors.append(f"{where}.{key}: must be a non-empty name")
    if "image_pull_secrets" in o and (not isinstance(o["image_pull_secrets"], list)
                                      or not all(isinstance(s, str) and s for s in o["image_pull_secrets"])):
        errors.append(f"{where}.image_pull_secrets: must be a list of Secret names")
    if "image_pull_policy" in o and o["image_pull_policy"] not in _PULL_POLICIES:
        errors.append(f"{where}.image_pull_policy: {o['image_pull_policy']!r} is not one of {', '.join(_PULL_POLICIES)}")
    if "env_from" in o:
        sources = o["env_from"] if isinstance(o["env_from"], list) else []
        if not isinstance(o["env_from"], list):
            errors.append(f"{where}.env_from: must be a list of {{secret: NAME}} or {{config_map: NAME}}")
        for i, source in enumerate(sources):
            kinds = [k for k in ("secret", "config_map") if isinstance(source, dict) and k in source]
            extra = sorted(set(source) - {"secret", "config_map", "prefix"}) if isinstance(source, dict) else []
            if len(kinds) != 1 or extra or not isinstance(source[kinds[0]], str):
                errors.append(f"{where}.env_from[{i}]: must be {{secret: NAME}} or {{config_map: NAME}} "
                              "(with an optional prefix); secret values are referenced, never written inline")
    if "secret_env" in o:
        entries = o["secret_env"] if isinstance(o["secret_env"], dict) else {}
        if not isinstance(o["secret_env"], dict):
            errors.append(f"{where}.secret_env: must map VAR to {{secret: NAME, key: KEY}}")
        for var, ref in entries.items():
            if not _ENV_NAME.match(str(var)):
                errors.append(f"{where}.secret_env.{var}: not a valid environment variable name")
            if not isinstance(ref, dict) or set(ref) != {"secret", "key"} or not all(isinstance(v, str) and v for v in ref.values()):
                errors.append(f"{where}.secret_env.{var}: must be {{secret: NAME, key: KEY}}")
    if "volumes" in o:
        volumes = o["volumes"] if isinstance(o["volumes"], list) else []
        if not isinstance(o["volumes"], list):
            errors.append(f"{where}.volumes: must be a list of {{claim: PVC, mount_path: /path}}")
        paths = set()
        for i, v in enumerate(volumes):
            if not isinstance(v, dict):
                errors.append(f"{where}.volumes[{i}]: must be {{claim: PVC, mount_path: /path}}")
                continue
            extra = sorted(set(v) - {"claim", "mount_path", "read_only", "sub_path"})
            if extra:
                errors.append(f"{where}.volumes[{i}]: unknown field(s) {', '.join(extra)}; "
                              "use claim, mount_path, read_only, sub_path")
            if not isinstance(v.get("claim"), str) or not v.get("claim"):
                errors.append(f"{where}.volumes[{i}].claim: the PersistentVolumeClaim name is required")
            path = v.get("mount_path")
            if not isinstance(path, str) or not path.startswith("/"):
                errors.append(f"{where}.volumes[{i}].mount_path: an absolute path inside the container is required")
            elif path in paths:
                errors.append(f"{where}.volumes[{i}].mount_path: {path} is mounted twice")
            paths.add(path)
            if "read_only" in v and not isinstance(v["read_only"], bool):
                errors.append(f"{where}.volumes[{i}].read_only: must be true or false")
    if "schedule_timeout_seconds" in o:
        value = o["schedule_timeout_seconds"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            errors.append(f"{where}.schedule_timeout_seconds: must be a positive number of seconds")
    for key in ("run_as_user", "fs_group"):
        if key in o and (isinstance(o[key], bool) or not isinstance(o[key], int) or o[key] <= 0):
            errors.append(f"{where}.{key}: must be a positive numeric id (pods never run as root)")
    if "annotations" in o and not _is_str_map(o["annotations"]):
        errors.append(f"{where}.annotations: must map annotation keys to string values")
    if errors:
        raise SpecError("invalid Kubernetes settings:\n  " + "\n  ".join(errors))
    return PodOptions(**o)


def _resources(role: str, resources: dict[str, Any]) -> dict[str, dict[str, str]]:
    where = f"roles.{role}.resources"
    errors = []
    if not isinstance(resources, dict) or set(resources) - {"requests", "limits"}:
        raise SpecError(f"{where}: must be {{requests: {{...}}, limits: {{...}}}} as in Kubernetes")
    out: dict[str, dict[str, str]] = {}
    for kind, amounts in resources.items():
        if not isinstance(amounts, dict):
            errors.append(f"{where}.{kind}: must map resource names to quantities, e.g. {{cpu: '2', memory: 4Gi}}")
            continue
        out[kind] = {}
        for name, amount in amounts.items():
            if isinstance(amount, bool) or not isinstance(amount, (str, int, float)) or str(amount).strip() == "":
                errors.append(f"{where}.{kind}.{name}: {amount!r} is not a quantity")
            else:
                out[kind][str(name)] = str(amount)
    for gpu in GPU_RESOURCES:
        if gpu in out.get("requests", {}) and out["requests"][gpu] != out.get("limits", {}).get(gpu):
            errors.append(f"{where}.limits.{gpu}: Kubernetes schedules GPUs by their limit; "
                          f"set limits.{gpu} (requests may be left out)")
    if errors:
        raise SpecError("invalid resources:\n  " + "\n  ".join(errors))
    return out


def uses_gpu(resources: dict[str, dict[str, str]]) -> bool:
    return any(gpu in resources.get("limits", {}) for gpu in GPU_RESOURCES)


def group_selector(group: str, role: str | None = None) -> str:
    selector = f"{GROUP_LABEL}={group}"
    return f"{selector},{ROLE_LABEL}={role}" if role else selector


def task_address(task: str, namespace: str, port: int, cluster_domain: str | None = None) -> str:
    """``<task>.<namespace>.svc[.<cluster domain>]:<port>``: the task's headless Service."""
    host = f"{task}.{namespace}.svc" + (f".{cluster_domain}" if cluster_domain else "")
    return f"{host}:{port}"


def _extra_labels(spec: GroupSpec) -> tuple[dict[str, str], dict[str, str]]:
    """Airflow ids (dag_id, task_id, run_id, try_number ...) as labels (sanitized, for
    selectors) and as annotations (verbatim, for people reading ``kubectl describe``)."""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for key, value in spec.labels.items():
        if not _LABEL_KEY.match(str(key)) or str(key).startswith(f"{PREFIX}/"):
            raise SpecError(f"labels.{key}: not a usable Kubernetes label key "
                            "(letters, digits, '-', '_', '.', at most 63 characters, optional DNS prefix)")
        labels[key] = label_value(str(value))
        annotations[f"{PREFIX}/{key.rpartition('/')[2]}"] = str(value)
    return labels, annotations


class _Renderer:
    def __init__(self) -> None:
        self.env = SandboxedEnvironment(
            loader=FileSystemLoader(str(TEMPLATES)),
            undefined=StrictUndefined,
            finalize=to_yaml_value,
            autoescape=False,
            keep_trailing_newline=True,
        )

    def render(self, template: str, **values: Any) -> list[dict]:
        text = self.env.get_template(template).render(**values)
        return [doc for doc in yaml.safe_load_all(text) if doc]


def to_yaml_value(value: Any) -> str:
    """JSON for one template value, safe as a YAML scalar or flow collection.

    Non-ASCII characters of the Basic Multilingual Plane are escaped (YAML would fold
    U+2028 and U+0085 as line breaks); characters beyond it stay literal, because YAML
    readers do not join JSON's surrogate-pair escapes back into one character."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return re.sub(r"[^\x20-\x7e\U00010000-\U0010ffff]", lambda m: f"\\u{ord(m.group()):04x}", text)


_renderer: _Renderer | None = None


def _render(template: str, **values: Any) -> list[dict]:
    global _renderer
    if _renderer is None:
        _renderer = _Renderer()
    return _renderer.render(template, **values)


def render_group(spec: GroupSpec, namespace: str, *, cluster_domain: str | None = None,
                 network_policy: bool = False, pod_defaults: dict[str, Any] | None = None,
                 now: dt.datetime | None = None) -> list[dict]:
    """Every object of the group, in creation order: NetworkPolicy (if asked), Services, pods."""
    if not namespace or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", namespace) or len(namespace) > 63:
        raise SpecError(f"namespace: {namespace!r} is not a Kubernetes namespace name (a DNS-1123 label)")
    if spec.image is None and any(spec.roles[r].image is None for r, _ in spec.tasks()):
        raise SpecError("image: the Kubernetes backend needs a container image "
                        "(set the group's image, or an image on every role)")
    options = {role: pod_options(role, {**(pod_defaults or {}), **(spec.roles[role].kubernetes or {})})
               for role in spec.roles if spec.replicas(role)}
    resources = {role: _resources(role, spec.roles[role].resources) for role in options}
    for role in options:
        clash = [var for var in _RESERVED_ENV if var in spec.roles[role].env or var in options[role].secret_env]
        if clash:
            raise SpecError(f"roles.{role}.env.{clash[0]}: set by the backend for every task; remove it")

    cluster = cluster_def(spec, lambda role, index: task_address(
        task_name(spec.name, role, index), namespace, spec.port, cluster_domain))
    extra_labels, extra_annotations = _extra_labels(spec)
    deadline = None
    if spec.active_deadline_seconds:
        start = now or dt.datetime.now(dt.timezone.utc)
        deadline = (start + dt.timedelta(seconds=spec.active_deadline_seconds)).isoformat(timespec="milliseconds")
    replicas = json.dumps({role: spec.replicas(role) for role in spec.roles if spec.replicas(role)}, sort_keys=True)

    objects: list[dict] = []
    if network_policy:
        objects += _render("networkpolicy.yaml.j2", name=f"{spec.name}-grpc", namespace=namespace,
                           labels={GROUP_LABEL: spec.name, **extra_labels},
                           selector={GROUP_LABEL: spec.name}, port=spec.port)
    pods: list[dict] = []
    for role, index in spec.tasks():
        name = task_name(spec.name, role, index)
        selector = {GROUP_LABEL: spec.name, ROLE_LABEL: role, INDEX_LABEL: str(index)}
        labels = {**extra_labels, **selector}
        objects += _render("service.yaml.j2", name=name, namespace=namespace, labels=labels,
                           selector=selector, port=spec.port)
        role_spec, opts = spec.roles[role], options[role]
        env = [{"name": "TF_CONFIG", "value": tf_config_json(cluster, role, index)},
               # Progress lines must reach the pod log as they are written, not at exit.
               {"name": "PYTHONUNBUFFERED", "value": "1"}]
        if not uses_gpu(resources[role]):
            # A task without a GPU limit stays on the CPU even on a GPU node whose
            # runtime exposes every device (parameter servers by default).
            env.append({"name": "CUDA_VISIBLE_DEVICES", "value": ""})
        env += [{"name": k, "value": str(v)} for k, v in role_spec.env.items()]
        env += [{"name": var, "valueFrom": {"secretKeyRef": {"name": ref["secret"], "key": ref["key"]}}}
                for var, ref in opts.secret_env.items()]
        env_from = [{**({"prefix": s["prefix"]} if "prefix" in s else {}),
                     **({"secretRef": {"name": s["secret"]}} if "secret" in s
                        else {"configMapRef": {"name": s["config_map"]}})}
                    for s in opts.env_from]
        annotations = {
            **opts.annotations, **extra_annotations,
            RESTART_POLICY: role_spec.restart_policy, RESTARTS: "0", BACKOFF_LIMIT: str(spec.backoff_limit),
            SCHEDULE_TIMEOUT: f"{float(opts.schedule_timeout_seconds):g}", SUCCESS_POLICY: spec.success_policy,
            REPLICAS: replicas,
        }
        if deadline:
            annotations[DEADLINE] = deadline
        pods += _render(
            "pod.yaml.j2", name=name, namespace=namespace, labels=labels, annotations=annotations,
            role=role, image=role_spec.image or spec.image, command=spec.command(role), env=env,
            env_from=env_from, resources=resources[role], port=spec.port,
            volumes=opts.volumes, node_selector=opts.node_selector, tolerations=opts.tolerations,
            affinity=opts.affinity, service_account=opts.service_account,
            image_pull_secrets=opts.image_pull_secrets, image_pull_policy=opts.image_pull_policy,
            run_as_user=opts.run_as_user, fs_group=opts.fs_group or opts.run_as_user,
            priority_class=opts.priority_class,
            active_deadline_seconds=math.ceil(spec.active_deadline_seconds) if spec.active_deadline_seconds else None,
        )
    return objects + pods


def to_yaml(objects: list[dict]) -> str:
    """Multi-document YAML for ``kubectl apply -f -``."""
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, explicit_start=True)
