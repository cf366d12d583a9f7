"""The parts of a partitioned prepare as Kubernetes pods: one Job per part, on an image and
with the volumes, resources and placement a platform team chooses, while the Airflow task
only waits for it.

Each part runs ``python -m airflow_tf.data part`` (see :func:`~airflow_tf.cluster.components.part_command`)
on the shared volume (a PersistentVolumeClaim) the plan and the datasets are on, as a one-off
Job of :class:`~airflow_tf.backends.kubernetes.KubernetesBackend`: the same pod settings as a
training task (``volumes``, ``node_selector``, ``secret_env`` ...), the same re-attach on a
retried task, result through the termination message and failure report naming the pod.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_tf.cluster import SpecError
from airflow_tf.cluster.components import PART_COMPONENT, part_command
from airflow_tf.cluster.names import dns1123_label, label_value

from ..base import BackendError
from .backend import KubernetesBackend
from .one_off import TERMINATION_MESSAGE_PATH, one_off_job
from .labels import COMPONENT_LABEL, PREFIX
from .default_requests import PART_REQUESTS, with_default_requests
from .manifests import DEFAULT_TTL_SECONDS_AFTER_FINISHED, one_off_pod_template
from .pod_options import KUBERNETES_ENV_NAME, check_image, check_namespace, check_resources, pod_options

log = logging.getLogger(__name__)

DATASET_LABEL = f"{PREFIX}/dataset"
PART_LABEL = f"{PREFIX}/part"
WHERE = "kubernetes"
"""How errors name these settings: the ``kubernetes=`` argument of ``tf_prepare``."""

_NOT_FOR_PARTS = {
    "queue_name": "a part's Job is created to run at once; give the pods a priority_class instead",
    "workload_priority_class": "a part's Job is created to run at once, in no Kueue queue",
    "schedule_timeout_seconds": "a part waits for a node until its timeout (timeout_seconds)",
}
_RESERVED_ENV = ("PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class KubernetesPartOptions:
    """Where and how the parts of a partitioned prepare run as Kubernetes pods (``tf_prepare(
    kubernetes=...)``); every value is checked when this is made.

    Besides the fields below, ``pod`` takes the pod settings a training role takes
    (``volumes``, ``node_selector``, ``tolerations``, ``affinity``, ``service_account``,
    ``secret_env``, ``env_from``, ``image_pull_secrets``, ``labels``, ``pod_template`` ...;
    :data:`~airflow_tf.backends.kubernetes.pod_options.POD_OPTIONS`). A plain dict may give them
    beside the fields: ``{"image": ..., "volumes": [...]}``."""

    image: str
    """The image the parts run on (the training image: it carries ``airflow_tf`` and pyarrow)."""
    namespace: str | None = None
    """Where the Jobs run; default: the connection's namespace, else ``default``."""
    kubernetes_conn_id: str | None = "kubernetes_default"
    """The provider's Kubernetes connection of the Airflow workers (None: ``config_file``/``in_cluster``)."""
    config_file: str | None = None
    in_cluster: bool | None = None
    cluster_context: str | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    """``{requests: {cpu, memory}, limits: {...}}`` of each part's container; a request not given
    (nor implied by a limit) is :data:`~.default_requests.PART_REQUESTS`'s."""
    env: dict[str, str] = field(default_factory=dict)
    """Plain environment variables of the parts (Secrets go in ``secret_env``/``env_from``)."""
    pod: dict[str, Any] = field(default_factory=dict)
    """Pod settings, as for a training role (``volumes`` must mount the plan's storage)."""
    timeout_seconds: float = 24 * 3600.0
    """A part running longer fails (the Job's ``activeDeadlineSeconds``)."""
    poll_interval: float = 10.0
    """Seconds between reads of the Job's state and the part's log."""
    ttl_seconds_after_finished: int | None = DEFAULT_TTL_SECONDS_AFTER_FINISHED
    """Kubernetes deletes a finished part Job this long after it ended, should Airflow not."""

    def __post_init__(self) -> None:
        errors: list[str] = []

        def check(key: str, run: Callable[[], Any]) -> None:
            try:
                run()
            except SpecError as e:
                lines = str(e).split("\n  ")  # a list of errors under a heading, or one error
                errors.extend(line if line.startswith(f"{WHERE}.") else f"{WHERE}.{key}: {line}"
                              for line in (lines[1:] or lines))

        check("image", lambda: check_image(self.image, f"{WHERE}.image"))
        if self.namespace is not None:
            check("namespace", lambda: check_namespace(self.namespace))
        check("resources", lambda: check_resources("part", self.resources, f"{WHERE}.resources"))
        errors += _scalar_errors(self) + _env_errors(self.env)
        if not isinstance(self.pod, dict):
            errors.append(f"{WHERE}.pod: must be a dict of pod settings")
        else:
            errors += [f"{WHERE}.{key}: not a setting of part pods ({why})"
                       for key, why in _NOT_FOR_PARTS.items() if key in self.pod]
            check("pod", lambda: pod_options("part", {k: v for k, v in self.pod.items() if k not in _NOT_FOR_PARTS},
                                             where=WHERE, others=_FIELD_DOCS))
        if errors:
            raise SpecError("invalid Kubernetes settings of the prepare parts:\n  " + "\n  ".join(errors))

    @classmethod
    def coerce(cls, value: KubernetesPartOptions | dict[str, Any]) -> KubernetesPartOptions:
        """These options from themselves or a dict (fields and pod settings side by side)."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise SpecError(f"{WHERE}: must be a KubernetesPartOptions or a dict of its settings, got {value!r}")
        fields = {f.name for f in dataclasses.fields(cls)}
        own = {k: v for k, v in value.items() if k in fields}
        pod = {**(own.pop("pod", None) or {}), **{k: v for k, v in value.items() if k not in fields}}
        if "image" not in own:
            raise SpecError(f"{WHERE}.image: the image the parts run on is required (the training image)")
        return cls(**own, pod=pod)

    def to_dict(self) -> dict[str, Any]:
        """A dict :meth:`coerce` turns back into these options (what a DAG serializes)."""
        return dataclasses.asdict(self)

    def backend(self) -> KubernetesBackend:
        return KubernetesBackend(self.kubernetes_conn_id, self.namespace, in_cluster=self.in_cluster,
                                 config_file=self.config_file, cluster_context=self.cluster_context,
                                 ttl_seconds_after_finished=self.ttl_seconds_after_finished,
                                 poll_interval=self.poll_interval)


def _scalar_errors(options: KubernetesPartOptions) -> list[str]:
    """What is wrong with the connection settings and the numbers."""
    errors = []
    for key in ("kubernetes_conn_id", "config_file", "cluster_context"):
        value = getattr(options, key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            errors.append(f"{WHERE}.{key}: must be a non-empty string or None, got {value!r}")
    if options.in_cluster is not None and not isinstance(options.in_cluster, bool):
        errors.append(f"{WHERE}.in_cluster: must be true, false or None, got {options.in_cluster!r}")
    for key in ("timeout_seconds", "poll_interval"):
        value = getattr(options, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            errors.append(f"{WHERE}.{key}: must be a number of seconds > 0, got {value!r}")
    ttl = options.ttl_seconds_after_finished
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0):
        errors.append(f"{WHERE}.ttl_seconds_after_finished: must be a whole number of seconds >= 0 or None, "
                      f"got {ttl!r}")
    return errors


def _env_errors(env: Any) -> list[str]:
    if not isinstance(env, dict):
        return [f"{WHERE}.env: must map variable names to strings"]
    errors = []
    for var, value in env.items():
        if not isinstance(var, str) or not KUBERNETES_ENV_NAME.match(var) or var in _RESERVED_ENV:
            errors.append(f"{WHERE}.env.{var}: not a usable environment variable name"
                          + (" (set by airflow-tf)" if var in _RESERVED_ENV else ""))
        elif not isinstance(value, (str, int, float)) or isinstance(value, bool):
            errors.append(f"{WHERE}.env.{var}: must be a string, got {value!r}")
    return errors


_FIELD_DOCS = {f.name: "see KubernetesPartOptions" for f in dataclasses.fields(KubernetesPartOptions) if f.name != "pod"}


def part_job_name(dataset: str, token: str, index: int) -> str:
    """``prep-<dataset>-<plan>-<index>``, a DNS-1123 label: the same for every try of one part
    of one plan (a retry re-attaches), different for each part and each plan."""
    plan = dns1123_label(str(token).removeprefix(".parts-"), max_length=16)
    return f"prep-{dns1123_label(str(dataset), max_length=30)}-{plan}-{int(index)}"


def part_job(options: KubernetesPartOptions, namespace: str, *, plan: str, index: int, dataset: str, token: str,
             encode_threads: int | None = None, progress_every: float = 5.0) -> dict:
    """The Job that runs part ``index`` of the plan in directory ``plan``."""
    settings = pod_options("part", {k: v for k, v in options.pod.items() if k not in _NOT_FOR_PARTS}, where=WHERE)
    command = part_command(plan, index, TERMINATION_MESSAGE_PATH, encode_threads=encode_threads, progress_every=progress_every)
    template = one_off_pod_template(
        container=PART_COMPONENT, image=options.image, command=command, env=dict(options.env), options=settings,
        resources=with_default_requests(check_resources("part", options.resources, f"{WHERE}.resources"),
                                        PART_REQUESTS, settings.pod_template, PART_COMPONENT))
    return one_off_job(part_job_name(dataset, token, index), namespace, container=PART_COMPONENT, template=template,
                       command=command, timeout=options.timeout_seconds, ttl=options.ttl_seconds_after_finished,
                       labels={**settings.labels, COMPONENT_LABEL: PART_COMPONENT,
                               DATASET_LABEL: label_value(dataset), PART_LABEL: str(int(index))})


def run_part(options: KubernetesPartOptions, *, plan: str, index: int, dataset: str, token: str,
             encode_threads: int | None = None, progress_every: float = 5.0,
             on_log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run part ``index`` as a Job, hand its log lines to ``on_log`` as they come, and return
    what the part returned (``index``, ``rows``, ``counts``). The Job is deleted at the end,
    whether the part succeeded or not. BackendError names the pod, its phase and reason and
    the last lines of its log when the part failed (ComponentRefusedError: its data or plan
    was refused, and a retry would fail again)."""
    backend = options.backend()
    body = part_job(options, backend.namespace, plan=plan, index=index, dataset=dataset, token=token,
                    encode_threads=encode_threads, progress_every=progress_every)
    name = body["metadata"]["name"]
    try:
        pod = backend.run_one_off(body, what=f"part {index} of dataset {dataset!r}", on_log=on_log)
        result = backend.one_off_result(pod, PART_COMPONENT)
    finally:
        delete_part(options, backend.namespace, name, backend)
    if result.get("index") != int(index) or not isinstance(result.get("rows"), int):
        raise BackendError(f"part {index} of dataset {dataset!r}: pod {pod['metadata']['name']} returned "
                           f"{result!r}, not the result of part {index}; is the image's airflow-tf this version?")
    return result


def delete_part(options: KubernetesPartOptions, namespace: str, name: str,
                backend: KubernetesBackend | None = None) -> None:
    """Delete a part's Job (its pod with it); a failure to is logged, not raised: the Job's
    TTL removes it later."""
    try:
        if (backend or options.backend()).delete_job(namespace, name):
            log.info("deleted Job %s in namespace %s", name, namespace)
    except BackendError as e:
        log.warning("could not delete Job %s in namespace %s (Kubernetes removes it %ss after it ended): %s",
                    name, namespace, options.ttl_seconds_after_finished, e)
