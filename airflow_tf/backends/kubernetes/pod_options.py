"""Pod options: the Kubernetes settings of a role (``RoleSpec.kubernetes``, merged over the
backend's ``pod_defaults``). :data:`POD_OPTION_TABLE` declares each key once, with its meaning
and its validator, and :func:`pod_options` runs them all, reporting every error at once, each
naming the role and the key. Also the checks of names, images and resource quantities."""


from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from airflow_tf.cluster import SpecError
from airflow_tf.cluster.memory import parse_quantity, quantity_text, quantity_value

from .labels import (
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    PREFIX,
)

DEFAULT_SCHEDULE_TIMEOUT = 300.0
DEFAULT_USER = 1000
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915")

_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
_AFFINITY_KEYS = {"nodeAffinity", "podAffinity", "podAntiAffinity"}
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
KUBERNETES_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
"""What Kubernetes accepts as a container's environment variable name (wider than a shell's)."""
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
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
    workload_priority_class: str | None = None
    priority_class: str | None = None
    pod_template: dict | None = None


def _quantity(amount: Any, where: str, errors: list[str]) -> str:
    """A Kubernetes resource quantity (never negative) as its string, or an error added."""
    try:
        parse_quantity(amount, where)
    except ValueError as err:
        errors.append(str(err))
    return quantity_text(amount)


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


def _objects(value: Any, where: str, errors: list[str], what: str) -> list[dict]:
    """``value`` as a list of objects to check one by one; none (and an error) if it is not one."""
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        return value
    errors.append(f"{where}: must be a list of {what}")
    return []


def _check_tolerations(value: Any, where: str, errors: list[str]) -> Any:
    for i, toleration in enumerate(_objects(value, where, errors, "Kubernetes tolerations")):
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
        if not KUBERNETES_ENV_NAME.match(str(var)):
            errors.append(f"{where}.{var}: not a valid environment variable name")
        if not isinstance(ref, dict) or set(ref) != {"secret", "key"} \
                or not all(isinstance(v, str) and v for v in ref.values()):
            errors.append(f"{where}.{var}: must be {{secret: NAME, key: KEY}}")
    return value


def _check_containers(containers: Any, where: str, errors: list[str]) -> Any:
    for i, c in enumerate(_objects(containers, where, errors, "Kubernetes containers ({name, image, command, ...})")):
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
        if not LABEL_KEY.match(k) or k.startswith(f"{PREFIX}/"):
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
        f"Kueue LocalQueue, with workload='jobset' only: sets {KUEUE_QUEUE_LABEL} on the JobSet and creates it "
        "suspended for Kueue to admit the whole group",
        _check_queue_name),
    "workload_priority_class": PodOption(
        f"Kueue WorkloadPriorityClass, with queue_name only: sets {KUEUE_PRIORITY_LABEL} on the JobSet; a "
        "group of a higher one preempts a running lower one (suspended whole)",
        _object_name("WorkloadPriorityClass name")),
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
            if not isinstance(name, str) or not LABEL_KEY.match(name):
                errors.append(f"{where}.{kind}.{name}: not a resource name (e.g. cpu, memory, nvidia.com/gpu)")
                continue
            before = len(errors)
            text = _quantity(amount, f"{where}.{kind}.{name}", errors)
            if name in GPU_RESOURCES and len(errors) == before and quantity_value(text) != int(quantity_value(text)):
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


