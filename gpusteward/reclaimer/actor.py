"""Carry out reclaim actions against the API server: marks, Events, evictions, Job suspension,
scaling to zero. Returns a result word for metrics; never raises on API refusals.

Each action is first re-checked against the pods as they are now (``core.reclaim.recheck``):
the decision was made on a snapshot, and a pod replaced, terminating or re-marked since (another
replica cleared its marks because it got busy) is left alone.

Results: done, blocked (a PodDisruptionBudget says not now: HTTP 429), gone (deleted meanwhile),
stale (changed since the decision), forbidden (RBAC: the log names the permission), conflict
(changed meanwhile, after retries), error.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpusteward.adapters.stopper import Switches
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim import kinds
from gpusteward.core.reclaim.model import (
    IDLE_SINCE,
    RECLAIM_AT,
    RECLAIM_BLOCKED,
    RECLAIM_REASON,
    RECLAIMED_AT,
    REPLICAS_BEFORE,
    Action,
    ActionKind,
    ActResult,
    How,
)
from gpusteward.core.reclaim.recheck import changed, eviction_grace
from gpusteward.core.times import stamp

log = logging.getLogger("gpusteward.reclaimer")

EVENT_REASON = {ActionKind.MARK: "GPUIdle", ActionKind.WARN: "GPUIdleWarning",
                ActionKind.CLEAR: "GPUActive", ActionKind.RECLAIM: "GPUReclaimed",
                ActionKind.BLOCK: "GPUReclaimBlocked"}
BLOCKED_EVENT_REASON = "GPUReclaimBlocked"
PERMISSION = {How.EVICT: "create pods/eviction", How.SUSPEND: "patch batch/jobs",
              How.SCALE: "patch apps/deployments and apps/statefulsets",
              How.ANNOTATE: "patch pods", How.DEACTIVATE: "patch kueue.x-k8s.io/workloads",
              How.STOP: "patch the owner's kind (notebooks, inferenceservices ...)",
              How.PAUSE: "patch keda.sh/scaledobjects", How.BLOCK: "patch pods"}
EVENT_PERMISSION = "create events"
RETRIES_ON_CONFLICT = 3
T = TypeVar("T")
CALL_TIMEOUT = 30  # seconds per API call: a hung call must not stall the cycle


class Actor:
    def __init__(self, api: client.ApiClient, policy: Policy,
                 clock: Callable[[], float] = time.time):
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.switches = Switches(api, kinds.Catalog.of(policy.reclaim.owner_actions.kinds))
        self.policy = policy
        self.clock = clock
        self.instance = socket.gethostname()

    async def apply(self, action: Action) -> ActResult:
        result = await _guard(action, self._carry_out(action))
        if result == ActResult.DONE:
            await self.event(action, EVENT_REASON[action.kind], action.message,
                             warning=action.kind == ActionKind.BLOCK)
        elif result == ActResult.BLOCKED:
            await self.event(action, BLOCKED_EVENT_REASON,
                             f"eviction refused by a PodDisruptionBudget; retrying next cycle "
                             f"({action.message})", warning=True)
        return result

    async def _carry_out(self, action: Action) -> ActResult:
        own_grace, stale = await self._recheck(action)
        if stale:
            return ActResult.STALE
        if action.kind == ActionKind.RECLAIM:
            await self._reclaim(action, own_grace)
        else:
            stage = {ActionKind.MARK: self._mark, ActionKind.WARN: self._warn,
                     ActionKind.CLEAR: self._clear, ActionKind.BLOCK: self._block}
            await stage[action.kind](action)
        return ActResult.DONE

    async def _recheck(self, action: Action) -> tuple[int | None, bool]:
        """(the pod's own terminationGracePeriodSeconds, whether the action is stale: the cluster
        changed since the decision). The acting pod and, for a workload, every pod the decision
        rests on; the acting pod gone raises the API's 404."""
        own: int | None = None
        for decided in (action.pod, *action.peers):
            try:
                fresh = await self.core.read_namespaced_pod(decided.name, decided.namespace,
                                                            _request_timeout=CALL_TIMEOUT)
            except ApiException as e:
                if e.status != 404:
                    raise
                if decided is action.pod:
                    raise
                fresh = None
            why = (f"pod {decided.key} is gone" if fresh is None else
                   changed(decided, fresh.metadata.uid, fresh.metadata.annotations or {},
                           fresh.metadata.deletion_timestamp is not None))
            if why:
                log.warning("pod=%s %s not carried out, the cluster changed since the decision: "
                            "%s", action.pod.key, action.kind, why)
                return None, True
            if fresh is not None and decided is action.pod:
                own = fresh.spec.termination_grace_period_seconds
        return own, False

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

    async def _block(self, action: Action) -> None:
        await self._annotate(action, {RECLAIM_BLOCKED: action.message.partition(": ")[2]})

    async def _reclaim(self, action: Action, own_grace: int | None) -> None:
        assert action.owner is not None
        await self._annotate(action, {RECLAIM_REASON: f"{action.reason}: {action.message}"})
        owner = action.owner
        if owner.how:  # the owner's own switch (core.reclaim.kinds)
            await self.switches.stop(owner, action.reason, stamp(self.clock()))
        elif action.how == How.EVICT:
            await self._evict(action, own_grace)
        elif action.how == How.SUSPEND:
            await self.batch.patch_namespaced_job(owner.name, owner.namespace, {
                "metadata": {"annotations": {RECLAIM_REASON: action.reason,
                                             RECLAIMED_AT: stamp(self.clock())}},
                "spec": {"suspend": True}}, _request_timeout=CALL_TIMEOUT)
        elif action.how == How.SCALE:
            await self._scale_to_zero(owner.kind, owner.namespace, owner.name, action.reason)
        else:
            raise ValueError(f"no way to reclaim by {action.how!r}")

    async def _evict(self, action: Action, own_grace: int | None) -> None:
        grace = eviction_grace(action.pod, own_grace, self.policy)
        log.info("pod=%s evicting with a %ds grace period (its own: %s)", action.pod.key, grace,
                 "unset" if own_grace is None else f"{own_grace}s")
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=action.pod.name, namespace=action.pod.namespace),
            delete_options=client.V1DeleteOptions(grace_period_seconds=grace))
        await self.core.create_namespaced_pod_eviction(action.pod.name, action.pod.namespace,
                                                       body, _request_timeout=CALL_TIMEOUT)

    async def _scale_to_zero(self, kind: str, namespace: str, name: str, reason: str) -> None:
        """Record the replicas and scale to zero in one patch, guarded by resourceVersion."""
        read, patch = workload_api(self.apps, kind)

        async def attempt() -> None:
            obj = await read(name, namespace, _request_timeout=CALL_TIMEOUT)
            before = obj.spec.replicas or 0
            await patch(name, namespace, {
                "metadata": {"resourceVersion": obj.metadata.resource_version,
                             "annotations": {REPLICAS_BEFORE: str(before),
                                             RECLAIM_REASON: scaled_reason(reason, before),
                                             RECLAIMED_AT: stamp(self.clock())}},
                "spec": {"replicas": 0}}, _request_timeout=CALL_TIMEOUT)

        await retry_on_conflict(attempt)

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
            _log_refusal(action, e, EVENT_PERMISSION)


async def retry_on_conflict(attempt: Callable[[], Awaitable[T]]) -> T:
    """Run a read-check-write step again when its write lost a race (HTTP 409): the
    controllers' own status writes move resourceVersion all the time. Each try reads afresh,
    so every check is made again on what the object is now."""
    for _ in range(RETRIES_ON_CONFLICT - 1):
        try:
            return await attempt()
        except ApiException as e:
            if e.status != 409:
                raise
    return await attempt()


def workload_api(apps: client.AppsV1Api, kind: str) -> tuple[Callable[..., Awaitable[Any]],
                                                            Callable[..., Awaitable[Any]]]:
    """(read, patch) of a scalable kind."""
    if kind == "Deployment":
        return apps.read_namespaced_deployment, apps.patch_namespaced_deployment
    if kind == "StatefulSet":
        return apps.read_namespaced_stateful_set, apps.patch_namespaced_stateful_set
    raise ValueError(f"cannot scale a {kind}")


def scaled_reason(reason: str, replicas: int) -> str:
    """The owner's reclaim-reason annotation: why, and the replica count restore may bring back."""
    return f"{reason}: scaled from {replicas} to 0"


async def _guard(action: Action, work: Awaitable[ActResult]) -> ActResult:
    try:
        return await work
    except ApiException as e:
        return _log_refusal(action, e, PERMISSION[action.how or How.ANNOTATE])


def _log_refusal(action: Action, e: ApiException, permission: str) -> ActResult:
    pod = action.pod.key
    if e.status == 429:
        log.info("pod=%s eviction blocked by a PodDisruptionBudget; retrying next cycle", pod)
        return ActResult.BLOCKED
    if e.status == 404:
        log.info("pod=%s is gone; skipping %s", pod, action.kind)
        return ActResult.GONE
    if e.status == 403:
        log.error("pod=%s %s forbidden: grant the reclaimer's ServiceAccount '%s' (%s)",
                  pod, action.kind, permission, e.reason)
        return ActResult.FORBIDDEN
    if e.status == 409:
        log.warning("pod=%s %s conflicted with a concurrent change; next cycle re-reads it",
                    pod, action.kind)
        return ActResult.CONFLICT
    log.error("pod=%s %s failed: HTTP %s %s", pod, action.kind, e.status, e.reason)
    return ActResult.ERROR
