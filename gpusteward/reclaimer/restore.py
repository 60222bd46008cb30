"""`gpusteward reclaimer restore`: undo a scale-down or a Job suspension that gpusteward made,
and nothing else.

The annotations are editable by anyone who can edit the object, so none is trusted blindly: the
object must carry gpusteward's reclaim-reason annotation and still be at zero replicas (or
suspended); the replica count must be a plain ASCII integer no larger than the count recorded
with the reclaim (in the reason: "idle: scaled from 2 to 0"). Otherwise ``RestoreRefused``.
Every patch carries the resourceVersion read, so a concurrent change makes it fail (409);
the whole read-check-write then runs again, a few times, on what the object is now.
"""

from __future__ import annotations

import re
from typing import Any

from kubernetes_asyncio import client

from gpusteward.adapters.stopper import Switches, object_path
from gpusteward.core.reclaim import kinds
from gpusteward.core.reclaim.model import RECLAIM_REASON, REPLICAS_BEFORE
from gpusteward.core.reclaim.selfservice import plain_count
from gpusteward.core.times import stamp
from gpusteward.reclaimer.actor import CALL_TIMEOUT, retry_on_conflict, workload_api

_RECORDED = re.compile(r"scaled from ([0-9]{1,9}) to 0")


class RestoreRefused(ValueError):
    """The object is not one gpusteward stopped, or its record is not believable."""



class Restorer:
    def __init__(self, api: client.ApiClient, now: float = 0.0,
                 catalog: kinds.Catalog = kinds.DEFAULT) -> None:
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.catalog = catalog
        self.switches = Switches(api, catalog)
        self.now = now  # the refreshed last activity of a Notebook

    async def restore(self, namespace: str, kind: str, name: str) -> str:
        """Returns what was done; raises RestoreRefused when nothing may be done. A write that
        lost a race with a controller's own update (409) is tried again from a fresh read."""
        return await retry_on_conflict(lambda: self._restore(namespace, kind, name))

    async def _restore(self, namespace: str, kind: str, name: str) -> str:
        what = f"{kind} {namespace}/{name}"
        if kind == "Job":
            return await self._resume(namespace, name, what)
        if kind not in ("Deployment", "StatefulSet"):
            return await self._switch_back(namespace, kind, name)
        read, patch = workload_api(self.apps, kind)
        obj = await read(name, namespace, _request_timeout=CALL_TIMEOUT)
        ann = obj.metadata.annotations or {}
        reason = _reason(ann, what)
        if obj.spec.replicas != 0:
            raise RestoreRefused(f"{what} runs {obj.spec.replicas} replicas, not 0: not "
                                 f"restored (someone scaled it since gpusteward did)")
        before = _believable(ann, reason, what)
        await patch(name, namespace, {
            "metadata": {"resourceVersion": obj.metadata.resource_version,
                         "annotations": dict.fromkeys((REPLICAS_BEFORE, *kinds.RECORD))},
            "spec": {"replicas": before}}, _request_timeout=CALL_TIMEOUT)
        return f"{what} scaled back to {before}"

    async def _resume(self, namespace: str, name: str, what: str) -> str:
        job = await self.batch.read_namespaced_job(name, namespace, _request_timeout=CALL_TIMEOUT)
        _reason(job.metadata.annotations or {}, what)
        if not job.spec.suspend:
            raise RestoreRefused(f"{what} is not suspended: nothing to resume")
        await self.batch.patch_namespaced_job(name, namespace, {
            "metadata": {"resourceVersion": job.metadata.resource_version,
                         "annotations": dict.fromkeys(kinds.RECORD)},
            "spec": {"suspend": False}}, _request_timeout=CALL_TIMEOUT)
        return f"{what} resumed"


    async def _switch_back(self, namespace: str, kind_name: str, name: str) -> str:
        """An owner stopped through its own switch (core.reclaim.kinds), a KEDA ScaledObject
        paused at zero, or a Kueue Workload: the switch back, only where gpusteward set it."""
        if kind_name in ("ScaledObject", "ScaledObject.keda.sh"):
            k = kinds.Kind("keda.sh", "ScaledObject", "scaledobjects", kinds.PAUSE,
                           annotation=kinds.KEDA_PAUSED_REPLICAS)
        else:
            found = self.catalog.by_kind(kind_name)
            if len(found) != 1:
                raise RestoreRefused(f"{kind_name}: not a kind gpusteward stops (one of "
                                     f"{', '.join(known_kinds(self.catalog))}; KIND.GROUP where "
                                     "ambiguous)")
            k = found[0]
        what = f"{k.kind} {namespace}/{name}"
        version = await self.switches.served(k.group)
        if version is None:
            raise RestoreRefused(f"{what}: the API server does not serve {k.group}")
        path = object_path(k.group, version, namespace, k.plural, name)
        obj = await self.switches.get(path)
        meta = obj.get("metadata", {})
        ann = meta.get("annotations") or {}
        reason = _reason(ann, what)
        if k.how == kinds.SCALE:
            return await self._scale_back(path, obj, reason, what)
        if k.how == kinds.PAUSE:
            if kinds.KEDA_PAUSED_REPLICAS not in ann:
                raise RestoreRefused(f"{what} is not paused: nothing to restore")
            body: dict[str, Any] = {"metadata": {"annotations": dict.fromkeys(
                (kinds.KEDA_PAUSED_REPLICAS, *kinds.RECORD))}}
        elif not kinds.switched_off(k, obj):
            raise RestoreRefused(f"{what} is not stopped: nothing to restore (someone started "
                                 f"it since gpusteward stopped it)")
        else:
            body = kinds.restore_patch(k, stamp(self.now))
        body["metadata"]["resourceVersion"] = meta.get("resourceVersion")
        await self.switches.patch(path, body)
        return f"{what} restored"

    async def _scale_back(self, path: str, obj: dict[str, Any], reason: str, what: str) -> str:
        scale = await self.switches.get(f"{path}/scale")
        replicas = scale.get("spec", {}).get("replicas", 0)  # autoscaling/v1 omits a zero
        if replicas != 0:
            raise RestoreRefused(f"{what} runs {replicas} replicas, not 0: not restored "
                                 f"(someone scaled it since gpusteward did)")
        before = _believable(obj["metadata"].get("annotations") or {}, reason, what)
        await self.switches.patch(path, {"metadata": {
            "resourceVersion": obj["metadata"]["resourceVersion"],
            "annotations": dict.fromkeys((REPLICAS_BEFORE, *kinds.RECORD))}})
        await self.switches.patch(f"{path}/scale", {"spec": {"replicas": before}})
        return f"{what} scaled back to {before}"


def known_kinds(catalog: kinds.Catalog = kinds.DEFAULT) -> list[str]:
    return ["Job", "Deployment", "StatefulSet", "ScaledObject", *(k.kind for k in catalog.kinds)]


def _believable(ann: dict[str, str], reason: str, what: str) -> int:
    """The replica count to bring back, only when it matches the one recorded with the reclaim."""
    before = plain_count(ann.get(REPLICAS_BEFORE))
    if before is None:
        raise RestoreRefused(f"{what}: {REPLICAS_BEFORE}={ann.get(REPLICAS_BEFORE)!r} is not "
                             f"a plain integer: not restored")
    recorded = _RECORDED.search(reason)
    if recorded is None or before > int(recorded.group(1)) or before == 0:
        raise RestoreRefused(
            f"{what}: {REPLICAS_BEFORE}={before} does not match the count recorded with the "
            f"reclaim ({RECLAIM_REASON}={reason!r}): not restored")
    return before


def _reason(annotations: dict[str, str], what: str) -> str:
    reason = annotations.get(RECLAIM_REASON)
    if reason is None:
        raise RestoreRefused(f"{what} was not stopped by gpusteward (no {RECLAIM_REASON} "
                             f"annotation): not restored")
    return reason
