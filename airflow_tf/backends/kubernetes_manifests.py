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
over the backend's ``pod_defaults``); :data:`POD_OPTION_TABLE` declares each key with its
meaning and its validator, and :func:`pod_options` runs them all, reporting every error at once,
each naming the role and the key.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

from airflow_tf.cluster import GroupSpec, RoleSpec, SpecError, cluster_def, label_value, task_name
from airflow_tf.cluster.spec import HEALTH_STARTUP_SECS

TEMPLATES = Path(__file__).with_name("templates")

# Labels and annotations. The group/role labels find and count tasks; the annotations
# carry what status() needs to judge the group without the spec.
PREFIX = "airflow-tf"
GROUP_LABEL = f"{PREFIX}/group"
ROLE_LABEL = f"{PREFIX}/role"
COMPONENT_LABEL = f"{PREFIX}/component"
ONE_OFF_LABEL = f"{PREFIX}/one-off"
"""On a one-off Job (evaluation, export, a prepare part) and its pod: the Job's name."""
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
PROBE_START_SECS = 10
"""Seconds a health probe gets beyond its question's deadline, to start Python and gRPC in the
container (a fraction of a second on an idle node)."""
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915")
USER_ERROR_EXIT_CODES = list(range(1, 129))
"""Exit codes of a program error under the ``ExitCode`` policy; above 128 is death by a signal."""

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


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


# -- the validators of POD_OPTIONS -------------------------------------------------------
# Each takes (value, where, errors), appends one message per problem (naming ``where``, the
# role's key) and returns the value to keep: what the user gave, or its normal form.

def _check_node_selector(value: Any, where: str, errors: list[str]) -> Any:
    if not _is_str_map(value):
        errors.append(f"{where}: must map label names to string values, e.g. "
                      '{"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}')
    return value


def _check_tolerations(value: Any, where: str, errors: list[str]) -> Any:
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        errors.append(f"{where}: must be a list of Kubernetes tolerations")
        return value
    for i, toleration in enumerate(value):
        bad = sorted(set(toleration) - _TOLERATION_KEYS)
        if bad:
            errors.append(f"{where}[{i}]: unknown field(s) {', '.join(bad)}; "
                          f"a toleration has {', '.join(sorted(_TOLERATION_KEYS))}")
    return value


def _check_affinity(value: Any, where: str, errors: list[str]) -> Any:
    if not isinstance(value, dict) or set(value) - _AFFINITY_KEYS:
        errors.append(f"{where}: must be a Kubernetes affinity object with {', '.join(sorted(_AFFINITY_KEYS))}")
    return value


def _object_name(what: str) -> Callable[[Any, str, list[str]], Any]:
    """A validator of a Kubernetes object name (a DNS-1123 subdomain) such as ``what``."""
    def check(value: Any, where: str, errors: list[str]) -> Any:
        try:
            check_dns_subdomain(value, where, what)
        except SpecError as e:
            errors.append(str(e))
        return value
    return check


def _check_image_pull_secrets(value: Any, where: str, errors: list[str]) -> Any:
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        errors.append(f"{where}: must be a list of Secret names")
    return value


def _check_image_pull_policy(value: Any, where: str, errors: list[str]) -> Any:
    if value not in _PULL_POLICIES:
        errors.append(f"{where}: {value!r} is not one of {', '.join(_PULL_POLICIES)}")
    return value


def _check_env_from(value: Any, where: str, errors: list[str]) -> Any:
    if not isinstance(value, list):
        errors.append(f"{where}: must be a list of {{secret: NAME}} or {{config_map: NAME}}")
        return value
    for i, source in enumerate(value):
        kinds = [k for k in ("secret", "config_map") if isinstance(source, dict) and k in source]
        extra = sorted(set(source) - {"secret", "config_map", "prefix"}) if isinstance(source, dict) else []
        if len(kinds) != 1 or extra or not isinstance(source[kinds[0]], str):
            errors.append(f"{where}[{i}]: must be {{secret: NAME}} or {{config_map: NAME}} "
                          "(with an optional prefix); secret values are referenced, never written inline")
    return value


def _check_secret_env(value: Any, where: str, errors: list[str]) -> Any:
    if not isinstance(value, dict):
        errors.append(f"{where}: must map VAR to {{secret: NAME, key: KEY}}")
        return value
    for var, ref in value.items():
        if not _ENV_NAME.match(str(var)):
            errors.append(f"{where}.{var}: not a valid environment variable name")
        if not isinstance(ref, dict) or set(ref) != {"secret", "key"} \
                or not all(isinstance(v, str) and v for v in ref.values()):
            errors.append(f"{where}.{var}: must be {{secret: NAME, key: KEY}}")
    return value


def _check_containers(containers: Any, where: str, errors: list[str]) -> Any:
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        errors.append(f"{where}: must be a list of Kubernetes containers ({{name, image, command, ...}})")
        return containers
    for i, c in enumerate(containers):
        if not isinstance(c.get("name"), str) or not _DNS_LABEL.match(c["name"]):
            errors.append(f"{where}[{i}].name: a DNS-1123 label is required")
        try:
            check_image(c.get("image"), f"{where}[{i}].image")
        except SpecError as e:
            errors.append(str(e))
    return containers


def _check_volume_source(volume: dict, where: str, errors: list[str]) -> None:
    """Exactly one source: a claim, Secret or ConfigMap by name, or an emptyDir."""
    sources = [s for s in _VOLUME_SOURCES if s in volume]
    if len(sources) != 1:
        errors.append(f"{where}: exactly one of claim (a PersistentVolumeClaim name), secret, "
                      "config_map or empty_dir is required")
    elif sources[0] == "empty_dir":
        empty = volume["empty_dir"]
        if not isinstance(empty, dict) or set(empty) - {"medium", "size_limit"} \
                or empty.get("medium", "") not in ("", "Memory"):
            errors.append(f"{where}.empty_dir: must be {{}} or {{medium: Memory, size_limit: 1Gi}}")
        elif "size_limit" in empty:
            _quantity(empty["size_limit"], f"{where}.empty_dir.size_limit", errors)
    else:
        name = volume[sources[0]]
        if not isinstance(name, str) or not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
            errors.append(f"{where}.{sources[0]}: {name!r} is not a Kubernetes object name")


def _check_volumes(volumes: Any, where: str, errors: list[str]) -> Any:
    if not isinstance(volumes, list):
        errors.append(f"{where}: must be a list of {{claim|secret|config_map|empty_dir: ..., mount_path: /path}}")
        return volumes
    paths = set()
    for i, v in enumerate(volumes):
        if not isinstance(v, dict):
            errors.append(f"{where}[{i}]: must be {{claim: PVC, mount_path: /path}} (or secret, config_map, empty_dir)")
            continue
        extra = sorted(set(v) - {*_VOLUME_SOURCES, "mount_path", "read_only", "sub_path"})
        if extra:
            errors.append(f"{where}[{i}]: unknown field(s) {', '.join(extra)}; "
                          f"use one of {', '.join(_VOLUME_SOURCES)}, and mount_path, read_only, sub_path")
        _check_volume_source(v, f"{where}[{i}]", errors)
        path = v.get("mount_path")
        if not isinstance(path, str) or not path.startswith("/"):
            errors.append(f"{where}[{i}].mount_path: an absolute path inside the container is required")
        elif path in paths:
            errors.append(f"{where}[{i}].mount_path: {path} is mounted twice")
        paths.add(path)
        if "read_only" in v and not isinstance(v["read_only"], bool):
            errors.append(f"{where}[{i}].read_only: must be true or false")
    return volumes


def _check_seconds(value: Any, where: str, errors: list[str]) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        errors.append(f"{where}: must be a positive number of seconds")
    return value


def _check_numeric_id(value: Any, where: str, errors: list[str]) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        errors.append(f"{where}: must be a positive numeric id (pods never run as root)")
    return value


def _check_metadata(value: Any, where: str, errors: list[str], *, labels: bool) -> Any:
    """Extra labels or annotations: keys Kubernetes accepts (none of ours), label values."""
    if not _is_str_map(value):
        errors.append(f"{where}: must map keys to string values")
        return value
    for k, v in value.items():
        if not _LABEL_KEY.match(k) or k.startswith(f"{PREFIX}/"):
            errors.append(f"{where}.{k}: not a usable Kubernetes key (optional DNS prefix, "
                          f"a name of at most 63 characters; {PREFIX}/ is reserved)")
        elif labels and not _LABEL_VALUE.match(v):
            errors.append(f"{where}.{k}: {v!r} is not a label value (at most 63 characters "
                          "of letters, digits, '-', '_', '.')")
    return value


def _check_labels(value: Any, where: str, errors: list[str]) -> Any:
    return _check_metadata(value, where, errors, labels=True)


def _check_annotations(value: Any, where: str, errors: list[str]) -> Any:
    return _check_metadata(value, where, errors, labels=False)


def _check_queue_name(value: Any, where: str, errors: list[str]) -> Any:
    if not isinstance(value, str) or not value or not _LABEL_VALUE.match(value):
        errors.append(f"{where}: {value!r} is not a Kueue LocalQueue name (a label value)")
    return value


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


def _check_pod_template(value: Any, where: str, errors: list[str]) -> Any:
    try:
        return _load_pod_template(value, where)
    except SpecError as e:
        errors.append(str(e))
        return value


@dataclass(frozen=True)
class PodOption:
    """One key of ``RoleSpec.kubernetes``: what it means (for error messages and the guide)
    and its validator."""

    doc: str
    check: Callable[[Any, str, list[str]], Any]


POD_OPTION_TABLE: dict[str, PodOption] = {
    "node_selector": PodOption("{label: value} the nodes must carry", _check_node_selector),
    "tolerations": PodOption(
        "list of Kubernetes tolerations ({key, operator, value, effect, tolerationSeconds})", _check_tolerations),
    "affinity": PodOption(
        "a Kubernetes affinity object ({nodeAffinity, podAffinity, podAntiAffinity})", _check_affinity),
    "service_account": PodOption("service account the pods run as", _object_name("service account name")),
    "image_pull_secrets": PodOption("names of docker-registry Secrets for private images", _check_image_pull_secrets),
    "image_pull_policy": PodOption("Always, IfNotPresent or Never", _check_image_pull_policy),
    "env_from": PodOption(
        "list of {secret: NAME} or {config_map: NAME} (optional prefix) exported as environment", _check_env_from),
    "secret_env": PodOption("{VAR: {secret: NAME, key: KEY}}: one variable from one Secret key", _check_secret_env),
    "volumes": PodOption(
        "list of {claim|secret|config_map|empty_dir: ..., mount_path: /path, read_only, sub_path}", _check_volumes),
    "shm_size": PodOption("size of a memory-backed /dev/shm (e.g. 1Gi)", _quantity),
    "init_containers": PodOption("list of Kubernetes containers run before the task", _check_containers),
    "sidecars": PodOption("list of Kubernetes containers running beside the task (native sidecars)", _check_containers),
    "schedule_timeout_seconds": PodOption(
        f"fail when a pod stays unschedulable this long (default {DEFAULT_SCHEDULE_TIMEOUT:.0f})", _check_seconds),
    "run_as_user": PodOption(
        f"numeric user id of the training process (default {DEFAULT_USER}; never root)", _check_numeric_id),
    "fs_group": PodOption("group id owning mounted volumes (default: run_as_user)", _check_numeric_id),
    "labels": PodOption("extra labels {key: value} on the Jobs and pods", _check_labels),
    "annotations": PodOption("extra annotations {key: value} on the Jobs and pods", _check_annotations),
    "queue_name": PodOption(
        f"Kueue LocalQueue: sets {KUEUE_QUEUE_LABEL} and creates the Jobs suspended for Kueue to admit",
        _check_queue_name),
    "priority_class": PodOption("PriorityClass name", _object_name("PriorityClass name")),
    "pod_template": PodOption(
        "a Pod manifest (object, or path of a YAML file) merged under what the backend sets", _check_pod_template),
}
"""Every key of ``RoleSpec.kubernetes`` (the fields of :class:`PodOptions`), in the order
errors and the list of settings are reported."""

POD_OPTIONS = {key: option.doc for key, option in POD_OPTION_TABLE.items()}
"""Each setting and what it means."""


def pod_options(role: str, options: dict[str, Any], *, where: str | None = None,
                others: dict[str, str] | None = None) -> PodOptions:
    """Validate one role's Kubernetes settings; every problem is reported at once, each
    under ``where`` (default ``roles.<role>.kubernetes``). ``others`` are the caller's own
    settings beside these (listed with them when a key is unknown)."""
    where = where or f"roles.{role}.kubernetes"
    known = {**(others or {}), **POD_OPTIONS}
    errors = [f"{where}.{key}: unknown setting; the settings are: "
              + "; ".join(f"{k} ({doc})" for k, doc in known.items())
              for key in sorted(set(options) - set(known))]
    checked = {key: option.check(options[key], f"{where}.{key}", errors)
               for key, option in POD_OPTION_TABLE.items() if key in options}
    if errors:
        raise SpecError("invalid Kubernetes settings:\n  " + "\n  ".join(errors))
    return PodOptions(**checked)

def check_resources(role: str, resources: dict[str, Any], where: str | None = None) -> dict[str, dict[str, str]]:
    where = where or f"roles.{role}.resources"
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


def task_address(group: str, role: str, index: int, namespace: str, port: int, *,
                 cluster_domain: str | None = None) -> str:
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


@functools.cache
def _renderer() -> _Renderer:
    """One sandboxed environment per process, made on first use (it caches compiled templates)."""
    return _Renderer()


def _render(template: str, **values: Any) -> list[dict]:
    return _renderer().render(template, **values)


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
        main = _merge_container(t_main, main)
    result["spec"]["containers"] = [main] + [c for c in t_containers if c is not t_main]
    result["spec"] = _merge_pod_spec(t_spec, result["spec"])
    return result


def _merge_container(under: dict, task: dict) -> dict:
    """The task's container over the template's: named lists joined, resources merged per kind."""
    merged = {**under, **task, "name": task["name"]}
    for key in ("env", "volumeMounts", "ports"):
        if under.get(key) or task.get(key):
            merged[key] = _merge_named(under.get(key) or [], task.get(key) or [])
    for kind in ("requests", "limits"):
        amounts = {**(under.get("resources") or {}).get(kind, {}), **task.get("resources", {}).get(kind, {})}
        if amounts:
            merged.setdefault("resources", {})[kind] = amounts
    return merged


def _merge_pod_spec(under: dict, spec: dict) -> dict:
    """The backend's pod spec over the template's (without its containers): volumes and init
    containers joined by name, tolerations added, node selector and security context merged."""
    spec = dict(spec)
    for key in ("volumes", "initContainers"):
        if under.get(key) or spec.get(key):
            spec[key] = _merge_named(under.pop(key, None) or [], spec.get(key) or [])
    if under.get("tolerations"):
        spec["tolerations"] = under.pop("tolerations") + spec.get("tolerations", [])
    for key in ("nodeSelector", "securityContext"):
        if under.get(key):
            spec[key] = {**under.pop(key), **spec.get(key, {})}
    return {**under, **spec}


def _check_group(spec: GroupSpec, namespace: str, cluster_domain: str | None,
                 lifetimes: dict[str, int | None]) -> None:
    """What the Kubernetes backend needs beyond a valid spec: a namespace, images, lifetimes."""
    check_namespace(namespace)
    check_cluster_domain(cluster_domain)
    if spec.group_backoff_limit is not None:
        raise SpecError("group_backoff_limit: the Kubernetes backend counts restarts per task "
                        "(backoffLimitPerIndex = backoff_limit); leave group_backoff_limit unset")
    if spec.image is None and any(spec.roles[r].image is None for r, _ in spec.tasks()):
        raise SpecError("image: the Kubernetes backend needs a container image "
                        "(set the group's image, or an image on every role)")
    for role in spec.roles:
        if spec.replicas(role):
            check_image(spec.roles[role].image or spec.image, f"roles.{role}.image" if spec.roles[role].image else "image")
    for key, value in lifetimes.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise SpecError(f"{key}: must be a whole number of seconds >= 0, got {value!r}")


@dataclass(frozen=True)
class _Role:
    """One role's validated settings: its spec, Kubernetes pod options and resources."""

    name: str
    spec: RoleSpec
    options: PodOptions
    resources: dict[str, dict[str, str]]


def _roles(spec: GroupSpec, pod_defaults: dict[str, Any] | None) -> dict[str, _Role]:
    """The roles that have tasks, validated: pod settings, then resources, then reserved variables."""
    options = {role: pod_options(role, {**(pod_defaults or {}), **(spec.roles[role].kubernetes or {})})
               for role in spec.roles if spec.replicas(role)}
    roles = {role: _Role(role, spec.roles[role], opts, check_resources(role, spec.roles[role].resources))
             for role, opts in options.items()}
    for role in roles.values():
        clash = [var for var in _RESERVED_ENV if var in role.spec.env or var in role.options.secret_env]
        if clash:
            raise SpecError(f"roles.{role.name}.env.{clash[0]}: set by the backend for every task; remove it")
    return roles


@dataclass(frozen=True)
class _Group:
    """What every role's Job of one group shares."""

    spec: GroupSpec
    namespace: str
    root: str
    cluster: dict[str, list[str]]
    labels: dict[str, str]
    """The group label and the Airflow ids (sanitized)."""
    annotations: dict[str, str]
    """The Airflow ids, verbatim."""
    replicas: str
    """Tasks per role (JSON), for status() to judge the group without the spec."""
    deadline: int | None
    ttl_seconds_after_finished: int | None
    ps_max_lifetime_seconds: int

    def serves_until_stopped(self, role: str) -> bool:
        """Servers never complete by themselves: the ps, and the workers a coordinator drives."""
        return role == "ps" or (role == "worker" and self.spec.training is not None
                                and self.spec.training.mode == "coordinator")


def _task_env(group: _Group, role: _Role) -> list[dict]:
    # The index comes from JOB_COMPLETION_INDEX (set by the Job controller): one
    # TF_CONFIG for every pod of the Job.
    tf_config = json.dumps({"cluster": group.cluster, "task": {"type": role.name}}, sort_keys=True)
    return [{"name": "TF_CONFIG", "value": tf_config}, *_process_env(role.spec.env, role.options, role.resources)]


def _process_env(env: dict[str, Any], opts: PodOptions, resources: dict[str, dict[str, str]]) -> list[dict]:
    """The container's environment besides TF_CONFIG: the user's variables and Secret references."""
    # Progress lines must reach the pod log as they are written, not at exit.
    out: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if not uses_gpu(resources):
        # A task without a GPU limit stays on the CPU even on a GPU node whose
        # runtime exposes every device (parameter servers by default).
        out.append({"name": "CUDA_VISIBLE_DEVICES", "value": ""})
    out += [{"name": k, "value": str(v)} for k, v in env.items()]
    out += [{"name": var, "valueFrom": {"secretKeyRef": {"name": ref["secret"], "key": ref["key"]}}}
            for var, ref in opts.secret_env.items()]
    return out


def _env_from(opts: PodOptions) -> list[dict]:
    return [{**({"prefix": s["prefix"]} if "prefix" in s else {}),
             **({"secretRef": {"name": s["secret"]}} if "secret" in s else {"configMapRef": {"name": s["config_map"]}})}
            for s in opts.env_from]


def _pod_failure_rules(role: _Role) -> list[dict]:
    """Disruptions never count; under ``ExitCode`` a program error fails the Job at once."""
    rules: list[dict] = [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    if role.spec.restart_policy == "ExitCode":
        rules.append({"action": "FailJob", "onExitCodes": {
            "containerName": role.name, "operator": "In", "values": USER_ERROR_EXIT_CODES}})
    return rules


def _job_metadata(group: _Group, role: _Role) -> dict[str, dict[str, str]]:
    """Labels and annotations of the Job and of its pods."""
    opts = role.options
    labels = {**opts.labels, **group.labels, ROLE_LABEL: role.name}
    job_annotations = {**opts.annotations, **group.annotations, SUCCESS_POLICY: group.spec.success_policy,
                       REPLICAS: group.replicas, RESTART_POLICY: role.spec.restart_policy}
    if role.name == group.root:
        job_annotations[ROOT_ANNOTATION] = "true"
    return {
        "job_labels": {**labels, **({KUEUE_QUEUE_LABEL: opts.queue_name} if opts.queue_name else {})},
        "job_annotations": job_annotations,
        "pod_labels": labels,
        "pod_annotations": {**opts.annotations, SCHEDULE_TIMEOUT: f"{float(opts.schedule_timeout_seconds):g}"},
    }


def _lifecycle(group: _Group, role: _Role) -> dict[str, Any]:
    """The Job's restart budget, failure and success rules and how long it may live."""
    is_root = role.name == group.root
    return {
        "backoff_limit_per_index": 0 if role.spec.restart_policy == "Never" else group.spec.backoff_limit,
        "pod_failure_rules": _pod_failure_rules(role),
        "success_policy": ({"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}
                           if group.spec.success_policy == "ChiefOrWorker0" and is_root else None),
        "active_deadline_seconds": group.deadline or (
            group.ps_max_lifetime_seconds if group.serves_until_stopped(role.name) else None),
        "ttl_seconds_after_finished": group.ttl_seconds_after_finished if is_root else None,
        "suspend": role.options.queue_name is not None,
    }


def _pod_settings(opts: PodOptions, resources: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Where and as whom the pods run, and what they mount."""
    volumes, volume_mounts = _volumes(opts)
    return {
        "env_from": _env_from(opts), "resources": resources, "volumes": volumes, "volume_mounts": volume_mounts,
        "init_containers": list(opts.init_containers) + [{**c, "restartPolicy": "Always"} for c in opts.sidecars],
        "node_selector": opts.node_selector, "tolerations": opts.tolerations, "affinity": opts.affinity,
        "service_account": opts.service_account, "image_pull_secrets": [{"name": s} for s in opts.image_pull_secrets],
        "image_pull_policy": opts.image_pull_policy, "run_as_user": opts.run_as_user,
        "fs_group": opts.fs_group or opts.run_as_user, "priority_class": opts.priority_class,
    }


def health_probes(spec: GroupSpec, role: str) -> dict[str, dict | None]:
    """The liveness and startup probes of a task of ``role``: the health question to its own
    TensorFlow server, with the group's bounds (``health_timeout``); None for both when the
    role's tasks are not asked. The startup probe gives TensorFlow's import and the server's
    start ``HEALTH_STARTUP_SECS``; from the first answer on, the liveness probe has the
    kubelet kill a container that leaves ``HEALTH_FAILURES`` questions in a row unanswered, and
    the Job replaces its pod (same index, so same DNS name) within the role's backoff limit."""
    bounds = spec.health_bounds()
    if bounds is None or not spec.answers_health(role):
        return {"liveness_probe": None, "startup_probe": None}
    probe = {"exec": {"command": spec.health_command([f"127.0.0.1:{spec.port}"])},
             "timeoutSeconds": math.ceil(bounds.timeout_secs) + PROBE_START_SECS,
             "periodSeconds": math.ceil(bounds.period_secs)}
    return {"liveness_probe": {**probe, "failureThreshold": bounds.failures},
            "startup_probe": {**probe, "failureThreshold": math.ceil(HEALTH_STARTUP_SECS / bounds.period_secs)}}


def _role_job(group: _Group, role: _Role) -> dict:
    """One role's Indexed Job: its tasks are the Job's pods, index = task index."""
    spec = group.spec
    job = _render(
        "job.yaml.j2", name=job_name(spec.name, role.name), namespace=group.namespace,
        replicas=spec.replicas(role.name), service=service_name(spec.name), role=role.name,
        image=role.spec.image or spec.image, command=spec.command(role.name), env=_task_env(group, role),
        port=spec.port if role.name != "evaluator" else None, **health_probes(spec, role.name),
        **_job_metadata(group, role), **_lifecycle(group, role), **_pod_settings(role.options, role.resources),
    )[0]
    if role.options.pod_template:
        job["spec"]["template"] = merge_pod_template(role.options.pod_template, job["spec"]["template"])
    return job


def render_group(spec: GroupSpec, namespace: str, *, cluster_domain: str | None = None,
                 network_policy: bool = False, pod_defaults: dict[str, Any] | None = None,
                 ttl_seconds_after_finished: int | None = DEFAULT_TTL_SECONDS_AFTER_FINISHED,
                 ps_max_lifetime_seconds: int = DEFAULT_PS_MAX_LIFETIME_SECONDS) -> list[dict]:
    """Every object of the group, in creation order: the root Job (the lead trainer's),
    the headless Service, the NetworkPolicy (if asked), the other Jobs."""
    _check_group(spec, namespace, cluster_domain, {"ttl_seconds_after_finished": ttl_seconds_after_finished,
                                                   "ps_max_lifetime_seconds": ps_max_lifetime_seconds})
    roles = _roles(spec, pod_defaults)
    extra_labels, extra_annotations = _extra_labels(spec)
    group = _Group(
        spec=spec, namespace=namespace, root=root_role(spec),
        cluster=cluster_def(spec, lambda role, index: task_address(
            spec.name, role, index, namespace, spec.port, cluster_domain=cluster_domain)),
        labels={**extra_labels, GROUP_LABEL: spec.name}, annotations=extra_annotations,
        replicas=json.dumps({role: spec.replicas(role) for role in roles}, sort_keys=True),
        deadline=math.ceil(spec.active_deadline_seconds) if spec.active_deadline_seconds else None,
        ttl_seconds_after_finished=ttl_seconds_after_finished, ps_max_lifetime_seconds=ps_max_lifetime_seconds,
    )
    jobs = {name: _role_job(group, role) for name, role in roles.items()}

    objects = [jobs.pop(group.root)]
    objects += _render("service.yaml.j2", name=service_name(spec.name), namespace=namespace, labels=group.labels,
                       selector={GROUP_LABEL: spec.name}, port=spec.port)
    if network_policy:
        objects += _render("networkpolicy.yaml.j2", name=f"{spec.name}-grpc", namespace=namespace,
                           labels=group.labels, selector={GROUP_LABEL: spec.name}, port=spec.port)
    return objects + list(jobs.values())


def one_off_pod_template(*, container: str, image: str, command: list[str], env: dict[str, str],
                         options: PodOptions, resources: dict[str, dict[str, str]]) -> dict:
    """The pod template (metadata + spec) of a container run once outside any training group
    (a prepare part): rendered from the same Job template as a training task, so the same
    settings give the same security, placement, volumes and Secret references."""
    job = _render(
        "job.yaml.j2", name=container, namespace="default", replicas=1, service=None, role=container,
        image=image, command=command, env=_process_env(env, options, resources), port=None,
        liveness_probe=None, startup_probe=None,
        job_labels={}, job_annotations={}, pod_labels=options.labels, pod_annotations=options.annotations,
        backoff_limit_per_index=0, pod_failure_rules=[], success_policy=None, active_deadline_seconds=None,
        ttl_seconds_after_finished=None, suspend=False, **_pod_settings(options, resources),
    )[0]
    template = job["spec"]["template"]
    template["spec"].pop("subdomain", None)
    return merge_pod_template(options.pod_template, template) if options.pod_template else template


def owned_by(obj: dict, root: dict) -> dict:
    """``obj`` with an ownerReference to the root Job: garbage-collected with it."""
    meta = root["metadata"]
    reference = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"],
                 "blockOwnerDeletion": False}
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": [reference]}}


def to_yaml(objects: list[dict]) -> str:
    """Multi-document YAML for ``kubectl apply -f -``."""
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, explicit_start=True)
