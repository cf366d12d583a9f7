"""The Kubernetes backend's ``watch()``: a group's status now and whenever it changes, from pod
events read through the provider's ``AsyncKubernetesHook`` (with a resource version; a fresh list
only when the watch breaks). The pods it sees stuck on a lost node it releases as the status read
does (:func:`.nodes.force_deletion`)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from typing import Any, Protocol

from airflow_tf.cluster import GroupStatus
from airflow_tf.cluster.progress import parse_progress

from ..base import BackendError, GroupRef
from .calls import event_selector as _event_selector
from .calls import explain as _explain
from .calls import progress_pod as _progress_pod
from .calls import role_of as _role
from .calls import tasks as _tasks
from .jobset import is_jobset, read_view
from .manifests import group_selector
from .nodes import FORCE_DELETE_MISSES, JobPatch, cut_nodes, disruption, force_deletion, job_patches, lost_pods
from .one_off import PROGRESS_TAIL_LINES, is_one_off
from .one_off import name_of as _name
from .one_off import now as _now
from .status import assess, next_wakeup, overdue_unschedulable, scheduler_message

log = logging.getLogger(__name__)


class Watching(Protocol):
    """What the watch needs of the backend (:class:`~.backend.KubernetesBackend`): its intervals,
    a group's namespace and an async hook on its connection."""

    progress_interval: float
    poll_interval: float

    def _ns(self, ref: GroupRef) -> str: ...

    async def _async_hook(self) -> Any: ...


async def watch_group(backend: Watching, ref: GroupRef, timeout: float | None = None) -> AsyncIterator[GroupStatus]:
    """Yield the status now and whenever it changes, following pod events.

    One watch request stays open for at most ``progress_interval`` seconds (or until
    the next timeout of a pending pod); when it ends, progress is re-read from the
    chief's log. Only if the watch fails does this fall back to listing pods every
    ``poll_interval`` seconds."""
    import aiohttp
    from kubernetes_asyncio import client as async_client
    from kubernetes_asyncio import watch as async_watch

    loop = asyncio.get_running_loop()
    end = None if timeout is None else loop.time() + timeout
    namespace, selector = backend._ns(ref), group_selector(ref.name)
    hook = await backend._async_hook()
    async with hook.get_conn() as api:
        group = _WatchedGroup(backend, ref, async_client.CoreV1Api(api), api, namespace=namespace, selector=selector)
        await _relist_after_error(backend, group, loop, end)
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
            wait = min(x for x in (backend.progress_interval, remaining, group.seconds_to_wakeup()) if x is not None)
            if not watch_allowed or wait < 1:
                # No watch allowed, or less than the API's one-second watch timeout left.
                await asyncio.sleep(min(backend.poll_interval, wait))
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
                                backend.poll_interval)
                else:
                    await _pause_after_error(backend, e, loop, end)
                await _relist_after_error(backend, group, loop, end)
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                await _pause_after_error(backend, e, loop, end)
                await _relist_after_error(backend, group, loop, end)

async def _pause_after_error(backend: Watching, error: BaseException, loop: asyncio.AbstractEventLoop, end: float | None) -> None:
    pause = backend.poll_interval if end is None else max(0.0, min(backend.poll_interval, end - loop.time()))
    log.warning("watching pods failed (%s); listing them again in %.0fs", error, pause)
    await asyncio.sleep(pause)

async def _relist_after_error(backend: Watching, group: _WatchedGroup, loop: asyncio.AbstractEventLoop,
                              end: float | None) -> None:
    """List the pods (again); while the API server is unavailable, keep trying every
    ``poll_interval``: a trigger outlives an API server restart."""
    import aiohttp
    from kubernetes_asyncio.client.exceptions import ApiException

    while True:
        try:
            await group.relist()
            return
        except (TimeoutError, ApiException, aiohttp.ClientError, OSError) as e:
            if isinstance(e, ApiException) and e.status in (401, 403, 404):
                raise BackendError(_explain(f"list the pods of group {group.ref.name}", e.status, e.reason,
                                            e.body)) from e
            if end is not None and loop.time() >= end:
                return
            await _pause_after_error(backend, e, loop, end)


class _WatchedGroup:
    """The pods of one group as last seen by ``watch()``, and their status. The Jobs are
    re-read whenever a pod changed: their conditions (failed, complete) come with pod events."""

    def __init__(self, backend: Watching, ref: GroupRef, core: Any, api: Any, *, namespace: str,
                 selector: str):
        from kubernetes_asyncio import client as async_client

        self.backend, self.ref, self.core, self.api = backend, ref, core, api
        self.batch = async_client.BatchV1Api(api)
        self.namespace, self.selector = namespace, selector
        self.pods: dict[str, dict] = {}
        self.moved: dict[str, dict] = {}
        """Pods Kubernetes disrupted (node lost, drain) and then removed, as last seen: once its Job
        replaced it the pod is gone from the API, and the status still says where the task moved."""
        self.cut: frozenset[str] = frozenset()
        """The nodes the group was cut off on, as its Jobs said at the last status (:func:`.nodes.cut_nodes`)."""
        self.resource_version: str | None = None
        self.progress: dict[str, Any] | None = None
        self._progress_read_at: float | None = None

    async def relist(self) -> None:
        result = await self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        self.pods = {_name(p): p for p in _tasks(self.api.sanitize_for_serialization(i) for i in result.items)}
        self.resource_version = result.metadata.resource_version

    def apply(self, kind: str, pod: dict) -> bool:
        """Update the cache from one watch event; True when a pod changed."""
        self.resource_version = pod.get("metadata", {}).get("resourceVersion", self.resource_version)
        if kind == "BOOKMARK" or is_one_off(pod):
            return False
        name = _name(pod)
        if kind == "DELETED":
            if disruption(pod) is not None:
                self.moved[name] = pod
            return self.pods.pop(name, None) is not None
        self.pods[name] = pod
        return True

    def seconds_to_wakeup(self) -> float | None:
        now = _now()
        moment = next_wakeup(list(self.pods.values()), now, self.cut)
        return None if moment is None else max(0.0, (moment - now).total_seconds()) + 0.5

    async def _read_progress(self) -> None:
        loop = asyncio.get_running_loop()
        if self._progress_read_at is not None and loop.time() - self._progress_read_at < self.backend.progress_interval:
            return
        lead = _progress_pod(list(self.pods.values()))
        if lead is None:
            return
        self._progress_read_at = loop.time()
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            response = await self.core.read_namespaced_pod_log(
                _name(lead), self.namespace, container=_role(lead), tail_lines=PROGRESS_TAIL_LINES,
                _preload_content=False)
            async with response:
                text = await response.text(errors="replace")
        except ApiException:
            return
        self.progress = parse_progress(text) or self.progress

    async def _force_delete(self, pod: dict) -> None:
        """As :meth:`KubernetesBackend._force_delete`, through the async client."""
        from kubernetes_asyncio.client.exceptions import ApiException

        release = force_deletion(pod, self.namespace)
        action = release.marking
        try:
            await self.core.patch_namespaced_pod_status(release.pod, self.namespace, release.status_patch)
            action = release.deleting
            await self.core.delete_namespaced_pod(release.pod, self.namespace, body=release.delete_options)
        except ApiException as e:
            if e.status in FORCE_DELETE_MISSES:
                return  # gone, or replaced, meanwhile
            raise BackendError(_explain(action, e.status, e.reason, e.body)) from e
        release.done(log)

    async def _patch_job(self, patch: JobPatch) -> None:
        """As :meth:`KubernetesBackend._patch_job`, through the async client."""
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            await self.batch.patch_namespaced_job(patch.job, patch.namespace, patch.patch)
        except ApiException as e:
            raise BackendError(_explain(patch.doing, e.status, e.reason, e.body)) from e
        log.warning("%s", patch.done)

    async def status(self) -> GroupStatus:
        now = _now()
        listed = await self.batch.list_namespaced_job(self.namespace, label_selector=self.selector)
        jobs = _tasks(self.api.sanitize_for_serialization(i) for i in listed.items)
        pods = list(self.pods.values())
        self.cut = cut_nodes(jobs)
        for lost in lost_pods(pods, now):
            await self._force_delete(lost)
        for patch in job_patches(jobs, pods, self.namespace, now):
            await self._patch_job(patch)
        pods += [pod for name, pod in self.moved.items() if name not in self.pods]
        messages = {}
        for pod in overdue_unschedulable(pods, now):
            events = await self.core.list_namespaced_event(self.namespace, field_selector=_event_selector(pod))
            messages[pod] = scheduler_message([self.api.sanitize_for_serialization(e) for e in events.items])
        await self._read_progress()
        jobset = await read_view(self.api, self.namespace, self.ref.name) if is_jobset(self.ref) else {}
        return assess(self.ref.name, jobs, pods, now, scheduler_messages=messages, progress=self.progress, **jobset)
