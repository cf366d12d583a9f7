"""What a training group's Kubernetes objects are made of, whatever the workload form
(:mod:`.jobs`): names and labels, each task's pod (environment with TF_CONFIG, health probes,
placement, volumes, Secret references), rendered from the Jinja templates in ``templates/``.

Rendering happens in a sandboxed Jinja environment where an undefined variable is an
error, and every ``{{ ... }}`` value is written as JSON (the environment's ``finalize``):
a JSON string is a YAML double-quoted scalar, so no user string (a DAG id, an env value,
an image name) can end a value and start a new YAML key. The rendered YAML is read back
with ``yaml.safe_load_all``; those dicts are what the backend sends to the API server and
what ``airflow-tf render`` prints (the backend adds only the ownerReferences, which need
the root's uid). A role's pod options are validated in :mod:`.pod_options`.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

from airflow_tf.cluster import GroupSpec, RoleSpec, SpecError, cluster_def, label_value, task_name
from airflow_tf.cluster.names import GROUP_ENV, RUN_ENV
from airflow_tf.cluster.spec import CHIEF_OR_WORKER0, HEALTH_COMMAND, HEALTH_STARTUP_SECS

from .labels import (
    GROUP_LABEL,
    PREFIX,
    REPLICAS,
    RESTART_POLICY,
    ROLE_LABEL,
    ROOT_ANNOTATION,
    SCHEDULE_TIMEOUT,
    SUCCESS_POLICY,
)
from .default_requests import ROLE_REQUESTS, with_default_requests
from .nodes import DEFAULT_UNREACHABLE_TOLERATION_SECONDS, PEERS_ANSWERED, node_tolerations, spread_affinity
from .restricted import restricted_pod
from .pod_options import (
    LABEL_KEY,
    PodOptions,
    check_cluster_domain,
    check_image,
    check_namespace,
    check_resources,
    pod_options,
    uses_gpu,
)

TEMPLATES = Path(__file__).with_name("templates")


DEFAULT_TTL_SECONDS_AFTER_FINISHED = 3600
DEFAULT_PS_MAX_LIFETIME_SECONDS = 7 * 24 * 3600
PS_STOP_GRACE_SECONDS = 5
"""A parameter server's grace period (the pod's ``terminationGracePeriodSeconds``): it saves
nothing when stopped (the chief checkpoints), and a frozen one cannot act on the SIGTERM, so
the grace only delays its replacement after the liveness probe gave up (Kubernetes' default
is 30 s)."""
PROBE_START_SECS = 10
"""Seconds a health probe gets beyond its question's deadline, to start Python and gRPC in the
container (a fraction of a second on an idle node)."""
PEERS_ANSWERED_CHECK = f"import os, sys; sys.exit(0 if os.path.exists({PEERS_ANSWERED!r}) else 1)"
MIN_PEERS_JUDGED = 3
"""Tasks a group needs for a cut-off one to be told from the others: with two, each reaches no one."""
USER_ERROR_EXIT_CODES = list(range(1, 129))
"""Exit codes of a program error under the ``ExitCode`` policy; above 128 is death by a signal."""

_RESERVED_ENV = ("TF_CONFIG", "JOB_COMPLETION_INDEX", GROUP_ENV, RUN_ENV)


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


def airflow_metadata(spec: GroupSpec) -> tuple[dict[str, str], dict[str, str]]:
    """Airflow ids (dag_id, task_id, run_id, try_number ...) as labels (sanitized, for
    selectors) and as annotations (verbatim, for people reading ``kubectl describe``)."""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for key, value in spec.labels.items():
        if not LABEL_KEY.match(str(key)) or str(key).startswith(f"{PREFIX}/"):
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


def render(template: str, **values: Any) -> list[dict]:
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


def check_group(spec: GroupSpec, namespace: str, cluster_domain: str | None,
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
class Role:
    """One role's validated settings: its spec, Kubernetes pod options and resources."""

    name: str
    spec: RoleSpec
    options: PodOptions
    resources: dict[str, dict[str, str]]


def roles_of(spec: GroupSpec, pod_defaults: dict[str, Any] | None) -> dict[str, Role]:
    """The roles that have tasks, validated: pod settings, then resources, then reserved variables."""
    options = {role: pod_options(role, {**(pod_defaults or {}), **(spec.roles[role].kubernetes or {})})
               for role in spec.roles if spec.replicas(role)}
    roles = {role: Role(role, spec.roles[role], opts, with_default_requests(
                 check_resources(role, spec.roles[role].resources), role_requests(spec, role), opts.pod_template, role))
             for role, opts in options.items()}
    for role in roles.values():
        clash = [var for var in _RESERVED_ENV if var in role.spec.env or var in role.options.secret_env]
        if clash:
            raise SpecError(f"roles.{role.name}.env.{clash[0]}: set by the backend for every task; remove it")
    return roles


def role_requests(spec: GroupSpec, role: str) -> dict[str, str]:
    """The default requests of a task of ``role``; a ps's memory is the group's
    ``training.ps_memory_limit`` when set (what its variables were sized against)."""
    requests = dict(ROLE_REQUESTS[role])
    if role == "ps" and spec.training is not None and spec.training.ps_memory_limit is not None:
        requests["memory"] = str(spec.training.ps_memory_limit)
    return requests


@dataclass(frozen=True)
class Group:
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
    unreachable_toleration_seconds: int | None = DEFAULT_UNREACHABLE_TOLERATION_SECONDS
    """How long the pods stay on a node judged lost (:mod:`.nodes`); None: Kubernetes' default."""
    spread_over_nodes: bool = True
    """The default preferred anti-affinity of the roles without an affinity of their own."""

    def serves_until_stopped(self, role: str) -> bool:
        """Servers never complete by themselves: the ps, and the workers a coordinator drives."""
        return role == "ps" or (role == "worker" and self.spec.training is not None
                                and self.spec.training.mode == "coordinator")


def task_env(group: Group, role: Role) -> list[dict]:
    # The index comes from JOB_COMPLETION_INDEX (set by the Job controller): one
    # TF_CONFIG for every pod of the Job.
    tf_config = json.dumps({"cluster": group.cluster, "task": {"type": role.name}}, sort_keys=True)
    # The group and run, as a local task has them: the runtime titles its process after them.
    identity = [{"name": GROUP_ENV, "value": group.spec.name}, {"name": RUN_ENV, "value": group.spec.run_name()}]
    return [{"name": "TF_CONFIG", "value": tf_config}, *identity,
            *_process_env(role.spec.env, role.options, role.resources)]


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


def pod_settings(opts: PodOptions, resources: dict[str, dict[str, str]]) -> dict[str, Any]:
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


def health_probes(spec: GroupSpec, role: str, *, peers: bool = False) -> dict[str, dict | int | None]:
    """The liveness and startup probes of a task of ``role``: the health question to its own
    TensorFlow server, with the group's bounds (``health_timeout``); None for both when the
    role's tasks are not asked. The startup probe gives TensorFlow's import and the server's
    start ``HEALTH_STARTUP_SECS``; from the first answer on, the liveness probe has the
    kubelet kill a container that leaves ``HEALTH_FAILURES`` questions in a row unanswered, and
    the Job replaces its pod (same index, so same DNS name) within the role's backoff limit.
    A parameter server's grace period is ``PS_STOP_GRACE_SECONDS``: see there.

    With ``peers`` (the Jobs form, in a group of three tasks or more that answer), the question
    also goes to the group's other tasks across the pod network, and the readiness probe says
    whether one of them answered (:data:`PEERS_ANSWERED`): a task cut off from the others turns
    not Ready, which the backend acts on (:func:`.nodes.cut_off_pods`). Not in a JobSet: its
    ``startupPolicy`` waits for the parameter servers to be Ready before it creates the others."""
    bounds = spec.health_bounds()
    if bounds is None or not spec.answers_health(role):
        return {"liveness_probe": None, "startup_probe": None, "readiness_probe": None,
                "termination_grace_seconds": None}
    peers = peers and sum(spec.replicas(r) for r in spec.roles if spec.answers_health(r)) >= MIN_PEERS_JUDGED
    command = spec.health_command([f"127.0.0.1:{spec.port}"]) + (["--peers-answered", PEERS_ANSWERED] if peers else [])
    probe = {"exec": {"command": command}, "timeoutSeconds": math.ceil(bounds.timeout_secs) + PROBE_START_SECS,
             "periodSeconds": math.ceil(bounds.period_secs)}
    readiness = {"exec": {"command": [HEALTH_COMMAND[0], "-c", PEERS_ANSWERED_CHECK]},
                 "timeoutSeconds": PROBE_START_SECS, "periodSeconds": math.ceil(bounds.period_secs),
                 "failureThreshold": bounds.failures} if peers else None
    return {"liveness_probe": {**probe, "failureThreshold": bounds.failures},
            "startup_probe": {**probe, "failureThreshold": math.ceil(HEALTH_STARTUP_SECS / bounds.period_secs)},
            "readiness_probe": readiness,
            "termination_grace_seconds": PS_STOP_GRACE_SECONDS if role == "ps" else None}


def pod_failure_rules(role: Role) -> list[dict]:
    """Disruptions never count; under ``ExitCode`` a program error fails the Job at once."""
    rules: list[dict] = [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    if role.spec.restart_policy == "ExitCode":
        rules.append({"action": "FailJob", "onExitCodes": {
            "containerName": role.name, "operator": "In", "values": USER_ERROR_EXIT_CODES}})
    return rules


def _job_metadata(group: Group, role: Role) -> dict[str, dict[str, str]]:
    """Labels and annotations of the Job and of its pods. Never Kueue's queue label: a queued
    group is one JobSet, which Kueue admits (:mod:`.workloads`)."""
    opts = role.options
    labels = {**opts.labels, **group.labels, ROLE_LABEL: role.name}
    job_annotations = {**opts.annotations, **group.annotations, SUCCESS_POLICY: group.spec.success_policy,
                       REPLICAS: group.replicas, RESTART_POLICY: role.spec.restart_policy}
    if role.name == group.root:
        job_annotations[ROOT_ANNOTATION] = "true"
    return {
        "job_labels": labels,
        "job_annotations": job_annotations,
        "pod_labels": labels,
        "pod_annotations": {**opts.annotations, SCHEDULE_TIMEOUT: f"{float(opts.schedule_timeout_seconds):g}"},
    }


def _lifecycle(group: Group, role: Role, *, standalone: bool) -> dict[str, Any]:
    """The Job's restart budget, failure and success rules and how long it may live. Inside a
    JobSet (``standalone`` False) the JobSet holds the TTL. Never suspended: a queued group is a
    JobSet, which its controller suspends and resumes with its Jobs."""
    is_root = role.name == group.root
    return {
        "backoff_limit_per_index": 0 if role.spec.restart_policy == "Never" else group.spec.backoff_limit,
        "pod_failure_rules": pod_failure_rules(role),
        "success_policy": ({"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}
                           if group.spec.success_policy == CHIEF_OR_WORKER0 and is_root else None),
        "active_deadline_seconds": group.deadline or (
            group.ps_max_lifetime_seconds if group.serves_until_stopped(role.name) else None),
        "ttl_seconds_after_finished": group.ttl_seconds_after_finished if is_root and standalone else None,
        "suspend": False,
    }


def role_job(group: Group, role: Role, *, standalone: bool = True) -> dict:
    """One role's Indexed Job: its tasks are the Job's pods, index = task index. ``standalone``
    False: the Job as a JobSet's replicated job builds it (no TTL of its own; the JobSet
    controller names it, suspends it with the JobSet and sets its pods' subdomain)."""
    spec = group.spec
    job = render(
        "job.yaml.j2", name=job_name(spec.name, role.name), namespace=group.namespace,
        replicas=spec.replicas(role.name), service=service_name(spec.name), role=role.name,
        image=role.spec.image or spec.image, command=spec.command(role.name), env=task_env(group, role),
        port=spec.port if role.name != "evaluator" else None, **health_probes(spec, role.name, peers=standalone),
        **_job_metadata(group, role), **_lifecycle(group, role, standalone=standalone),
        **pod_settings(role.options, role.resources),
    )[0]
    template = job["spec"]["template"]
    if role.options.pod_template:
        template = merge_pod_template(role.options.pod_template, template)
    _place(group, role.name, template["spec"])
    job["spec"]["template"] = restricted_pod(template, role.name, role.options, f"roles.{role.name}")
    return job


def _place(group: Group, role: str, pod_spec: dict) -> None:
    """The backend's node placement under what the user set (pod options or pod template): the
    lost-node tolerations for the keys the user did not tolerate, and the spread over nodes for
    a role with no affinity of its own."""
    tolerations = node_tolerations(pod_spec.get("tolerations") or [], group.unreachable_toleration_seconds)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    affinity = spread_affinity(group.spec.name, role) if group.spread_over_nodes else None
    if affinity and not pod_spec.get("affinity"):
        pod_spec["affinity"] = affinity


def plan_group(spec: GroupSpec, namespace: str, address: Callable[[str, int], str], *,
               cluster_domain: str | None, pod_defaults: dict[str, Any] | None,
               ttl_seconds_after_finished: int | None, ps_max_lifetime_seconds: int,
               unreachable_toleration_seconds: int | None = DEFAULT_UNREACHABLE_TOLERATION_SECONDS,
               spread_over_nodes: bool = True) -> tuple[Group, dict[str, Role]]:
    """The group's shared settings and its roles, validated; ``address(role, index)`` is a
    task's ``host:port`` in TF_CONFIG (it depends on the workload form's pod hostnames)."""
    check_group(spec, namespace, cluster_domain, {"ttl_seconds_after_finished": ttl_seconds_after_finished,
                                                   "ps_max_lifetime_seconds": ps_max_lifetime_seconds,
                                                   "unreachable_toleration_seconds": unreachable_toleration_seconds})
    roles = roles_of(spec, pod_defaults)
    airflow_labels, airflow_annotations = airflow_metadata(spec)
    group = Group(
        spec=spec, namespace=namespace, root=root_role(spec), cluster=cluster_def(spec, address),
        labels={**airflow_labels, GROUP_LABEL: spec.name}, annotations=airflow_annotations,
        replicas=json.dumps({role: spec.replicas(role) for role in roles}, sort_keys=True),
        deadline=math.ceil(spec.active_deadline_seconds) if spec.active_deadline_seconds else None,
        ttl_seconds_after_finished=ttl_seconds_after_finished, ps_max_lifetime_seconds=ps_max_lifetime_seconds,
        unreachable_toleration_seconds=unreachable_toleration_seconds, spread_over_nodes=spread_over_nodes,
    )
    return group, roles


def one_off_pod_template(*, container: str, image: str, command: list[str], env: dict[str, str],
                         options: PodOptions, resources: dict[str, dict[str, str]]) -> dict:
    """The pod template (metadata + spec) of a container run once outside any training group
    (a prepare part): rendered from the same Job template as a training task, so the same
    settings give the same security, placement, volumes and Secret references."""
    job = render(
        "job.yaml.j2", name=container, namespace="default", replicas=1, service=None, role=container,
        image=image, command=command, env=_process_env(env, options, resources), port=None,
        liveness_probe=None, startup_probe=None, readiness_probe=None, termination_grace_seconds=None,
        job_labels={}, job_annotations={}, pod_labels=options.labels, pod_annotations=options.annotations,
        backoff_limit_per_index=0, pod_failure_rules=[], success_policy=None, active_deadline_seconds=None,
        ttl_seconds_after_finished=None, suspend=False, **pod_settings(options, resources),
    )[0]
    template = job["spec"]["template"]
    template["spec"].pop("subdomain", None)
    if options.pod_template:
        template = merge_pod_template(options.pod_template, template)
    return restricted_pod(template, container, options, container)


def owned_by(obj: dict, root: dict) -> dict:
    """``obj`` with an ownerReference to the root (the root Job, or the JobSet): garbage-collected
    with it. A Job read from a list carries no kind: a root without one is a Job."""
    meta = root["metadata"]
    reference = {"apiVersion": root.get("apiVersion") or "batch/v1", "kind": root.get("kind") or "Job",
                 "name": meta["name"], "uid": meta["uid"],
                 "blockOwnerDeletion": False}
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": [reference]}}


def to_yaml(objects: list[dict]) -> str:
    """Multi-document YAML for ``kubectl apply -f -``."""
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, explicit_start=True)
