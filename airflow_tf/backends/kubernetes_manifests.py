"""The Kubernetes objects of a training group, rendered from the Jinja templates in
``templates/``: one Indexed ``batch/v1`` Job per role, one headless Service (the pods'
subdomain), and optionally a NetworkPolicy.

Lifecycle (Kubernetes 1.31 or newer): the Job controller runs, restarts and fails the
tasks, also while no Airflow component runs. ``backoffLimitPerIndex`` is each task's
restart budget; ``podFailurePolicy`` does not count disruptions (preemption, eviction:
the ``DisruptionTarget`` condition) and, under the ``ExitCode`` restart policy, fails the
Job at once on a program error (exit codes 1-128, e.g. a refused model); ``maxFailedIndexes:
0`` fails it as soon as one task is out of restarts. The lead trainer's Job (the chief's,
else the workers') is the group's **root**: every other object has an ownerReference to
it, so deleting it (propagation Background) removes everything, and its
``ttlSecondsAfterFinished`` removes the whole group, parameter servers included, a while
after training ended even if Airflow never comes back. The parameter servers' Job never
completes by itself; its ``activeDeadlineSeconds`` (the group's deadline, else
``ps_max_lifetime_seconds``) bounds it when the root never finishes either.

Rendering happens in a sandboxed Jinja environment where an undefined variable is an
error, and every ``{{ ... }}`` value is written as JSON (the environment's ``finalize``):
a JSON string is a YAML double-quoted scalar, so no user string (a DAG id, an env value,
an image name) can end a value and start a new YAML key. The rendered YAML is read back
with ``yaml.safe_load_all``; those dicts are what the backend sends to the API server and
what ``airflow-tf render`` prints (the backend adds only the ownerReferences, which need
the root's uid).

Pod settings that only Kubernetes understands come from ``RoleSpec.kubernetes`` (merged
over the backend's ``pod_defaults``); :data:`POD_OPTIONS` lists the keys and
:func:`pod_options` validates them with errors that name the role and the key.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

from airflow_tf.cluster import GroupSpec, SpecError, cluster_def, label_value, task_name

TEMPLATES = Path(__file__).with_name("templates")

# Labels and annotations. The group/role labels find and count tasks; the annotations
# carry what status() needs to judge the group without the spec.
PREFIX = "airflow-tf"
GROUP_LABEL = f"{PREFIX}/group"
ROLE_LABEL = f"{PREFIX}/role"
COMPONENT_LABEL = f"{PREFIX}/component"
ROOT_ANNOTATION = f"{PREFIX}/root"
SCHEDULE_TIMEOUT = f"{PREFIX}/schedule-timeout-seconds"
SUCCESS_POLICY = f"{PREFIX}/success-policy"
REPLICAS = f"{PREFIX}/replicas"
RESTART_POLICY = f"{PREFIX}/restart-policy"
# Set by the Job controller on every pod of an Indexed Job (label since Kubernetes 1.28).
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

DEFAULT_SCHEDULE_TIMEOUT = 300.0
DEFAULT_USER = 1000
DEFAULT_TTL_SECONDS_AFTER_FINISHED = 3600
DEFAULT_PS_MAX_LIFETIME_SECONDS = 7 * 24 * 3600
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915")
USER_ERROR_EXIT_CODES = list(range(1, 129))
"""Exit codes of a program error under the ``ExitCode`` policy; above 128 is death by a signal."""

POD_OPTIONS = {
    "node_selector": "{label: value} the nodes must carry",
    "tolerations": "list of Kubernetes tolerations ({key, operator, value, effect, tolerationSeconds})",
    "affinity": "a Kubernetes affinity object ({nodeAffinity, podAffinity, podAntiAffinity})",
    "service_account": "service account the pods run as",
    "image_pull_secrets": "names of docker-registry Secrets for private images",
    "image_pull_policy": "Always, IfNotPresent or Never",
    "env_from": "list of {secret: NAME} or {config_map: NAME} (optional prefix) exported as environment",
    "secret_env": "{VAR: {secret: NAME, key: KEY}}: one variable from one Secret key",
    "volumes": "list of {claim|secret|config_map|empty_dir: ..., mount_path: /path, read_only, sub_path}",
    "shm_size": "size of a memory-backed /dev/shm (e.g. 1Gi)",
    "init_containers": "list of Kubernetes containers run before the task",
    "sidecars": "list of Kubernetes containers running beside the task (native sidecars)",
    "schedule_timeout_seconds": f"fail when a pod stays unschedulable this long (default {DEFAULT_SCHEDULE_TIMEOUT:.0f})",
    "run_as_user": f"numeric user id of the training process (default {DEFAULT_USER}; never root)",
    "fs_group": "group id owning mounted volumes (default: run_as_user)",
    "labels": "extra labels {key: value} on the Jobs and pods",
    "annotations": "extra annotations {key: value} on the Jobs and pods",
    "queue_name": f"Kueue LocalQueue: sets {KUEUE_QUEUE_LABEL} and creates the Jobs suspended for Kueue to admit",
    "priority_class": "PriorityClass name",
    "pod_template": "a Pod manifest (object, or path of a YAML file) merged under what the backend sets",
}
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
_AFFINITY_KEYS = {"nodeAffinity", "podAffinity", "podAntiAffinity"}
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# The image reference grammar of the distribution project: [host[:port]/]path[:tag][@digest].
_IMAGE = re.compile(
    r"^(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*"
    r"(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
_QUANTITY = re.compile(r"^\+?(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_RESERVED_ENV = ("TF_CONFIG", "JOB_COMPLETION_INDEX")
_VOLUME_SOURCES = ("claim", "secret", "config_map", "empty_dir")


def check_image(image: Any, where: str) -> str:
    """An image reference as the container runtime parses it, or a SpecError."""
    if not isinstance(image, str) or len(image) > 4096 or not _IMAGE.match(image):
        raise SpecError(f"{where}: {image!r} is not a container image reference "
                        "([registry[:port]/]repository[:tag][@sha256:digest], e.g. registry.example/tf:2.21)")
    return image


def check_dns_subdomain(value: Any, where: str, what: str) -> str:
    if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise SpecError(f"{where}: {value!r} is not a valid {what} (lowercase letters, digits, '-' and '.', "
                        "at most 253 characters, starting and ending with a letter or digit)")
    return value


def check_cluster_domain(value: Any) -> str | None:
    if value is None:
        return None
    return check_dns_subdomain(value, "cluster_domain", "cluster domain (e.g. cluster.local, no trailing dot)")


def check_namespace(namespace: Any) -> str:
    if not isinstance(namespace, str) or not _DNS_LABEL.match(namespace):
        raise SpecError(f"namespace: {namespace!r} is not a Kubernetes namespace name (a DNS-1123 label)")
    return namespace


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
    shm_size: str | None = None
    init_containers: list[dict] = field(default_factory=list)
    sidecars: list[dict] = field(default_factory=list)
    schedule_timeout_seconds: float = DEFAULT_SCHEDULE_TIMEOUT
    run_as_user: int = DEFAULT_USER
    fs_group: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    queue_name: str | None = None
    priority_class: str | None = None
    pod_template: dict | None = None


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _load_pod_template(value: Any, where: str) -> dict:
    """A Pod manifest from an object or a YAML file (like the provider's pod_template_file)."""
    if isinstance(value, str):
        try:
            value = yaml.safe_load(Path(value).read_text())
        except OSError as e:
            raise SpecError(f"{where}: cannot read the pod template file {value}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise SpecError(f"{where}: the pod template file is not valid YAML: {e}") from None
    if not isinstance(value, dict) or set(value) - {"apiVersion", "kind", "metadata", "spec"} \
            or value.get("kind", "Pod") != "Pod" or not isinstance(value.get("spec", {}), dict):
        raise SpecError(f"{where}: must be a Pod manifest {{apiVersion: v1, kind: Pod, metadata, spec}}")
    return value


def _check_containers(containers: Any, where: str, errors: list[str]) -> None:
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        errors.append(f"{where}: must be a list of Kubernetes containers ({{name, image, command, ...}})")
        return
    for i, c in enumerate(containers):
        if not isinstance(c.get("name"), str) or not _DNS_LABEL.match(c["name"]):
            errors.append(f"{where}[{i}].name: a DNS-1123 label is required")
        try:
            check_image(c.get("image"), f"{where}[{i}].image")
        except SpecError as e:
            errors.append(str(e))


def _check_volumes(volumes: Any, where: str, errors: list[str]) -> None:
    if not isinstance(volumes, list):
        errors.append(f"{where}: must be a list of {{claim|secret|config_map|empty_dir: ..., mount_path: /path}}")
        return
    paths = set()
    for i, v in enumerate(volumes):
        if not isinstance(v, dict):
            errors.append(f"{where}[{i}]: must be {{claim: PVC, mount_path: /path}} (or secret, config_map, empty_dir)")
            continue
        extra = sorted(set(v) - {*_VOLUME_SOURCES, "mount_path", "read_only", "sub_path"})
        if extra:
            errors.append(f"{where}[{i}]: unknown field(s) {', '.join(extra)}; "
                          f"use one of {', '.join(_VOLUME_SOURCES)}, and mount_path, read_only, sub_path")
        sources = [s for s in _VOLUME_SOURCES if s in v]
        if len(sources) != 1:
            errors.append(f"{where}[{i}]: exactly one of claim (a PersistentVolumeClaim name), secret, "
                          "config_map or empty_dir is required")
        elif sources[0] == "empty_dir":
            empty = v["empty_dir"]
            if not isinstance(empty, dict) or set(empty) - {"medium", "size_limit"} \
                    or empty.get("medium", "") not in ("", "Memory"):
                errors.append(f"{where}[{i}].empty_dir: must be {{}} or {{medium: Memory, size_limit: 1Gi}}")
            elif "size_limit" in empty:
                _quantity(empty["size_limit"], f"{where}[{i}].empty_dir.size_limit", errors)
        else:
            name = v[sources[0]]
            if not isinstance(name, str) or not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
                errors.append(f"{where}[{i}].{sources[0]}: {name!r} is not a Kubernetes object name")
        path = v.get("mount_path")
        if not isinstance(path, str) or not path.startswith("/"):
            errors.append(f"{where}[{i}].mount_path: an absolute path inside the container is required")
        elif path in paths:
            errors.append(f"{where}[{i}].mount_path: {path} is mounted twice")
        paths.add(path)
        if "read_only" in v and not isinstance(v["read_only"], bool):
            errors.append(f"{where}[{i}].read_only: must be true or false")


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
    for key, what in (("service_account", "service account name"), ("priority_class", "PriorityClass name")):
        if key in o:
            try:
                check_dns_subdomain(o[key], f"{where}.{key}", what)
            except SpecError as e:
                errors.append(str(e))
    if "queue_name" in o and (not isinstance(o["queue_name"], str) or not _LABEL_VALUE.match(o["queue_name"])
                              or not o["queue_name"]):
        errors.append(f"{where}.queue_name: {o['queue_name']!r} is not a Kueue LocalQueue name (a label value)")
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
        _check_volumes(o["volumes"], f"{where}.volumes", errors)
    if "shm_size" in o:
        o["shm_size"] = _quantity(o["shm_size"], f"{where}.shm_size", errors)
    for key in ("init_containers", "sidecars"):
        if key in o:
            _check_containers(o[key], f"{where}.{key}", errors)
    if "schedule_timeout_seconds" in o:
        value = o["schedule_timeout_seconds"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            errors.append(f"{where}.schedule_timeout_seconds: must be a positive number of seconds")
    for key in ("run_as_user", "fs_group"):
        if key in o and (isinstance(o[key], bool) or not isinstance(o[key], int) or o[key] <= 0):
            errors.append(f"{where}.{key}: must be a positive numeric id (pods never run as root)")
    for key in ("labels", "annotations"):
        if key in o:
            if not _is_str_map(o[key]):
                errors.append(f"{where}.{key}: must map keys to string values")
                continue
            for k, v in o[key].items():
                if not _LABEL_KEY.match(k) or k.startswith(f"{PREFIX}/"):
                    errors.append(f"{where}.{key}.{k}: not a usable Kubernetes key (optional DNS prefix, "
                                  f"a name of at most 63 characters; {PREFIX}/ is reserved)")
                elif key == "labels" and not _LABEL_VALUE.match(v):
                    errors.append(f"{where}.labels.{k}: {v!r} is not a label value (at most 63 characters "
                                  "of letters, digits, '-', '_', '.')")
    if "pod_template" in o:
        try:
            o["pod_template"] = _load_pod_template(o["pod_template"], f"{where}.pod_template")
        except SpecError as e:
            errors.append(str(e))
    if errors:
        raise SpecError("invalid Kubernetes settings:\n  " + "\n  ".join(errors))
    return PodOptions(**o)


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal(10**3),
            "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18)}


def _quantity(amount: Any, where: str, errors: list[str]) -> str:
    """A Kubernetes resource quantity (never negative) as its string, or an error added."""
    text = str(amount).strip() if not isinstance(amount, bool) and isinstance(amount, (str, int, float)) else ""
    if isinstance(amount, float) and not math.isfinite(amount):
        text = ""
    match = _QUANTITY.match(text)
    if not match:
        errors.append(f"{where}: {amount!r} is not a Kubernetes quantity (>= 0, e.g. 2, 500m, 4Gi)")
    return text


def quantity_value(text: str) -> Decimal:
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(text)
    number, suffix = Decimal(match["number"]), match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * (Decimal(10) ** int(suffix[1:])) if suffix else number


def _resources(role: str, resources: dict[str, Any]) -> dict[str, dict[str, str]]:
    where = f"roles.{role}.resources"
    errors: list[str] = []
    if not isinstance(resources, dict) or set(resources) - {"requests", "limits"}:
        raise SpecError(f"{where}: must be {{requests: {{...}}, limits: {{...}}}} as in Kubernetes")
    out: dict[str, dict[str, str]] = {}
    for kind, amounts in resources.items():
        if not isinstance(amounts, dict):
            errors.append(f"{where}.{kind}: must map resource names to quantities, e.g. {{cpu: '2', memory: 4Gi}}")
            continue
        out[kind] = {}
        for name, amount in amounts.items():
            if not isinstance(name, str) or not _LABEL_KEY.match(name):
                errors.append(f"{where}.{kind}.{name}: not a resource name (e.g. cpu, memory, nvidia.com/gpu)")
                continue
            text = _quantity(amount, f"{where}.{kind}.{name}", errors)
            if name in GPU_RESOURCES and _QUANTITY.match(text) and quantity_value(text) != int(quantity_value(text)):
                errors.append(f"{where}.{kind}.{name}: {amount!r} GPUs; a GPU count is a whole number >= 0")
            out[kind][name] = text
    for gpu in GPU_RESOURCES:
        if gpu in out.get("requests", {}) and out["requests"][gpu] != out.get("limits", {}).get(gpu):
            errors.append(f"{where}.limits.{gpu}: Kubernetes schedules GPUs by their limit; "
                          f"set limits.{gpu} (requests may be left out)")
    if errors:
        raise SpecError("invalid resources:\n  " + "\n  ".join(errors))
    return out


def uses_gpu(resources: dict[str, dict[str, str]]) -> bool:
    return any(gpu in resources.get("limits", {}) and quantity_value(resources["limits"][gpu]) > 0
               for gpu in GPU_RESOURCES)


def group_selector(group: str, role: str | None = None) -> str:
    selector = f"{GROUP_LABEL}={group}"
    return f"{selector},{ROLE_LABEL}={role}" if role else selector


def job_name(group: str, role: str) -> str:
    """``<group>-<role>``: its pods' hostnames are ``<group>-<role>-<index>``, the task names."""
    return f"{group}-{role}"


def service_name(group: str) -> str:
    """The group's headless Service: a Service name must start with a letter (DNS-1035)."""
    return group if group[:1].isalpha() else f"g{group}"


def root_role(spec: GroupSpec) -> str:
    """The role whose Job is the group's root: the chief's, else the workers'."""
    return "chief" if spec.replicas("chief") else "worker"


def task_address(group: str, role: str, index: int, namespace: str, port: int, cluster_domain: str | None = None) -> str:
    """``<job>-<index>.<service>.<namespace>.svc[.<cluster domain>]:<port>``."""
    host = f"{task_name(group, role, index)}.{service_name(group)}.{namespace}.svc" + (
        f".{cluster_domain}" if cluster_domain else "")
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


def _volumes(opts: PodOptions) -> tuple[list[dict], list[dict]]:
    """(pod volumes, container mounts) for the role's volumes and /dev/shm."""
    volumes, mounts = [], []
    for i, v in enumerate(opts.volumes):
        name = f"volume-{i}"
        if "claim" in v:
            source = {"persistentVolumeClaim": {"claimName": v["claim"], "readOnly": bool(v.get("read_only", False))}}
        elif "secret" in v:
            source = {"secret": {"secretName": v["secret"]}}
        elif "config_map" in v:
            source = {"configMap": {"name": v["config_map"]}}
        else:
            empty = v["empty_dir"]
            source = {"emptyDir": {**({"medium": "Memory"} if empty.get("medium") else {}),
                                   **({"sizeLimit": str(empty["size_limit"])} if "size_limit" in empty else {})}}
        volumes.append({"name": name, **source})
        mount = {"name": name, "mountPath": v["mount_path"],
                 "readOnly": bool(v.get("read_only", "secret" in v or "config_map" in v))}
        if "sub_path" in v:
            mount["subPath"] = str(v["sub_path"])
        mounts.append(mount)
    if opts.shm_size:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": opts.shm_size}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def _merge_named(under: list[dict], over: list[dict]) -> list[dict]:
    """Lists of named items (containers, volumes, env): ``over`` wins by name, order kept."""
    names = {item.get("name") for item in over}
    return [item for item in under if item.get("name") not in names] + over


def merge_pod_template(template: dict, pod: dict) -> dict:
    """The backend's pod (metadata + spec) merged over a user's Pod manifest.

    What the backend sets wins; the template adds. Its container named like the role (or
    ``base``, the provider's convention) is merged under the task's container; other
    containers stay as they are (sidecars); volumes, env and tolerations are joined by name."""
    result = copy.deepcopy(pod)
    t_meta, t_spec = template.get("metadata") or {}, copy.deepcopy(template.get("spec") or {})
    for key in ("labels", "annotations"):
        result["metadata"][key] = {**(t_meta.get(key) or {}), **result["metadata"].get(key, {})}
    main = result["spec"]["containers"][0]
    t_containers = t_spec.pop("containers", None) or []
    t_main = next((c for c in t_containers if c.get("name") in (main["name"], "base")), None)
    if t_main is not None:
        merged = {**t_main, **main, "name": main["name"]}
        for key in ("env", "volumeMounts", "ports"):
            if t_main.get(key) or main.get(key):
                merged[key] = _merge_named(t_main.get(key) or [], main.get(key) or [])
        for kind in ("requests", "limits"):
            amounts = {**(t_main.get("resources") or {}).get(kind, {}), **main.get("resources", {}).get(kind, {})}
            if amounts:
                merged.setdefault("resources", {})[kind] = amounts
        main = merged
    result["spec"]["containers"] = [main] + [c for c in t_containers if c is not t_main]
    for key in ("volumes", "initContainers"):
        if t_spec.get(key) or result["spec"].get(key):
            result["spec"][key] = _merge_named(t_spec.pop(key, None) or [], result["spec"].get(key) or [])
    if t_spec.get("tolerations"):
        result["spec"]["tolerations"] = t_spec.pop("tolerations") + result["spec"].get("tolerations", [])
    for key in ("nodeSelector",):
        if t_spec.get(key):
            result["spec"][key] = {**t_spec.pop(key), **result["spec"].get(key, {})}
    for key in ("securityContext",):
        if t_spec.get(key):
            result["spec"][key] = {**t_spec.pop(key), **result["spec"][key]}
    result["spec"] = {**t_spec, **result["spec"]}
    return result


def render_group(spec: GroupSpec, namespace: str, *, cluster_domain: str | None = None,
                 network_policy: bool = False, pod_defaults: dict[str, Any] | None = None,
                 ttl_seconds_after_finished: int | None = DEFAULT_TTL_SECONDS_AFTER_FINISHED,
                 ps_max_lifetime_seconds: int = DEFAULT_PS_MAX_LIFETIME_SECONDS) -> list[dict]:
    """Every object of the group, in creation order: the root Job (the lead trainer's),
    the headless Service, the NetworkPolicy (if asked), the other Jobs."""
    check_namespace(namespace)
    check_cluster_domain(cluster_domain)
    if spec.image is None and any(spec.roles[r].image is None for r, _ in spec.tasks()):
        raise SpecError("image: the Kubernetes backend needs a container image "
                        "(set the group's image, or an image on every role)")
    for role in spec.roles:
        if spec.replicas(role):
            check_image(spec.roles[role].image or spec.image, f"roles.{role}.image" if spec.roles[role].image else "image")
    for key, value in (("ttl_seconds_after_finished", ttl_seconds_after_finished),
                       ("ps_max_lifetime_seconds", ps_max_lifetime_seconds)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise SpecError(f"{key}: must be a whole number of seconds >= 0, got {value!r}")
    options = {role: pod_options(role, {**(pod_defaults or {}), **(spec.roles[role].kubernetes or {})})
               for role in spec.roles if spec.replicas(role)}
    resources = {role: _resources(role, spec.roles[role].resources) for role in options}
    for role in options:
        clash = [var for var in _RESERVED_ENV if var in spec.roles[role].env or var in options[role].secret_env]
        if clash:
            raise SpecError(f"roles.{role}.env.{clash[0]}: set by the backend for every task; remove it")

    cluster = cluster_def(spec, lambda role, index: task_address(
        spec.name, role, index, namespace, spec.port, cluster_domain))
    extra_labels, extra_annotations = _extra_labels(spec)
    group_labels = {**extra_labels, GROUP_LABEL: spec.name}
    replicas = json.dumps({role: spec.replicas(role) for role in options}, sort_keys=True)
    root = root_role(spec)
    deadline = math.ceil(spec.active_deadline_seconds) if spec.active_deadline_seconds else None

    jobs: dict[str, dict] = {}
    for role in options:
        role_spec, opts = spec.roles[role], options[role]
        # The index comes from JOB_COMPLETION_INDEX (set by the Job controller): one
        # TF_CONFIG for every pod of the Job.
        tf_config = json.dumps({"cluster": cluster, "task": {"type": role}}, sort_keys=True)
        env = [{"name": "TF_CONFIG", "value": tf_config},
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
        volumes, volume_mounts = _volumes(opts)
        labels = {**opts.labels, **group_labels, ROLE_LABEL: role}
        job_labels = {**labels, **({KUEUE_QUEUE_LABEL: opts.queue_name} if opts.queue_name else {})}
        job_annotations = {**opts.annotations, **extra_annotations, SUCCESS_POLICY: spec.success_policy,
                           REPLICAS: replicas, RESTART_POLICY: role_spec.restart_policy}
        if role == root:
            job_annotations[ROOT_ANNOTATION] = "true"
        pod_annotations = {**opts.annotations, SCHEDULE_TIMEOUT: f"{float(opts.schedule_timeout_seconds):g}"}
        rules: list[dict] = [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
        if role_spec.restart_policy == "ExitCode":
            rules.append({"action": "FailJob", "onExitCodes": {
                "containerName": role, "operator": "In", "values": USER_ERROR_EXIT_CODES}})
        success_policy = None
        if spec.success_policy == "ChiefOrWorker0" and role == root:
            success_policy = {"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}
        init_containers = list(opts.init_containers) + [{**c, "restartPolicy": "Always"} for c in opts.sidecars]
        job = _render(
            "job.yaml.j2", name=job_name(spec.name, role), namespace=namespace, job_labels=job_labels,
            job_annotations=job_annotations, pod_labels=labels, pod_annotations=pod_annotations,
            replicas=spec.replicas(role),
            backoff_limit_per_index=0 if role_spec.restart_policy == "Never" else spec.backoff_limit,
            pod_failure_rules=rules, success_policy=success_policy,
            # Servers never complete by themselves: the ps, and the workers a coordinator drives.
            active_deadline_seconds=deadline or (ps_max_lifetime_seconds if role == "ps" or (
                role == "worker" and spec.training is not None and spec.training.mode == "coordinator") else None),
            ttl_seconds_after_finished=ttl_seconds_after_finished if role == root else None,
            suspend=opts.queue_name is not None, service=service_name(spec.name),
            role=role, image=role_spec.image or spec.image, command=spec.command(role), env=env,
            env_from=env_from, resources=resources[role], port=spec.port if role != "evaluator" else None,
            volumes=volumes, volume_mounts=volume_mounts, init_containers=init_containers,
            node_selector=opts.node_selector, tolerations=opts.tolerations, affinity=opts.affinity,
            service_account=opts.service_account,
            image_pull_secrets=[{"name": s} for s in opts.image_pull_secrets],
            image_pull_policy=opts.image_pull_policy, run_as_user=opts.run_as_user,
            fs_group=opts.fs_group or opts.run_as_user, priority_class=opts.priority_class,
        )[0]
        if opts.pod_template:
            job["spec"]["template"] = merge_pod_template(opts.pod_template, job["spec"]["template"])
        jobs[role] = job

    objects = [jobs.pop(root)]
    objects += _render("service.yaml.j2", name=service_name(spec.name), namespace=namespace, labels=group_labels,
                       selector={GROUP_LABEL: spec.name}, port=spec.port)
    if network_policy:
        objects += _render("networkpolicy.yaml.j2", name=f"{spec.name}-grpc", namespace=namespace,
                           labels=group_labels, selector={GROUP_LABEL: spec.name}, port=spec.port)
    return objects + list(jobs.values())


def owned_by(obj: dict, root: dict) -> dict:
    """``obj`` with an ownerReference to the root Job: garbage-collected with it."""
    meta = root["metadata"]
    reference = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"],
                 "blockOwnerDeletion": False}
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": [reference]}}


def to_yaml(objects: list[dict]) -> str:
    """Multi-document YAML for ``kubectl apply -f -``."""
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, explicit_start=True)
