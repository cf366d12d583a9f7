"""The Kubernetes backend: each task of a group is a pod with a headless Service of the
same name, so TF_CONFIG can name every task by its stable DNS name.

Every API call goes through the cncf-kubernetes provider's hooks: ``KubernetesHook`` for
the synchronous calls (launch, status, logs, teardown) and ``AsyncKubernetesHook`` for
``watch()``, which follows pod events with a resource version and reads a fresh list
only when the watch breaks. Connection settings are the provider's own
(``kubernetes_conn_id``, ``in_cluster``, ``config_file``, ``cluster_context``,
``namespace``) and travel in the GroupRef, so any process can reconnect.

What a pod's state means for the group is decided in :mod:`.kubernetes_status`; what
the objects look like, in :mod:`.kubernetes_manifests` and ``templates/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import math
import time
from functools import cached_property
from typing import Any, AsyncIterator, Callable, Iterable, Iterator

from airflow_tf.cluster import GroupSpec, GroupStatus, task_name
from airflow_tf.cluster.progress import parse_progress

from .base import BackendError, GroupRef
from .kubernetes_manifests import SUCCESS_POLICY, group_selector, render_group
from .kubernetes_status import (
    assess, lead_pod, next_wakeup, overdue_unschedulable, recreated, role_index, scheduler_message,
)

log = logging.getLogger(__name__)

PROGRESS_TAIL_LINES = 20
_RECREATE_ATTEMPTS = 20
_RECREATE_PAUSE = 0.5
_STARTED_PHASES = ("Running", "Succeeded", "Failed")
_CONNECTION_OPTIONS = ("kubernetes_conn_id", "in_cluster", "config_file", "cluster_context")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _uid(pod: dict) -> str | None:
    return (pod.get("metadata") or {}).get("uid")


def _name(obj: dict) -> str:
    return obj["metadata"]["name"]


class KubernetesBackend:
    """Run a training group as pods and headless Services in one namespace.

    :param kubernetes_conn_id: the provider's Kubernetes connection (None: no connection,
        use ``config_file`` / ``in_cluster`` / the default kubeconfig).
    :param namespace: where the group runs; default: the connection's namespace, else ``default``.
    :param in_cluster, config_file, cluster_context: as for the provider's ``KubernetesHook``.
    :param cluster_domain: appended to the tasks' DNS names (``cluster.local``); by default
        the names end in ``.svc`` and the pods' DNS search path completes them.
    :param network_policy: also create a NetworkPolicy admitting gRPC only from the group's pods.
    :param pod_defaults: pod settings for every role (same keys as ``RoleSpec.kubernetes``,
        which wins per key), e.g. the data and run-output volumes.
    :param progress_interval: how often ``watch()`` re-reads the chief's log for progress,
        and the longest a single pod watch request stays open.
    :param poll_interval: how often ``watch()`` lists pods while the watch API is unavailable.
    """

    name = "kubernetes"

    def __init__(self, kubernetes_conn_id: str | None = "kubernetes_default", namespace: str | None = None, *,
                 in_cluster: bool | None = None, config_file: str | None = None, cluster_context: str | None = None,
                 cluster_domain: str | None = None, network_policy: bool = False,
                 pod_defaults: dict[str, Any] | None = None, progress_interval: float = 60.0,
                 poll_interval: float = 30.0) -> None:
        self.kubernetes_conn_id = kubernetes_conn_id
        self._namespace = namespace
        self.in_cluster = in_cluster
        self.config_file = config_file
        self.cluster_context = cluster_context
        self.cluster_domain = cluster_domain
        self.network_policy = network_policy
        self.pod_defaults = pod_defaults or {}
        self.progress_interval = float(progress_interval)
        self.poll_interval = float(poll_interval)

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

    def _ref(self, group: str, success_policy: str) -> GroupRef:
        options = {**self._hook_args(), "cluster_domain": self.cluster_domain, "network_policy": self.network_policy,
                   "progress_interval": self.progress_interval, "poll_interval": self.poll_interval}
        return GroupRef(backend=self.name, name=group, namespace=self.namespace, options=options,
                        success_policy=success_policy)

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
            elif kind == "services":
                result = self._core.list_namespaced_service(namespace, label_selector=selector)
            else:
                result = self._networking.list_namespaced_network_policy(namespace, label_selector=selector)
        return [self._plain(item) for item in result.items]

    def _create(self, obj: dict) -> bool:
        """Create one object; False when it already exists."""
        from kubernetes.client.exceptions import ApiException

        ns, kind = obj["metadata"]["namespace"], obj["kind"]
        create: Callable[..., Any] = {
            "Pod": self._core.create_namespaced_pod, "Service": self._core.create_namespaced_service,
            "NetworkPolicy": self._networking.create_namespaced_network_policy,
        }[kind]
        try:
            with self._api(f"create {kind} {_name(obj)} in namespace {ns}"):
                create(ns, body=obj)
        except BackendError as e:
            if isinstance(e.__cause__, ApiException) and e.__cause__.status == 409:
                return False
            raise
        return True

    def _delete(self, kind: str, namespace: str, name: str, **options: Any) -> bool:
        """Delete one object; False when it was already gone (or replaced, with a uid precondition)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        delete = {"pods": self._core.delete_namespaced_pod, "services": self._core.delete_namespaced_service,
                  "networkpolicies": self._networking.delete_namespaced_network_policy}[kind]
        uid = options.pop("uid", None)
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid) if uid else None, **options)
        try:
            with self._api(f"delete {kind} {name} in namespace {namespace}"):
                delete(name, namespace, body=body)
        except BackendError as e:
            if isinstance(e.__cause__, ApiException) and e.__cause__.status in (404, 409):
                return False
            raise
        return True

    def _read_log(self, namespace: str, pod: str, container: str, tail_lines: int | None) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            # Raw bytes, decoded here: the generated client turns a 'str' body into the
            # repr of bytes, or into a number when the log happens to parse as JSON.
            response = self._core.read_namespaced_pod_log(pod, namespace, container=container, tail_lines=tail_lines,
                                                          _preload_content=False)
            return response.data.decode("utf-8", errors="replace")
        except ApiException as e:
            if e.status in (400, 404):  # not started yet, or gone
                return ""
            raise BackendError(_explain(f"read the log of pod {pod}", e.status, e.reason, e.body)) from e

    # -- the protocol --------------------------------------------------------------------
    def launch(self, spec: GroupSpec) -> GroupRef:
        namespace = self.namespace
        self._core  # connect before rendering: the group's deadline counts from here
        objects = render_group(spec, namespace, cluster_domain=self.cluster_domain,
                               network_policy=self.network_policy, pod_defaults=self.pod_defaults)
        kinds = ["pods", "services"] + (["networkpolicies"] if self.network_policy else [])
        existing = {(o["kind"], _name(o)) for kind in kinds
                    for o in self._list(kind, namespace, group_selector(spec.name))}
        created = [f"{o['kind']}/{_name(o)}" for o in objects
                   if (o["kind"], _name(o)) not in existing and self._create(o)]
        if created:
            log.info("launched training group %s in namespace %s: created %s", spec.name, namespace, ", ".join(created))
        else:
            log.info("training group %s already exists in namespace %s; re-attached", spec.name, namespace)
        return self._ref(spec.name, spec.success_policy)

    def find(self, name: str) -> GroupRef | None:
        pods = self._list("pods", self.namespace, group_selector(name))
        if not pods:
            return None
        policy = (pods[0]["metadata"].get("annotations") or {}).get(SUCCESS_POLICY, "AllWorkers")
        return self._ref(name, policy)

    def status(self, ref: GroupRef) -> GroupStatus:
        namespace, now = self._ns(ref), _now()
        pods = self._list("pods", namespace, group_selector(ref.name))
        messages = {}
        for pod in overdue_unschedulable(pods, now):
            with self._api(f"list events of pod {pod}"):
                events = self._core.list_namespaced_event(namespace, field_selector=_event_selector(pod))
            messages[pod] = scheduler_message([self._plain(e) for e in events.items])
        lead = lead_pod(pods)
        progress = None
        if lead is not None and (lead.get("status") or {}).get("phase") in _STARTED_PHASES:
            progress = parse_progress(self._read_log(namespace, _name(lead), role_index(lead)[0], PROGRESS_TAIL_LINES))
        result = assess(ref.name, pods, now, scheduler_messages=messages, progress=progress)
        for pod in result.restart:
            self._recreate(pod, now)
        return result.status

    def _recreate(self, pod: dict, now: dt.datetime) -> dict | None:
        namespace, name = pod["metadata"]["namespace"], _name(pod)
        # Delete only this very pod (uid precondition), so two observers never replace it twice.
        if not self._delete("pods", namespace, name, uid=_uid(pod), grace_period_seconds=0):
            return None
        body = recreated(pod, now)
        for _ in range(_RECREATE_ATTEMPTS):  # the old pod may take a moment to disappear
            if self._create(body):
                log.warning("restarted task %s (pod recreated, restart %s)", name,
                            body["metadata"]["annotations"].get("airflow-tf/restarts"))
                return body
            time.sleep(_RECREATE_PAUSE)
        raise BackendError(f"could not recreate pod {name} in namespace {namespace}: "
                           "the old pod is still being deleted; the next status check retries")

    def logs(self, ref: GroupRef, role: str, index: int, tail_lines: int | None = None) -> str:
        return self._read_log(self._ns(ref), task_name(ref.name, role, index), role, tail_lines)

    def teardown(self, ref: GroupRef, roles: Iterable[str] | None = None) -> list[str]:
        namespace = self._ns(ref)
        selectors = [group_selector(ref.name)] if roles is None else [group_selector(ref.name, r) for r in roles]
        kinds = ["pods", "services"]
        if roles is None and ref.options.get("network_policy", self.network_policy):
            kinds.append("networkpolicies")
        deleted = []
        for selector in selectors:
            for kind in kinds:
                for obj in self._list(kind, namespace, selector):
                    if self._delete(kind, namespace, _name(obj)):
                        deleted.append(f"{obj.get('kind', kind).lower()}/{_name(obj)}")
        if deleted:
            log.info("deleted from namespace %s: %s", namespace, ", ".join(deleted))
        return deleted

    # -- watching ------------------------------------------------------------------------
    async def watch(self, ref: GroupRef, timeout: float | None = None) -> AsyncIterator[GroupStatus]:
        """Yield the status now and whenever it changes, following pod events.

        One watch request stays open for at most ``progress_interval`` seconds (or until
        the next timeout of a pending pod); when it ends, progress is re-read from the
        chief's log. Only if the watch fails does this fall back to listing pods every
        ``poll_interval`` seconds."""
        import aiohttp
        from kubernetes_asyncio import client as async_client, watch as async_watch

        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        namespace, selector = self._ns(ref), group_selector(ref.name)
        hook = await self._async_hook()
        async with hook.get_conn() as api:
            group = _WatchedGroup(self, ref, async_client.CoreV1Api(api), api, namespace, selector)
            await self._relist_after_error(group, loop, end)
            last = None
            watch_allowed = True
            while True:
                status = await group.status()
                if status.to_dict() != last:
                    last = status.to_dict()
                    yield status
                remaining = None if end is None else end - loop.time()
                if remaining is not None and remaining <= 0:
                    return
                wait = min(x for x in (self.progress_interval, remaining, group.seconds_to_wakeup()) if x is not None)
                if not watch_allowed or wait < 1:
                    # No watch allowed, or less than the API's one-second watch timeout left.
                    await asyncio.sleep(min(self.poll_interval, wait))
                    await group.relist()
                    continue
                try:
                    async with async_watch.Watch() as pod_watch:
                        stream = pod_watch.stream(
                            group.core.list_namespaced_pod, namespace, label_selector=selector,
                            resource_version=group.resource_version, allow_watch_bookmarks=True,
                            timeout_seconds=max(1, math.ceil(wait)))
                        async for event in stream:
                            if group.apply(event["type"], event["raw_object"]):
                                status = await group.status()
                                if status.to_dict() != last:
                                    last = status.to_dict()
                                    yield status
                except async_client.exceptions.ApiException as e:
                    if e.status == 410:  # our version was compacted away: start from a fresh list
                        await group.relist()
                        continue
                    if e.status == 403:
                        watch_allowed = False
                        log.warning("not allowed to watch pods in %s (%s); listing every %.0fs instead; "
                                    "grant 'watch' on pods (airflow_tf/rbac/role.yaml)", namespace, e.reason,
                                    self.poll_interval)
                    else:
                        await self._pause_after_error(e, loop, end)
                    await self._relist_after_error(group, loop, end)
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                    await self._pause_after_error(e, loop, end)
                    await self._relist_after_error(group, loop, end)

    async def _pause_after_error(self, error: BaseException, loop: asyncio.AbstractEventLoop, end: float | None) -> None:
        pause = self.poll_interval if end is None else max(0.0, min(self.poll_interval, end - loop.time()))
        log.warning("watching pods failed (%s); listing them again in %.0fs", error, pause)
        await asyncio.sleep(pause)

    async def _relist_after_error(self, group: "_WatchedGroup", loop: asyncio.AbstractEventLoop,
                                  end: float | None) -> None:
        """List the pods (again); while the API server is unavailable, keep trying every
        ``poll_interval``: a trigger outlives an API server restart."""
        import aiohttp
        from kubernetes_asyncio.client.exceptions import ApiException

        while True:
            try:
                await group.relist()
                return
            except (ApiException, aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                if isinstance(e, ApiException) and e.status in (401, 403, 404):
                    raise BackendError(_explain(f"list the pods of group {group.ref.name}", e.status, e.reason,
                                                e.body)) from e
                if end is not None and loop.time() >= end:
                    return
                await self._pause_after_error(e, loop, end)


class _WatchedGroup:
    """The pods of one group as last seen by ``watch()``, and their status."""

    def __init__(self, backend: KubernetesBackend, ref: GroupRef, core: Any, api: Any, namespace: str, selector: str):
        self.backend, self.ref, self.core, self.api = backend, ref, core, api
        self.namespace, self.selector = namespace, selector
        self.pods: dict[str, dict] = {}
        self.replaced: set[str] = set()
        self.resource_version: str | None = None
        self.progress: dict[str, Any] | None = None
        self._progress_read_at: float | None = None

    async def relist(self) -> None:
        result = await self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        self.pods = {_name(p): p for p in (self.api.sanitize_for_serialization(i) for i in result.items)}
        self.resource_version = result.metadata.resource_version

    def apply(self, kind: str, pod: dict) -> bool:
        """Update the cache from one watch event; True when a pod changed."""
        self.resource_version = pod.get("metadata", {}).get("resourceVersion", self.resource_version)
        if kind == "BOOKMARK" or _uid(pod) in self.replaced:
            return False  # our own replacement of a failed pod is already in the cache
        name = _name(pod)
        if kind == "DELETED":
            if name in self.pods and _uid(self.pods[name]) == _uid(pod):
                del self.pods[name]
                return True
            return False
        self.pods[name] = pod
        return True

    def seconds_to_wakeup(self) -> float | None:
        now = _now()
        moment = next_wakeup(list(self.pods.values()), now)
        return None if moment is None else max(0.0, (moment - now).total_seconds()) + 0.5

    async def _read_progress(self) -> None:
        loop = asyncio.get_running_loop()
        if self._progress_read_at is not None and loop.time() - self._progress_read_at < self.backend.progress_interval:
            return
        lead = lead_pod(list(self.pods.values()))
        if lead is None or (lead.get("status") or {}).get("phase") not in _STARTED_PHASES:
            return
        self._progress_read_at = loop.time()
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            response = await self.core.read_namespaced_pod_log(
                _name(lead), self.namespace, container=role_index(lead)[0], tail_lines=PROGRESS_TAIL_LINES,
                _preload_content=False)
            async with response:
                text = await response.text(errors="replace")
        except ApiException:
            return
        self.progress = parse_progress(text) or self.progress

    async def status(self, confirmed: bool = False) -> GroupStatus:
        now = _now()
        pods = list(self.pods.values())
        messages = {}
        for pod in overdue_unschedulable(pods, now):
            events = await self.core.list_namespaced_event(self.namespace, field_selector=_event_selector(pod))
            messages[pod] = scheduler_message([self.api.sanitize_for_serialization(e) for e in events.items])
        await self._read_progress()
        result = assess(self.ref.name, pods, now, scheduler_messages=messages, progress=self.progress)
        if result.missing and not confirmed:
            # A DELETED event can arrive just before the ADDED of a replacement: judge a
            # missing pod from a fresh list, never from the event stream alone.
            await self.relist()
            return await self.status(confirmed=True)
        for pod in result.restart:
            new = await self._recreate(pod, now)
            if new is not None:
                self.replaced.add(_uid(pod))
                self.pods[_name(new)] = new
        return result.status

    async def _recreate(self, pod: dict, now: dt.datetime) -> dict | None:
        from kubernetes_asyncio import client as async_client

        name = _name(pod)
        try:
            await self.core.delete_namespaced_pod(name, self.namespace, body=async_client.V1DeleteOptions(
                grace_period_seconds=0, preconditions=async_client.V1Preconditions(uid=_uid(pod))))
        except async_client.exceptions.ApiException as e:
            if e.status in (404, 409):  # already gone or already replaced
                return None
            raise BackendError(_explain(f"delete failed pod {name} to restart it", e.status, e.reason, e.body)) from e
        body = recreated(pod, now)
        for _ in range(_RECREATE_ATTEMPTS):
            try:
                created = await self.core.create_namespaced_pod(self.namespace, body)
            except async_client.exceptions.ApiException as e:
                if e.status != 409:
                    raise BackendError(_explain(f"recreate pod {name}", e.status, e.reason, e.body)) from e
                await asyncio.sleep(_RECREATE_PAUSE)
                continue
            log.warning("restarted task %s (pod recreated)", name)
            return self.api.sanitize_for_serialization(created)
        raise BackendError(f"could not recreate pod {name} in namespace {self.namespace}: "
                           "the old pod is still being deleted")


def _event_selector(pod: str) -> str:
    return f"involvedObject.kind=Pod,involvedObject.name={pod}"


def _explain(action: str, status: int | None, reason: str | None, body: Any) -> str:
    message = reason or ""
    try:
        message = json.loads(body).get("message") or message
    except (TypeError, ValueError, AttributeError):
        pass
    hint = {
        401: "the credentials were refused; check the Kubernetes connection",
        403: "the Airflow worker/triggerer's service account lacks this permission; "
             "bind it to the Role in airflow_tf/rbac/role.yaml",
        404: "check that the namespace exists",
        422: "the API server refused the manifest; run `airflow-tf render` with the same options to inspect it",
    }.get(status or 0, "")
    return f"{action}: HTTP {status} {message}" + (f" ({hint})" if hint else "")
