"""The Kubernetes backend: each role of a group is an Indexed Job (or, with
``workload="jobset"``, the group is one JobSet: :mod:`.jobset`), the group's headless
Service gives every task a stable DNS name, and Kubernetes owns the lifecycle (restarts,
deadline, cleanup); see :mod:`.jobs` and :mod:`.manifests` for the objects and why. The
one-off Jobs (evaluation, export, a prepare's parts) are :mod:`.one_off`'s, which the backend
hands its connection.

Every API call goes through the cncf-kubernetes provider's hooks: ``KubernetesHook`` for
the synchronous calls (launch, status, logs, teardown, one-off Jobs) and
``AsyncKubernetesHook`` for ``watch()`` (:mod:`.watch`), which follows pod events with a
resource version and reads a fresh list only when the watch breaks. Connection settings are the provider's
own (``kubernetes_conn_id``, ``in_cluster``, ``config_file``, ``cluster_context``,
``namespace``) and travel in the GroupRef, so any process can reconnect.

Reading status changes one thing only: a group pod stuck ``Terminating`` on a node judged lost
is force-deleted so that its Job replaces it (:mod:`.nodes`); the other writes are ``launch()``,
``teardown()`` and ``run_component()`` (evaluation and export on the cluster). What the Jobs and pods mean for
the group is decided in :mod:`.status`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from functools import cached_property
from typing import Any

from airflow_tf.cluster import DEFAULT_SUCCESS_POLICY, GroupSpec, GroupStatus, SpecError
from airflow_tf.cluster.progress import parse_progress

from ..base import BackendError, GroupRef
from ..options import BackendOptionError, check_options
from .backend_options import OPTIONS, TEAM_PLACEHOLDER
from .calls import event_selector as _event_selector
from .calls import explain as _explain
from .calls import progress_pod as _progress_pod
from .calls import role_of as _role
from .calls import tasks as _tasks
from .labels import ROOT_ANNOTATION, SUCCESS_POLICY
from .manifests import DEFAULT_PS_MAX_LIFETIME_SECONDS, DEFAULT_TTL_SECONDS_AFTER_FINISHED, group_selector, owned_by
from .nodes import (
    DEFAULT_UNREACHABLE_TOLERATION_SECONDS,
    FORCE_DELETE_MISSES,
    JobPatch,
    force_deletion,
    job_patches,
    lost_pods,
)
from .status import (
    INDEX_LABEL,
    assess,
    latest_pods,
    overdue_unschedulable,
    scheduler_message,
)
from .jobset import JobSetGroup, is_jobset, lead_template
from .one_off import (
    PROGRESS_TAIL_LINES,
    STARTED_PHASES,
    OneOffJobs,
)
from .one_off import name_of as _name
from .one_off import now as _now
from .render import render_workload
from .watch import watch_group
from .workloads import DEFAULT_WORKLOAD

log = logging.getLogger(__name__)

_KINDS = ("jobs", "services", "networkpolicies", "poddisruptionbudgets")
_KIND_OF = {"jobs": "Job", "services": "Service", "networkpolicies": "NetworkPolicy",
            "poddisruptionbudgets": "PodDisruptionBudget"}
# Deleting a Job through the API orphans its pods unless told otherwise (kubectl defaults
# to background); Background deletes the Job at once and its dependents right after.
_PROPAGATION = "Background"


class KubernetesBackend:
    """Run a training group as Indexed Jobs and a headless Service in one namespace.

    :param kubernetes_conn_id: the provider's Kubernetes connection (None: no connection,
        use ``config_file`` / ``in_cluster`` / the default kubeconfig).
    :param namespace: where the group runs; default: the connection's namespace, else ``default``.
        In the operators' ``backend_options`` (and ``[airflow_tf] backend_options``) it may hold
        ``{team}``, filled in with the team of the task's DAG (Airflow's multi-team mode), e.g.
        ``"ml-{team}"``: one setting, a namespace per team.
    :param in_cluster, config_file, cluster_context: as for the provider's ``KubernetesHook``.
    :param cluster_domain: appended to the tasks' DNS names (``cluster.local``); by default
        the names end in ``.svc`` and the pods' DNS search path completes them.
    :param network_policy: create, with each group, a NetworkPolicy through which its pods accept
        connections only from the group's own pods (default True). False logs a warning at each
        launch: the group's gRPC servers, which have no authentication, are then open to any pod
        that can reach them.
    :param workload: the group's form: ``"jobs"`` (default), one Indexed Job per role, or
        ``"jobset"``, the whole group as one JobSet (needs the JobSet controller; the form a Kueue
        ``queue_name`` requires, as Kueue admits a JobSet whole). See :mod:`.workloads`.
    :param pod_defaults: pod settings for every role (same keys as ``RoleSpec.kubernetes``,
        which wins per key), e.g. the data and run-output volumes, a pod template, a Kueue queue.
    :param image: the training image of groups that name none (neither the launch's ``image``
        nor a role's): a deployment's one setting in ``[airflow_tf] backend_options``.
    :param ttl_seconds_after_finished: the whole group (parameter servers included) is
        deleted by Kubernetes this long after its root Job finished, whether or not Airflow
        tore it down; None keeps it until deleted.
    :param ps_max_lifetime_seconds: the parameter servers' deadline when the group has no
        ``active_deadline_seconds``: bounds a ps whose workers never finish and whose
        Airflow is gone.
    :param progress_interval: how often ``watch()`` re-reads the chief's log for progress,
        and the longest a single pod watch request stays open.
    :param poll_interval: how often ``watch()`` lists pods while the watch API is unavailable,
        and the longest ``run_component()`` waits between checks of its Job (from 1 s, doubling).
    :param task_template: recorded at launch (in the GroupRef): the lead trainer's pod
        template, which the evaluation and export Jobs reuse (image, volumes, service account).
    :param unreachable_toleration_seconds: every task's ``tolerationSeconds`` for the
        ``node.kubernetes.io/unreachable`` and ``node.kubernetes.io/not-ready`` NoExecute taints:
        how long its pod stays bound to a node judged lost before Kubernetes evicts it and its Job
        replaces it (default 30; None: Kubernetes' default, 300). A role's own toleration for
        either key wins.
    :param spread_over_nodes: give the roles without an ``affinity`` of their own a preferred pod
        anti-affinity (default True): the parameter servers prefer nodes without the group's
        trainers, the workers nodes without another worker, so that one lost node takes as
        little of the group as the cluster allows.
    :param disruption_budget: create, with each group, a PodDisruptionBudget (``maxUnavailable:
        0``) owned by its root: ``kubectl drain`` then waits for the group to end instead of
        evicting its pods (default False: a drain evicts them and the Jobs replace them).
    """

    name = "kubernetes"
    OPTIONS = OPTIONS

    def __init__(self, kubernetes_conn_id: str | None = "kubernetes_default", namespace: str | None = None, *,
                 in_cluster: bool | None = None, config_file: str | None = None, cluster_context: str | None = None,
                 cluster_domain: str | None = None, network_policy: bool = True,
                 workload: str = DEFAULT_WORKLOAD, pod_defaults: dict[str, Any] | None = None,
                 image: str | None = None,
                 ttl_seconds_after_finished: int | None = DEFAULT_TTL_SECONDS_AFTER_FINISHED,
                 ps_max_lifetime_seconds: int = DEFAULT_PS_MAX_LIFETIME_SECONDS,
                 progress_interval: float = 60.0, poll_interval: float = 30.0,
                 task_template: dict[str, Any] | None = None,
                 unreachable_toleration_seconds: int | None = DEFAULT_UNREACHABLE_TOLERATION_SECONDS,
                 spread_over_nodes: bool = True, disruption_budget: bool = False) -> None:
        given = {key: value for key, value in locals().items() if key in OPTIONS}
        options = check_options(self.name, OPTIONS, given, "KubernetesBackend")
        if TEAM_PLACEHOLDER in (options["namespace"] or ""):
            raise BackendOptionError(f"KubernetesBackend: namespace: {options['namespace']!r} still holds "
                                     f"{TEAM_PLACEHOLDER}, which the operators fill in with the task's team; "
                                     "give the namespace itself")
        self.kubernetes_conn_id: str | None = options["kubernetes_conn_id"]
        self._namespace: str | None = options["namespace"]
        self.in_cluster: bool | None = options["in_cluster"]
        self.config_file: str | None = options["config_file"]
        self.cluster_context: str | None = options["cluster_context"]
        self.cluster_domain: str | None = options["cluster_domain"]
        self.workload: str = options["workload"]
        self.network_policy: bool = options["network_policy"]
        self.pod_defaults: dict[str, Any] = options["pod_defaults"] or {}
        self.image: str | None = options["image"]
        self.ttl_seconds_after_finished: int | None = options["ttl_seconds_after_finished"]
        self.ps_max_lifetime_seconds: int = options["ps_max_lifetime_seconds"]
        self.progress_interval: float = options["progress_interval"]
        self.poll_interval: float = options["poll_interval"]
        self.task_template: dict[str, Any] | None = options["task_template"]
        self.unreachable_toleration_seconds: int | None = options["unreachable_toleration_seconds"]
        self.spread_over_nodes: bool = options["spread_over_nodes"]
        self.disruption_budget: bool = options["disruption_budget"]

    # -- connection ----------------------------------------------------------------------
    def _hook_args(self) -> dict[str, Any]:
        return {"kubernetes_conn_id": self.kubernetes_conn_id, "in_cluster": self.in_cluster,
                "config_file": self.config_file, "cluster_context": self.cluster_context}

    @cached_property
    def hook(self):
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return KubernetesHook(**self._hook_args())

    @cached_property
    def _core(self):
        return self.hook.core_v1_client

    @cached_property
    def _batch(self):
        from kubernetes import client

        return client.BatchV1Api(api_client=self.hook.api_client)

    @cached_property
    def _policy(self):
        from kubernetes import client

        return client.PolicyV1Api(api_client=self.hook.api_client)

    @cached_property
    def _networking(self):
        from kubernetes import client

        return client.NetworkingV1Api(api_client=self.hook.api_client)

    async def _async_hook(self):
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

        hook = AsyncKubernetesHook(**self._hook_args())
        if self.config_file:
            # The async hook reads a kubeconfig path only from the connection's extras;
            # hand it this backend's config_file the same way so both hooks agree.
            extras = {**await hook.get_conn_extras(), "kube_config_path": self.config_file}
            hook = AsyncKubernetesHook(connection_extras=extras, **self._hook_args())
        return hook

    @cached_property
    def namespace(self) -> str:
        return self._namespace or self.hook.get_namespace() or "default"

    def _ref(self, group: str, success_policy: str, task_template: dict | None = None,
             root: dict | None = None) -> GroupRef:
        options = {**self._hook_args(), "cluster_domain": self.cluster_domain, "network_policy": self.network_policy,
                   "workload": self.workload,
                   "ttl_seconds_after_finished": self.ttl_seconds_after_finished,
                   "ps_max_lifetime_seconds": self.ps_max_lifetime_seconds,
                   "progress_interval": self.progress_interval, "poll_interval": self.poll_interval,
                   "task_template": task_template, "disruption_budget": self.disruption_budget}
        return GroupRef(backend=self.name, name=group, namespace=self.namespace, options=options,
                        success_policy=success_policy, uid=None if root is None else root["metadata"].get("uid"),
                        labels={} if root is None else _airflow_labels(root))

    def _ns(self, ref: GroupRef) -> str:
        return ref.namespace or self.namespace

    @contextlib.contextmanager
    def _api(self, action: str) -> Iterator[None]:
        """Turn client errors into BackendErrors that say what failed and what to do."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            yield
        except ApiException as e:
            raise BackendError(_explain(action, e.status, e.reason, e.body)) from e
        except HTTPError as e:
            host = self.hook.api_client.configuration.host
            raise BackendError(f"{action}: cannot reach the Kubernetes API at {host}: {e}; "
                               "check the connection (kubernetes_conn_id / config_file / in_cluster)") from e

    def _plain(self, obj: Any) -> dict:
        return self.hook.api_client.sanitize_for_serialization(obj)

    # -- sync API calls ------------------------------------------------------------------
    def _list(self, kind: str, namespace: str, selector: str) -> list[dict]:
        with self._api(f"list {kind} {selector!r} in namespace {namespace}"):
            if kind == "pods":
                result = self._core.list_namespaced_pod(namespace, label_selector=selector)
            elif kind == "jobs":
                result = self._batch.list_namespaced_job(namespace, label_selector=selector)
            elif kind == "services":
                result = self._core.list_namespaced_service(namespace, label_selector=selector)
            elif kind == "poddisruptionbudgets":
                result = self._policy.list_namespaced_pod_disruption_budget(namespace, label_selector=selector)
            else:
                result = self._networking.list_namespaced_network_policy(namespace, label_selector=selector)
        return [self._plain(item) for item in result.items]

    def _create(self, obj: dict) -> dict | None:
        """Create one object and return it as stored; None when it already exists."""
        from kubernetes.client.exceptions import ApiException

        ns, kind = obj["metadata"]["namespace"], obj["kind"]
        create: Callable[..., Any] = {
            "Job": self._batch.create_namespaced_job, "Service": self._core.create_namespaced_service,
            "NetworkPolicy": self._networking.create_namespaced_network_policy,
            "PodDisruptionBudget": self._policy.create_namespaced_pod_disruption_budget,
        }[kind]
        try:
            with self._api(f"create {kind} {_name(obj)} in namespace {ns}"):
                return self._plain(create(ns, body=obj))
        except BackendError as e:
            if isinstance(e.__cause__, ApiException) and e.__cause__.status == 409:
                return None
            raise

    def _delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete one object and, in the background, what it owns; False when already gone."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        delete = {"jobs": self._batch.delete_namespaced_job, "services": self._core.delete_namespaced_service,
                  "networkpolicies": self._networking.delete_namespaced_network_policy,
                  "poddisruptionbudgets": self._policy.delete_namespaced_pod_disruption_budget}[kind]
        try:
            with self._api(f"delete {kind} {name} in namespace {namespace}"):
                delete(name, namespace, body=client.V1DeleteOptions(propagation_policy=_PROPAGATION))
        except BackendError as e:
            if isinstance(e.__cause__, ApiException) and e.__cause__.status == 404:
                return False
            raise
        return True

    def _force_delete(self, namespace: str, pod: dict) -> None:
        """Release a pod stuck on a lost node (:class:`.nodes.ForceDeletion`), through the sync client."""
        from kubernetes.client.exceptions import ApiException

        release = force_deletion(pod, namespace)
        try:
            with self._api(release.marking):
                self._core.patch_namespaced_pod_status(release.pod, namespace, release.status_patch)
            with self._api(release.deleting):
                self._core.delete_namespaced_pod(release.pod, namespace, body=release.delete_options)
        except BackendError as e:
            if isinstance(e.__cause__, ApiException) and e.__cause__.status in FORCE_DELETE_MISSES:
                return  # gone, or replaced, meanwhile
            raise
        release.done(log)

    def _patch_job(self, patch: JobPatch) -> None:
        """Send one step of moving a cut-off task off its node (:func:`.nodes.job_patches`)."""
        with self._api(patch.doing):
            self._batch.patch_namespaced_job(patch.job, patch.namespace, patch.patch)
        log.warning("%s", patch.done)

    def _read_log(self, namespace: str, pod: str, container: str, tail_lines: int | None, **since: Any) -> str:
        """``since``: the API's since_seconds, timestamps and limit_bytes, when given."""
        from kubernetes.client.exceptions import ApiException

        try:
            # Raw bytes, decoded here: the generated client turns a 'str' body into the
            # repr of bytes, or into a number when the log happens to parse as JSON.
            response = self._core.read_namespaced_pod_log(pod, namespace, container=container, tail_lines=tail_lines,
                                                          _preload_content=False, **since)
            return response.data.decode("utf-8", errors="replace")
        except ApiException as e:
            if e.status in (400, 404):  # not started yet, or gone
                return ""
            raise BackendError(_explain(f"read the log of pod {pod}", e.status, e.reason, e.body)) from e

    # -- one-off Jobs (:mod:`.one_off`) ----------------------------------------------------
    @property
    def one_off(self) -> OneOffJobs:
        """The one-off Jobs run on this backend's connection, with its settings as they are now."""
        return OneOffJobs(self, task_template=self.task_template, poll_interval=self.poll_interval,
                          ttl_seconds_after_finished=self.ttl_seconds_after_finished)

    def run_component(self, ref: GroupRef, component: str, request: dict[str, Any], *,
                      timeout: float = 3600.0) -> dict[str, Any]:
        """Run ``component`` (evaluate, export) once as a Job on the group's training image and return
        its result: see :meth:`.one_off.OneOffJobs.run_component`."""
        return self.one_off.run_component(ref, component, request, timeout=timeout)

    def run_one_off(self, body: dict, *, what: str, on_log: Callable[[str], None] | None = None) -> dict:
        """Run the one-off Job ``body`` to its end and return its pod: see
        :meth:`.one_off.OneOffJobs.run_one_off`."""
        return self.one_off.run_one_off(body, what=what, on_log=on_log)

    def one_off_result(self, pod: dict, container: str) -> dict[str, Any]:
        """The result a one-off Job's pod returned: see :meth:`.one_off.OneOffJobs.one_off_result`."""
        return self.one_off.one_off_result(pod, container)

    def delete_job(self, namespace: str, name: str) -> bool:
        """Delete a Job and its pods; False when it was gone already."""
        return self.one_off.delete_job(namespace, name)

    # -- the protocol --------------------------------------------------------------------
    def render(self, spec: GroupSpec) -> list[dict]:
        """The objects ``launch()`` creates (without the ownerReferences, which need the root's uid),
        in the backend's workload form."""
        if spec.image is None and self.image is not None:
            spec = dataclasses.replace(spec, image=self.image)
        return render_workload(self.workload, spec, self.namespace, cluster_domain=self.cluster_domain,
                               network_policy=self.network_policy, pod_defaults=self.pod_defaults,
                               ttl_seconds_after_finished=self.ttl_seconds_after_finished,
                               ps_max_lifetime_seconds=self.ps_max_lifetime_seconds,
                               unreachable_toleration_seconds=self.unreachable_toleration_seconds,
                               spread_over_nodes=self.spread_over_nodes, disruption_budget=self.disruption_budget)

    def launch(self, spec: GroupSpec) -> GroupRef:
        try:
            objects = self.render(spec)
        except SpecError as e:
            raise BackendError(str(e)) from e
        if not self.network_policy:
            log.warning("network_policy=False: group %s gets no NetworkPolicy, so any pod that can reach its pods "
                        "can drive its TensorFlow gRPC servers, which have no authentication; leave network_policy "
                        "on unless the cluster isolates them otherwise", spec.name)
        if self.workload == "jobset":
            jobset, made = JobSetGroup(self).launch(spec, objects)
            self._log_launch(spec.name, made)
            return self._ref(spec.name, spec.success_policy, task_template=lead_template(objects[0]), root=jobset)
        namespace = self.namespace
        kinds = ["jobs", "services"] + (["networkpolicies"] if self.network_policy else []) + (
            ["poddisruptionbudgets"] if self.disruption_budget else [])
        # Keyed by the kind listed: a real API server's list items carry no kind of their own.
        existing = {(_KIND_OF[kind], _name(o)): o for kind in kinds
                    for o in self._list(kind, namespace, group_selector(spec.name))}
        # The root first: everything else is owned by it, so deleting it removes the group.
        root_body, rest = objects[0], objects[1:]
        root = existing.get(("Job", _name(root_body)))
        created: list[str] = []
        if root is None:
            root = self._create(root_body)
            if root is None:  # created by a concurrent try since we listed
                root = next(o for o in self._list("jobs", namespace, group_selector(spec.name, _role(root_body)))
                            if _name(o) == _name(root_body))
            else:
                created.append(f"Job/{_name(root_body)}")
        for obj in rest:
            if (obj["kind"], _name(obj)) not in existing and self._create(owned_by(obj, root)) is not None:
                created.append(f"{obj['kind']}/{_name(obj)}")
        self._log_launch(spec.name, created)
        return self._ref(spec.name, spec.success_policy, task_template=root_body["spec"]["template"],
                         root=root)

    def _log_launch(self, group: str, created: list[str]) -> None:
        if created:
            log.info("launched training group %s in namespace %s: created %s", group, self.namespace,
                     ", ".join(created))
        else:
            log.info("training group %s already exists in namespace %s; re-attached", group, self.namespace)

    def hand_over(self, ref: GroupRef) -> None:
        """Nothing to untie: the group's lifetime is bounded by Kubernetes itself (the root
        Job's TTL and the parameter servers' deadline), not by the launching process."""

    def find(self, name: str) -> GroupRef | None:
        if self.workload == "jobset":
            jobset = JobSetGroup(self).get(self.namespace, name)
            if jobset is None:
                return None
            policy = (jobset["metadata"].get("annotations") or {}).get(SUCCESS_POLICY, DEFAULT_SUCCESS_POLICY)
            return self._ref(name, policy, task_template=lead_template(jobset), root=jobset)
        jobs = self._list("jobs", self.namespace, group_selector(name))
        roots = [j for j in jobs if (j["metadata"].get("annotations") or {}).get(ROOT_ANNOTATION) == "true"]
        if not roots:
            return None
        policy = roots[0]["metadata"]["annotations"].get(SUCCESS_POLICY, DEFAULT_SUCCESS_POLICY)
        return self._ref(name, policy, task_template=(roots[0].get("spec") or {}).get("template"),
                         root=roots[0])

    def _group_jobs(self, namespace: str, group: str) -> list[dict]:
        return _tasks(self._list("jobs", namespace, group_selector(group)))

    def status(self, ref: GroupRef) -> GroupStatus:
        namespace, now = self._ns(ref), _now()
        jobs = self._group_jobs(namespace, ref.name)
        pods = _tasks(self._list("pods", namespace, group_selector(ref.name)))
        for lost in lost_pods(pods, now):
            self._force_delete(namespace, lost)
        for patch in job_patches(jobs, pods, namespace, now):
            self._patch_job(patch)
        messages = {}
        for pod in overdue_unschedulable(pods, now):
            with self._api(f"list events of pod {pod}"):
                events = self._core.list_namespaced_event(namespace, field_selector=_event_selector(pod))
            messages[pod] = scheduler_message([self._plain(e) for e in events.items])
        lead = _progress_pod(pods)
        progress = None
        if lead is not None:
            progress = parse_progress(self._read_log(namespace, _name(lead), _role(lead) or "", PROGRESS_TAIL_LINES))
        jobset = JobSetGroup(self).view(namespace, ref.name) if is_jobset(ref) else {}
        return assess(ref.name, jobs, pods, now, scheduler_messages=messages, progress=progress, **jobset)

    def logs(self, ref: GroupRef, role: str, index: int, tail_lines: int | None = None) -> str:
        namespace = self._ns(ref)
        pods = self._list("pods", namespace, f"{group_selector(ref.name, role)},{INDEX_LABEL}={index}")
        pod = latest_pods(pods).get((role, index))
        return "" if pod is None else self._read_log(namespace, _name(pod), role, tail_lines)

    def log_since(self, ref: GroupRef, role: str, index: int, cursor: dict[str, Any] | None = None,
                  limit_bytes: int = 1 << 20) -> tuple[str, dict[str, Any]]:
        """The task's log lines written since ``cursor`` and the cursor after them (see
        :class:`airflow_tf.backends.follow.LogFollower`): its latest pod's log from the API, with
        timestamps, from a little before the last line read (``since_seconds``: the node's clock
        may run ahead of this one's); the lines up to that one are skipped. A new pod (the task
        restarted) is read from its start."""
        namespace = self._ns(ref)
        pods = self._list("pods", namespace, f"{group_selector(ref.name, role)},{INDEX_LABEL}={index}")
        pod = latest_pods(pods).get((role, index))
        cursor = dict(cursor or {})
        if pod is None or (pod.get("status") or {}).get("phase") not in STARTED_PHASES:
            return "", cursor
        name = _name(pod)
        if cursor.get("pod") != name:
            cursor = {"pod": name, "time": None}
        since = {"timestamps": True, "limit_bytes": limit_bytes}
        if cursor["time"]:
            behind = _now().timestamp() - _log_time(cursor["time"]) / 1e9
            since["since_seconds"] = max(1, math.ceil(behind) + LOG_CLOCK_SLACK_SECONDS)
        text = self._read_log(namespace, name, role, None, **since)
        read = text.splitlines()
        if len(text.encode()) >= limit_bytes and len(read) > 1:
            read.pop()  # cut at limit_bytes: read again, whole, next time
        lines = []
        for line in read:
            stamp, _, rest = line.partition(" ")
            try:
                moment = _log_time(stamp)
            except ValueError:  # no timestamp: the part of a line longer than limit_bytes
                continue
            if cursor["time"] is None or moment > _log_time(cursor["time"]):
                lines.append(rest)
                cursor["time"] = stamp
        return "".join(f"{line}\n" for line in lines), cursor

    def teardown(self, ref: GroupRef, roles: Iterable[str] | None = None) -> list[str]:
        """Delete the group (the root Job first: garbage collection removes what it owns),
        or only the Jobs of ``roles``. Pods go with their Job. An evaluation or export Job of the
        group is left to its task, which may still run beside the teardown: it deletes its Job
        once it has the result (Kubernetes does, after its TTL, should the task die)."""
        namespace = self._ns(ref)
        deleted = []
        # A JobSet first: its controller would otherwise make again the Jobs deleted below.
        if roles is None and is_jobset(ref) and JobSetGroup(self).delete(namespace, ref.name):
            deleted.append(f"jobset/{ref.name}")
        if roles is None:
            jobs = sorted(self._group_jobs(namespace, ref.name),
                          key=lambda j: (j["metadata"].get("annotations") or {}).get(ROOT_ANNOTATION) != "true")
            objects = [("jobs", j) for j in jobs]
            asked = {"networkpolicies": ref.options.get("network_policy", self.network_policy),
                     "poddisruptionbudgets": ref.options.get("disruption_budget", self.disruption_budget)}
            objects += [(kind, o) for kind in _KINDS[1:] if asked.get(kind, True)
                        for o in self._list(kind, namespace, group_selector(ref.name))]
        else:
            objects = [("jobs", j) for role in roles for j in self._list("jobs", namespace, group_selector(ref.name, role))]
        for kind, obj in objects:
            # Also what the root owns: a cascade is asynchronous, and an object created
            # by a launch that died before setting its owner would stay.
            if self._delete(kind, namespace, _name(obj)):
                deleted.append(f"{_KIND_OF[kind].lower()}/{_name(obj)}")
        if deleted:
            log.info("deleted from namespace %s: %s", namespace, ", ".join(deleted))
        return deleted

    # -- watching ------------------------------------------------------------------------
    def watch(self, ref: GroupRef, timeout: float | None = None) -> AsyncIterator[GroupStatus]:
        """Yield the status now and whenever it changes, following pod events (:mod:`.watch`).

        One watch request stays open for at most ``progress_interval`` seconds (or until
        the next timeout of a pending pod); when it ends, progress is re-read from the
        chief's log. Only if the watch fails does this fall back to listing pods every
        ``poll_interval`` seconds."""
        return watch_group(self, ref, timeout)


LOG_CLOCK_SLACK_SECONDS = 60
"""How far before the last line read a log is read again (its lines up to that one skipped):
room for a node's clock ahead of the Airflow worker's."""


def _log_time(stamp: str) -> int:
    """A kubelet log timestamp (RFC 3339 in UTC, up to nine fraction digits, trailing zeros
    trimmed) in nanoseconds since the epoch: lines a few nanoseconds apart stay apart."""
    head, _, fraction = stamp.rstrip("Z").partition(".")
    if not stamp.endswith("Z") or (fraction and not fraction.isdigit()):
        raise ValueError(f"not a log timestamp: {stamp!r}")
    moment = datetime.datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC)
    return int(moment.timestamp()) * 1_000_000_000 + int((fraction + "0" * 9)[:9])


def _airflow_labels(obj: dict) -> dict[str, str]:
    """The launch's own labels of an object (the Airflow ids), without the backend's."""
    return {k: v for k, v in (obj["metadata"].get("labels") or {}).items() if k.startswith("airflow.")}
