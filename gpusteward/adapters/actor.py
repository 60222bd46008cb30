"""Carry out reclaim actions against the API server: marks, Events, evictions, Job suspension,
scaling to zero, and restoring. Returns a result word for metrics; never raises on API refusals.

Results: done, blocked (a PodDisruptionBudget says not now: HTTP 429), gone (deleted meanwhile),
forbidden (RBAC: the log names the permission), conflict (changed meanwhile, after retries),
error.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpusteward.core.reclaim.decide import stamp
from gpusteward.core.reclaim.model import (
    IDLE_SINCE,
    RECLAIM_AT,
    RECLAIM_REASON,
    REPLICAS_BEFORE,
    Action,
)

log = logging.getLogger("gpusteward.reclaimer")

EVENT_REASON = {"mark": "GPUIdle", "warn": "GPUIdleWarning", "clear": "GPUActive",
                "reclaim": "GPUReclaimed", "blocked": "GPUReclaimBlocked"}
PERMISSION = {"evict": "create pods/eviction", "suspend": "patch batch/jobs",
              "scale": "patch apps/deployments and apps/statefulsets",
              "annotate": "patch pods", "event": "create events"}
RETRIES_ON_CONFLICT = 3
CALL_TIMEOUT = 30  # seconds per API call: a hung call must not stall the cycle


class Actor:
    def __init__(self, api: client.ApiClient, eviction_grace: float,
                 clock: Callable[[], float] = time.time):
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.grace = max(1, int(eviction_grace))  # never a zero grace period
        self.clock = clock
        self.instance = socket.gethostname()

    async def apply(self, action: Action) -> str:
        handler = {"mark": self._mark, "warn": self._warn, "clear": self._clear,
                   "reclaim": self._reclaim}[action.kind]
        result = await _guard(action, handler(action))
        if result == "done":
            await self.event(action, EVENT_REASON[action.kind], action.message)
        elif result == "blocked":
            await self.event(action, EVENT_REASON["blocked"],
                             f"eviction refused by a PodDisruptionBudget; retrying next cycle "
                             f"({action.message})", warning=True)
        return result

    async def _annotate(self, action: Action, annotations: dict[str, str | None]) -> None:
        await self.core.patch_namespaced_pod(action.pod.name, action.pod.namespace,
                                             {"metadata": {"annotations": annotations}},
                                             _request_timeout=CALL_TIMEOUT)

    async def _mark(self, action: Action) -> None:
        await self._annotate(action, {IDLE_SINCE: stamp(self.clock())})

    async def _warn(self, action: Action) -> None:
        assert action.reclaim_at is not None
        await self._annotate(action, {RECLAIM_AT: stamp(action.reclaim_at)})

    async def _clear(self, action: Action) -> None:
        await self._annotate(action, {IDLE_SINCE: None, RECLAIM_AT: None})

    async def _reclaim(self, action: Action) -> None:
        assert action.owner is not None
        await self._annotate(action, {RECLAIM_REASON: f"{action.reason}: {action.message}"})
        owner = action.owner
        if action.how == "evict":
            await self._evict(action)
        elif action.how == "suspend":
            await self.batch.patch_namespaced_job(owner.name, owner.namespace, {
                "metadata": {"annotations": {RECLAIM_REASON: action.reason}},
                "spec": {"suspend": True}}, _request_timeout=CALL_TIMEOUT)
        elif action.how == "scale":
            await self._scale_to_zero(owner.kind, owner.namespace, owner.name, action.reason)
        else:
            raise ValueError(f"no way to reclaim by {action.how!r}")

    async def _evict(self, action: Action) -> None:
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=action.pod.name, namespace=action.pod.namespace),
            delete_options=client.V1DeleteOptions(grace_period_seconds=self.grace))
        await self.core.create_namespaced_pod_eviction(action.pod.name, action.pod.namespace,
                                                       body, _request_timeout=CALL_TIMEOUT)

    async def _scale_to_zero(self, kind: str, namespace: str, name: str, reason: str) -> None:
        """Record the replicas and scale to zero in one patch, guarded by resourceVersion."""
        read, patch = self._workload_api(kind)
        for attempt in range(RETRIES_ON_CONFLICT):
            obj = await read(name, namespace, _request_timeout=CALL_TIMEOUT)
            before = obj.spec.replicas or 0
            body = {"metadata": {"resourceVersion": obj.metadata.resource_version,
                                 "annotations": {REPLICAS_BEFORE: str(before),
                                                 RECLAIM_REASON: reason}},
                    "spec": {"replicas": 0}}
            try:
                await patch(name, namespace, body, _request_timeout=CALL_TIMEOUT)
                return
            except ApiException as e:
                if e.status != 409 or attempt == RETRIES_ON_CONFLICT - 1:
                    raise

    async def restore(self, namespace: str, kind: str, name: str) -> str:
        """Undo a scale-down or suspension; returns what was done."""
        if kind == "Job":
            await self.batch.patch_namespaced_job(name, namespace, {
                "metadata": {"annotations": {RECLAIM_REASON: None}}, "spec": {"suspend": False}},
                _request_timeout=CALL_TIMEOUT)
            return f"Job {namespace}/{name} resumed"
        read, patch = self._workload_api(kind)
        obj = await read(name, namespace, _request_timeout=CALL_TIMEOUT)
        before = (obj.metadata.annotations or {}).get(REPLICAS_BEFORE)
        if before is None:
            raise LookupError(f"{kind} {namespace}/{name} has no {REPLICAS_BEFORE} annotation")
        await patch(name, namespace, {
            "metadata": {"resourceVersion": obj.metadata.resource_version,
                         "annotations": {REPLICAS_BEFORE: None, RECLAIM_REASON: None}},
            "spec": {"replicas": int(before)}}, _request_timeout=CALL_TIMEOUT)
        return f"{kind} {namespace}/{name} scaled back to {before}"

    def _workload_api(self, kind: str) -> tuple[Callable[..., Awaitable[Any]],
                                                Callable[..., Awaitable[Any]]]:
        if kind == "Deployment":
            return self.apps.read_namespaced_deployment, self.apps.patch_namespaced_deployment
        if kind == "StatefulSet":
            return (self.apps.read_namespaced_stateful_set,
                    self.apps.patch_namespaced_stateful_set)
        raise ValueError(f"cannot scale a {kind}")

    async def event(self, action: Action, reason: str, message: str,
                    warning: bool = False) -> None:
        now = datetime.fromtimestamp(self.clock(), UTC)
        pod = action.pod
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{pod.name}.", namespace=pod.namespace),
            involved_object=client.V1ObjectReference(kind="Pod", name=pod.name,
                                                     namespace=pod.namespace, uid=pod.uid,
                                                     api_version="v1"),
            reason=reason, message=message[:1000], type="Warning" if warning else "Normal",
            source=client.V1EventSource(component="gpusteward-reclaimer"),
            reporting_component="gpusteward-reclaimer", reporting_instance=self.instance,
            first_timestamp=now, last_timestamp=now, count=1)
        try:
            await self.core.create_namespaced_event(pod.namespace, body,
                                                    _request_timeout=CALL_TIMEOUT)
        except ApiException as e:
            _log_refusal(action, e, "event")


async def _guard(action: Action, work: Awaitable[None]) -> str:
    try:
        await work
        return "done"
    except ApiException as e:
        return _log_refusal(action, e, action.how or "annotate")


def _log_refusal(action: Action, e: ApiException, what: str) -> str:
    pod = action.pod.key
    if e.status == 429:
        log.info("pod=%s eviction blocked by a PodDisruptionBudget; retrying next cycle", pod)
        return "blocked"
    if e.status == 404:
        log.info("pod=%s is gone; skipping %s", pod, action.kind)
        return "gone"
    if e.status == 403:
        log.error("pod=%s %s forbidden: grant the reclaimer's ServiceAccount '%s' (%s)",
                  pod, action.kind, PERMISSION.get(what, what), e.reason)
        return "forbidden"
    if e.status == 409:
        log.warning("pod=%s %s conflicted with a concurrent change; next cycle re-reads it",
                    pod, action.kind)
        return "conflict"
    log.error("pod=%s %s failed: HTTP %s %s", pod, action.kind, e.status, e.reason)
    return "error"
