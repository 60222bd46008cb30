"""Carry out reclaim actions against the API server: marks, Events, evictions, Job suspension,
scaling to zero. Returns a result word for metrics; never raises on API refusals.

Each action is first re-checked against the pods as they are now (``core.reclaim.recheck``):
the decision was made on a snapshot, and a pod replaced, terminating or re-marked since (another
replica cleared its marks because it got busy) is left alone.

Then every write is fenced by the API server itself, with the object's resourceVersion as the
fencing token: each write derives from the read it was decided on, or from this replica's own
write just before it, and says so to the server.
- A pod's annotation patch carries ``metadata.resourceVersion`` of the re-read (or of the mark
  this action wrote a moment before), so marks, warnings and clears chain: a decision taken
  before any of them cannot land after them.
- The eviction carries ``deleteOptions.preconditions`` {uid, resourceVersion} of the pod as this
  action's own reclaim-reason patch left it.
- An owner's stop (Job ``suspend``, scale to zero, an owner's switch in adapters.stopper)
  carries the resourceVersion of the owner read just before it.
A change by anyone in between (a new leader clearing the marks of a pod that got busy) makes
the write fail with 409 Conflict. That is never retried here: the action is ``fenced``, and the
next cycle decides again from what it reads then. On top, every write request passes the
Lease's local deadline (adapters.lease ``may_write``); one refused there raises LeaseLost to
the loop, which stops the cycle's writes.

Results: done, blocked (a PodDisruptionBudget says not now: HTTP 429), gone (deleted
meanwhile), stale (changed since the decision), fenced (the server refused a write on its
resourceVersion: HTTP 409), forbidden (RBAC: the log names the permission), error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from kubernetes_asyncio import client

from gpusteward.adapters.errors import (
    KubeConflict,
    KubeForbidden,
    KubeNotFound,
    KubeRefused,
    KubeTooManyRequests,
    KubeUnprocessable,
    LeaseLost,
)
from gpusteward.adapters.events import EventWriter
from gpusteward.adapters.kube import CALL_TIMEOUT, kube_errors
from gpusteward.adapters.stopper import Stale, Switches
from gpusteward.core import selectors
from gpusteward.core.model import RESERVED, Pod
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim import kinds, reserve
from gpusteward.core.reclaim.model import (
    COOLDOWN_UNTIL,
    FAULTY_GPU,
    IDLE_SINCE,
    QUEUE_BLOCKED,
    RECLAIM_AT,
    RECLAIM_BLOCKED,
    RECLAIM_REASON,
    RECLAIMED_AT,
    REPLICAS_BEFORE,
    Action,
    ActionKind,
    ActResult,
    How,
    Owner,
    Reason,
    noted_fault,
)
from gpusteward.core.reclaim.recheck import changed, eviction_grace
from gpusteward.core.times import stamp

log = logging.getLogger("gpusteward.reclaimer")

EVENT_REASON = {ActionKind.MARK: "GPUIdle", ActionKind.WARN: "GPUIdleWarning",
                ActionKind.CLEAR: "GPUActive", ActionKind.RECLAIM: "GPUReclaimed",
                ActionKind.BLOCK: "GPUReclaimBlocked", ActionKind.FENCE: "GPUReclaimOwnerFenced",
                ActionKind.FAULT: "GPUFaulty", ActionKind.RESERVE: "GPUReserved",
                ActionKind.RELEASE: "GPUReservationReleased",
                ActionKind.UNDEMOTE: "GPUWorkloadUndemoted", ActionKind.COOL: "GPUReclaimCooldown",
                ActionKind.UNBLOCK: "GPUQueueNoteCleared"}
WARNINGS = frozenset({ActionKind.BLOCK, ActionKind.FAULT})
BLOCKED_EVENT_REASON = "GPUReclaimBlocked"
FENCED_EVENT_REASON = "GPUReclaimFenced"
PERMISSION = {How.EVICT: "create pods/eviction (a gang: list policy/poddisruptionbudgets)",
              How.SUSPEND: "patch batch/jobs",
              How.SCALE: "patch apps/deployments and apps/statefulsets",
              How.ANNOTATE: "patch pods", How.DEACTIVATE: "patch kueue.x-k8s.io/workloads",
              How.DEMOTE: "patch kueue.x-k8s.io/workloads",
              How.STOP: "patch the owner's kind (notebooks, inferenceservices ...)",
              How.PAUSE: "patch keda.sh/scaledobjects", How.BLOCK: "patch pods"}
NOMINATE = "patch pods and pods/status"
EVENT_PERMISSION = "create events"
RETRIES_ON_CONFLICT = 3
T = TypeVar("T")


class Fresh(NamedTuple):
    """The acting pod as the re-check read it: what its writes are fenced on."""

    version: str  # its resourceVersion
    grace: int | None  # its own terminationGracePeriodSeconds


class Actor:
    def __init__(self, api: client.ApiClient, policy: Policy,
                 clock: Callable[[], float] = time.time):
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.disruption = client.PolicyV1Api(api)
        self.serializer = api
        self.switches = Switches(api, kinds.Catalog.of(policy.reclaim.owner_actions.kinds))
        self.policy = policy
        self.clock = clock
        self.events = EventWriter(api)

    async def apply(self, action: Action) -> ActResult:
        """The action's result. LeaseLost (this replica may no longer write) propagates."""
        try:
            with kube_errors():
                result = await self._carry_out(action)
        except KubeRefused as e:
            result = _log_refusal(action, e, NOMINATE if action.kind in (
                ActionKind.RESERVE, ActionKind.RELEASE) else PERMISSION[action.how or How.ANNOTATE])
        if result == ActResult.DONE:
            await self.event(action, EVENT_REASON[action.kind], action.message,
                             warning=action.kind in WARNINGS)
        elif result == ActResult.BLOCKED:
            await self.event(action, BLOCKED_EVENT_REASON,
                             f"eviction refused by a PodDisruptionBudget; retrying next cycle "
                             f"({action.message})", warning=True)
        elif result == ActResult.FENCED:
            await self.event(action, FENCED_EVENT_REASON,
                             f"{action.kind} not carried out: the API server refused it because "
                             f"the object changed since gpusteward read it (HTTP 409); the next "
                             f"cycle decides again ({action.message})", warning=True)
        return result

    async def _carry_out(self, action: Action) -> ActResult:
        if action.kind == ActionKind.FENCE:  # whatever the pod is now: the owner must move
            assert action.owner is not None
            await self.switches.touch(action.owner, stamp(self.clock()))
            return ActResult.DONE
        read = await self._recheck(action)
        if read is None:
            return ActResult.STALE
        fresh = read[action.pod.uid]
        try:
            if action.kind == ActionKind.RECLAIM and action.how == How.EVICT and action.peers:
                return await self._evict_gang(action, read)
            if action.kind == ActionKind.RECLAIM:
                await self._reclaim(action, fresh)
            else:
                stage = {ActionKind.MARK: self._mark, ActionKind.WARN: self._warn,
                         ActionKind.CLEAR: self._clear, ActionKind.BLOCK: self._block,
                         ActionKind.FAULT: self._fault, ActionKind.RESERVE: self._reserve,
                         ActionKind.RELEASE: self._release, ActionKind.UNDEMOTE: self._undemote,
                         ActionKind.COOL: self._cool, ActionKind.UNBLOCK: self._unblock}
                await stage[action.kind](action, fresh.version)
        except Stale as e:
            log.warning("pod=%s %s not carried out, the cluster changed since the decision: "
                        "%s", action.pod.key, action.kind, e)
            return ActResult.STALE
        return ActResult.DONE

    async def _recheck(self, action: Action) -> dict[str, Fresh] | None:
        """The acting pod and, for a workload, every pod the decision rests on, as they are now
        (by uid; a peer gone has none); None when the action is stale (the cluster changed
        since the decision). The acting pod gone raises the API's 404."""
        read: dict[str, Fresh] = {}
        for decided in (action.pod, *action.peers):
            try:
                with kube_errors():
                    fresh = await self.core.read_namespaced_pod(
                        decided.name, decided.namespace, _request_timeout=CALL_TIMEOUT)
            except KubeNotFound:
                if decided is action.pod:
                    raise
                fresh = None
            why = (f"pod {decided.key} is gone" if fresh is None else
                   changed(decided, fresh.metadata.uid, fresh.metadata.annotations or {},
                           fresh.metadata.deletion_timestamp is not None))
            if why:
                log.warning("pod=%s %s not carried out, the cluster changed since the decision: "
                            "%s", action.pod.key, action.kind, why)
                return None
            if fresh is not None:
                read[decided.uid] = Fresh(fresh.metadata.resource_version,
                                          fresh.spec.termination_grace_period_seconds)
        return read

    async def _annotate(self, action: Action, annotations: dict[str, str | None],
                        version: str, pod: Pod | None = None) -> str:
        """Patch the annotations of the acting pod (or of ``pod``) on the resourceVersion
        given; the one it has after."""
        target = pod or action.pod
        written_pod = await self.core.patch_namespaced_pod(
            target.name, target.namespace,
            {"metadata": {"resourceVersion": version, "annotations": annotations}},
            _request_timeout=CALL_TIMEOUT)
        written: str = written_pod.metadata.resource_version
        return written

    async def _mark(self, action: Action, version: str) -> None:
        await self._annotate(action, {IDLE_SINCE: stamp(self.clock())}, version)

    async def _warn(self, action: Action, version: str) -> None:
        assert action.reclaim_at is not None
        await self._annotate(action, {RECLAIM_AT: stamp(action.reclaim_at)}, version)

    async def _clear(self, action: Action, version: str) -> None:
        await self._annotate(action, {IDLE_SINCE: None, RECLAIM_AT: None, FAULTY_GPU: None},
                             version)

    async def _cool(self, action: Action, version: str) -> None:
        until = None if action.until is None else stamp(action.until)
        await self._annotate(action, {COOLDOWN_UNTIL: until}, version)

    async def _fault(self, action: Action, version: str) -> None:
        await self._annotate(action, {IDLE_SINCE: None, RECLAIM_AT: None,
                                      FAULTY_GPU: noted_fault(action)}, version)

    async def _reserve(self, action: Action, version: str) -> None:
        """The reservation on the pending pod, then its nomination (core/reclaim/reserve.py).
        Neither is fenced on the pod's resourceVersion: the scheduler rewrites a waiting pod's
        status (its conditions) as soon as the victims go, and both are gpusteward's own
        fields, meant whatever else changed; a pod bound meanwhile is released next cycle."""
        del version
        # a waiting gang's note why nothing was freed goes once something is
        await self._note(action, {RESERVED: reserve.entry(action), QUEUE_BLOCKED: None})
        try:
            with kube_errors():
                await self.core.patch_namespaced_pod_status(
                    action.pod.name, action.pod.namespace,
                    {"status": {"nominatedNodeName": action.node}},
                    _request_timeout=CALL_TIMEOUT)
        except KubeUnprocessable:  # bound meanwhile: a bound pod takes no nomination
            log.info("pod=%s not nominated: bound meanwhile", action.pod.key)

    async def _note(self, action: Action, annotations: dict[str, str | None]) -> None:
        """gpusteward's own annotations on a waiting pod, not fenced (see _reserve)."""
        await self.core.patch_namespaced_pod(
            action.pod.name, action.pod.namespace, {"metadata": {"annotations": annotations}},
            _request_timeout=CALL_TIMEOUT)

    async def _release(self, action: Action, version: str) -> None:
        """Not fenced on the pod's resourceVersion either (see _reserve): a release refused
        for a status the scheduler wrote would leave the pod nominated, and the queue leaves a
        nominated pod alone."""
        del version
        await self._note(action, {RESERVED: None})
        if not action.node:
            return
        # Still nominated where the reservation put it: that goes too, fenced on that one field
        # (a JSON patch test), so that a nomination the scheduler made meanwhile stays.
        try:
            with kube_errors():
                await self.core.patch_namespaced_pod_status(
                    action.pod.name, action.pod.namespace,
                    [{"op": "test", "path": "/status/nominatedNodeName", "value": action.node},
                     {"op": "remove", "path": "/status/nominatedNodeName"}],
                    _request_timeout=CALL_TIMEOUT)
        except KubeUnprocessable:  # the test failed: not ours any more
            log.info("pod=%s nomination left as it is: no longer %s", action.pod.key,
                     action.node)

    async def _undemote(self, action: Action, version: str) -> None:
        del version  # the Workload's own read fences it; the pod is not written
        assert action.owner is not None
        await self.switches.undemote(action.owner)

    async def _block(self, action: Action, version: str) -> None:
        why = action.message.partition(": ")[2]
        if action.reason == Reason.QUEUE:  # on a waiting pod
            await self._note(action, {QUEUE_BLOCKED: why})
            return
        await self._annotate(action, {RECLAIM_BLOCKED: why}, version)

    async def _unblock(self, action: Action, version: str) -> None:
        del version  # gpusteward's own note on a waiting pod: not fenced (see _reserve)
        await self._note(action, {QUEUE_BLOCKED: None})

    async def _reclaim(self, action: Action, fresh: Fresh) -> None:
        """The reason first, on the pod as re-read; then the stop, fenced on the pod as that
        patch left it (eviction) or on the owner as read just before (the owner's stops)."""
        assert action.owner is not None
        owner, at = action.owner, stamp(self.clock())
        if action.how == How.DEMOTE:  # the pods run on: the Workload alone says why
            await self.switches.demote(owner, self.policy.reclaim.kueue.priority_boost,
                                       action.reason, at)
            return
        version = await self._annotate(
            action, {RECLAIM_REASON: f"{action.reason}: {action.message}"}, fresh.version)
        if owner.how:  # the owner's own switch (core.reclaim.kinds)
            await self.switches.stop(owner, action.reason, at)
        elif action.how == How.EVICT:
            await self._evict(action, fresh.grace, version)
        elif action.how == How.SUSPEND:
            await self._suspend(owner, action.reason, at)
        elif action.how == How.SCALE:
            await self._scale_to_zero(owner, action.reason, at)
        else:
            raise ValueError(f"no way to reclaim by {action.how!r}")

    async def _evict(self, action: Action, own_grace: int | None, version: str,
                     pod: Pod | None = None) -> None:
        """Evict the acting pod (or ``pod``), fenced on its uid and the resourceVersion given."""
        target = pod or action.pod
        grace = eviction_grace(target, own_grace, self.policy)
        log.info("pod=%s evicting with a %ds grace period (its own: %s)", target.key, grace,
                 "unset" if own_grace is None else f"{own_grace}s")
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=target.name, namespace=target.namespace),
            delete_options=client.V1DeleteOptions(
                grace_period_seconds=grace,
                preconditions=client.V1Preconditions(uid=target.uid, resource_version=version)))
        await self.core.create_namespaced_pod_eviction(target.name, target.namespace,
                                                       body, _request_timeout=CALL_TIMEOUT)

    async def _evict_gang(self, action: Action, read: dict[str, Fresh]) -> ActResult:
        """A gang's eviction, all of it or none (core/reclaim/gangs.py), on every pod as re-read
        (a peer gone made it stale: the next cycle decides on what is left). First every
        PodDisruptionBudget over its pods must allow them all to go: the Eviction API asks each
        pod's alone, and a refusal half way would leave the gang broken. Then the reason on
        every pod, each fenced on its re-read, so that a change to any stops all before one
        eviction; then the evictions, each fenced on the version its reason patch left."""
        members = (action.pod, *action.peers)
        refusing = await self._refusing_budget(members)
        if refusing:
            log.info("pod=%s gang eviction not carried out: %s; retrying next cycle",
                     action.pod.key, refusing)
            return ActResult.BLOCKED
        reason: dict[str, str | None] = {RECLAIM_REASON: f"{action.reason}: {action.message}"}
        versions = [await self._annotate(action, reason, read[p.uid].version, p)
                    for p in members]
        for p, version in zip(members, versions, strict=True):
            await self._evict(action, read[p.uid].grace, version, p)
        return ActResult.DONE

    async def _refusing_budget(self, members: Sequence[Pod]) -> str:
        """The first PodDisruptionBudget of the pods' namespace that would refuse evicting all
        of them (its disruptionsAllowed below the number it selects); "" when none would."""
        budgets = await self.disruption.list_namespaced_pod_disruption_budget(
            members[0].namespace, _request_timeout=CALL_TIMEOUT)
        for pdb in budgets.items:
            selector = self.serializer.sanitize_for_serialization(pdb.spec.selector)
            covered = sum(1 for p in members if selectors.matches(selector, p.labels))
            allowed = (pdb.status.disruptions_allowed or 0) if pdb.status else 0
            if covered > allowed:
                return (f"PodDisruptionBudget {pdb.metadata.name} allows {allowed} "
                        f"disruption(s), the gang would take {covered}")
        return ""

    async def _suspend(self, owner: Owner, reason: str, at: str) -> None:
        """Suspend the Job as read just now; one already suspended was suspended by someone
        else (a queue controller) since the decision, and is not gpusteward's to record."""
        job = await self.batch.read_namespaced_job(owner.name, owner.namespace,
                                                   _request_timeout=CALL_TIMEOUT)
        if job.spec.suspend:
            raise Stale(f"Job {owner.namespace}/{owner.name} is already suspended")
        await self.batch.patch_namespaced_job(owner.name, owner.namespace, {
            "metadata": {"resourceVersion": job.metadata.resource_version,
                         "annotations": {RECLAIM_REASON: reason, RECLAIMED_AT: at}},
            "spec": {"suspend": True}}, _request_timeout=CALL_TIMEOUT)

    async def _scale_to_zero(self, owner: Owner, reason: str, at: str) -> None:
        """Record the replicas and scale to zero in one patch, fenced on the read."""
        read, patch = workload_api(self.apps, owner.kind)
        obj = await read(owner.name, owner.namespace, _request_timeout=CALL_TIMEOUT)
        before = obj.spec.replicas or 0
        if before == 0:
            raise Stale(f"{owner.kind} {owner.namespace}/{owner.name} is already at 0 replicas")
        await patch(owner.name, owner.namespace, {
            "metadata": {"resourceVersion": obj.metadata.resource_version,
                         "annotations": {REPLICAS_BEFORE: str(before),
                                         RECLAIM_REASON: scaled_reason(reason, before),
                                         RECLAIMED_AT: at}},
            "spec": {"replicas": 0}}, _request_timeout=CALL_TIMEOUT)

    async def event(self, action: Action, reason: str, message: str,
                    warning: bool = False) -> None:
        pod = action.pod
        involved = {"kind": "Pod", "namespace": pod.namespace, "name": pod.name,
                    "apiVersion": "v1", "uid": pod.uid}
        try:
            with kube_errors():
                await self.events.write(involved, reason, message, warning, self.clock())
        except KubeRefused as e:
            _log_refusal(action, e, EVENT_PERMISSION)
        except LeaseLost as e:
            log.warning("pod=%s Event %s not written, this replica may no longer write: %s",
                        pod.key, reason, e)


async def retry_on_conflict(attempt: Callable[[], Awaitable[T]]) -> T:
    """Run a read-check-write step again when its write lost a race (HTTP 409): the
    controllers' own status writes move resourceVersion all the time. Each try reads afresh,
    so every check is made again on what the object is now."""
    for _ in range(RETRIES_ON_CONFLICT - 1):
        try:
            with kube_errors():
                return await attempt()
        except KubeConflict:
            pass
    with kube_errors():
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


def _log_refusal(action: Action, e: KubeRefused, permission: str) -> ActResult:
    pod = action.pod.key
    if isinstance(e, KubeTooManyRequests):
        log.info("pod=%s eviction blocked by a PodDisruptionBudget; retrying next cycle", pod)
        return ActResult.BLOCKED
    if isinstance(e, KubeNotFound):
        log.info("pod=%s is gone; skipping %s", pod, action.kind)
        return ActResult.GONE
    if isinstance(e, KubeForbidden):
        log.error("pod=%s %s forbidden: grant the reclaimer's ServiceAccount '%s' (%s)",
                  pod, action.kind, permission, e.reason)
        return ActResult.FORBIDDEN
    if isinstance(e, KubeConflict):
        log.warning("pod=%s %s fenced: the API server refused the write, the object changed "
                    "since it was read (HTTP 409 %s); the next cycle reads it again", pod,
                    action.kind, e.reason)
        return ActResult.FENCED
    log.error("pod=%s %s failed: HTTP %s %s", pod, action.kind, e.status, e.reason)
    return ActResult.ERROR
