"""`gpusteward reclaimer restore`: undo a scale-down or a Job suspension that gpusteward made,
and nothing else.

The annotations are editable by anyone who can edit the object, so none is trusted: gpusteward's
own stop record (reclaimer/stops.py) must hold an entry for the object, with the uid it has now
(core/reclaim/trust.py); the object must still carry gpusteward's reclaim-reason annotation and
be at zero replicas (or suspended); a scale-down comes back to the count recorded, and an
annotation claiming another count is refused, naming both. Otherwise ``RestoreRefused``. Every
patch carries the resourceVersion read, so a concurrent change makes it fail (409); the whole
read-check-write then runs again, a few times, on what the object is now. A restore done, its
entry is removed from the record.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes_asyncio import client

from gpusteward.adapters.errors import AdapterError
from gpusteward.adapters.kube import CALL_TIMEOUT
from gpusteward.adapters.stopper import Switches, object_path
from gpusteward.core.owners import KEDA_PAUSED_REPLICAS, PAUSE, SCALE, Kind
from gpusteward.core.reclaim import kinds, trust
from gpusteward.core.reclaim.model import RECLAIM_REASON, REPLICAS_BEFORE, StopEntry
from gpusteward.core.reclaim.selfservice import plain_count
from gpusteward.core.times import stamp
from gpusteward.reclaimer.actor import retry_on_conflict, workload_api
from gpusteward.reclaimer.stops import StopBook

__all__ = ["RestoreRefused", "Restorer", "plain_count"]

log = logging.getLogger("gpusteward.reclaimer")


class RestoreRefused(ValueError):
    """The object is not one gpusteward stopped, or its record is not believable."""


class Restorer:
    def __init__(self, api: client.ApiClient, stops: StopBook, now: float = 0.0,
                 catalog: kinds.Catalog = kinds.DEFAULT) -> None:
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.catalog = catalog
        self.switches = Switches(api, catalog)
        self.stops = stops
        self.now = now  # the refreshed last activity of a Notebook

    async def restore(self, namespace: str, kind: str, name: str) -> str:
        """Returns what was done; raises RestoreRefused when nothing may be done. A write that
        lost a race with a controller's own update (409) is tried again from a fresh read."""
        done, entry = await retry_on_conflict(lambda: self._restore(namespace, kind, name))
        try:
            await self.stops.forget(entry)
        except AdapterError as e:  # restored all the same; the entry is a record without a stop
            log.warning("%s, but its entry stays in %s: %s", done, self.stops.where, e)
        return done

    async def _restore(self, namespace: str, kind: str, name: str) -> tuple[str, StopEntry]:
        what = f"{kind} {namespace}/{name}"
        if kind == "Job":
            return await self._resume(namespace, name, what)
        if kind not in ("Deployment", "StatefulSet"):
            return await self._switch_back(namespace, kind, name)
        read, patch = workload_api(self.apps, kind)
        obj = await read(name, namespace, _request_timeout=CALL_TIMEOUT)
        ann = obj.metadata.annotations or {}
        _reason(ann, what)
        entry = await self._vouched(namespace, "apps", kind, name, obj.metadata.uid, what)
        if obj.spec.replicas != 0:
            raise RestoreRefused(f"{what} runs {obj.spec.replicas} replicas, not 0: not "
                                 f"restored (someone scaled it since gpusteward did)")
        before = _recorded(entry, ann, what)
        await patch(name, namespace, {
            "metadata": {"resourceVersion": obj.metadata.resource_version,
                         "annotations": dict.fromkeys((REPLICAS_BEFORE, *kinds.RECORD))},
            "spec": {"replicas": before}}, _request_timeout=CALL_TIMEOUT)
        return f"{what} scaled back to {before}", entry

    async def _resume(self, namespace: str, name: str, what: str) -> tuple[str, StopEntry]:
        job = await self.batch.read_namespaced_job(name, namespace, _request_timeout=CALL_TIMEOUT)
        _reason(job.metadata.annotations or {}, what)
        entry = await self._vouched(namespace, "batch", "Job", name, job.metadata.uid, what)
        if not job.spec.suspend:
            raise RestoreRefused(f"{what} is not suspended: nothing to resume")
        await self.batch.patch_namespaced_job(name, namespace, {
            "metadata": {"resourceVersion": job.metadata.resource_version,
                         "annotations": dict.fromkeys(kinds.RECORD)},
            "spec": {"suspend": False}}, _request_timeout=CALL_TIMEOUT)
        return f"{what} resumed", entry

    async def _switch_back(self, namespace: str, kind_name: str,
                           name: str) -> tuple[str, StopEntry]:
        """An owner stopped through its own switch (core.reclaim.kinds), a KEDA ScaledObject
        paused at zero, or a Kueue Workload: the switch back, only where gpusteward set it."""
        if kind_name in ("ScaledObject", "ScaledObject.keda.sh"):
            k = Kind("keda.sh", "ScaledObject", "scaledobjects", PAUSE,
                           annotation=KEDA_PAUSED_REPLICAS)
        else:
            found = self.catalog.by_kind(kind_name)
            if len(found) != 1:
                raise RestoreRefused(f"{kind_name}: not a kind gpusteward stops (one of "
                                     f"{', '.join(kinds.known_kinds(self.catalog))}; KIND.GROUP "
                                     "where ambiguous)")
            k = found[0]
        what = f"{k.kind} {namespace}/{name}"
        version = await self.switches.served(k.group)
        if version is None:
            raise RestoreRefused(f"{what}: the API server does not serve {k.group}")
        path = object_path(k.group, version, namespace, k.plural, name)
        obj = await self.switches.get(path)
        meta = obj.get("metadata", {})
        ann = meta.get("annotations") or {}
        _reason(ann, what)
        entry = await self._vouched(namespace, k.group, k.kind, name, meta.get("uid", ""), what)
        if k.how == SCALE:
            return await self._scale_back(path, obj, entry, what), entry
        if k.how == PAUSE:
            if KEDA_PAUSED_REPLICAS not in ann:
                raise RestoreRefused(f"{what} is not paused: nothing to restore")
            body: dict[str, Any] = {"metadata": {"annotations": dict.fromkeys(
                (KEDA_PAUSED_REPLICAS, *kinds.RECORD))}}
        elif not kinds.switched_off(k, obj):
            raise RestoreRefused(f"{what} is not stopped: nothing to restore (someone started "
                                 f"it since gpusteward stopped it)")
        else:
            body = kinds.restore_patch(k, stamp(self.now))
        body["metadata"]["resourceVersion"] = meta.get("resourceVersion")
        await self.switches.patch(path, body)
        return f"{what} restored", entry

    async def _scale_back(self, path: str, obj: dict[str, Any], entry: StopEntry,
                          what: str) -> str:
        scale = await self.switches.get(f"{path}/scale")
        replicas = scale.get("spec", {}).get("replicas", 0)  # autoscaling/v1 omits a zero
        if replicas != 0:
            raise RestoreRefused(f"{what} runs {replicas} replicas, not 0: not restored "
                                 f"(someone scaled it since gpusteward did)")
        before = _recorded(entry, obj["metadata"].get("annotations") or {}, what)
        await self.switches.patch(path, {"metadata": {
            "resourceVersion": obj["metadata"]["resourceVersion"],
            "annotations": dict.fromkeys((REPLICAS_BEFORE, *kinds.RECORD))}})
        await self.switches.patch(f"{path}/scale", {"spec": {"replicas": before}})
        return f"{what} scaled back to {before}"

    async def _vouched(self, namespace: str, group: str, kind: str, name: str, uid: str,
                       what: str) -> StopEntry:
        """gpusteward's own entry for this very object (the uid read now), or RestoreRefused."""
        entry = await self.stops.find(namespace, group, kind, name)
        why = trust.unvouched(entry, uid, what, self.stops.where)
        if why:
            raise RestoreRefused(why)
        assert entry is not None
        return entry


def _recorded(entry: StopEntry, annotations: dict[str, str], what: str) -> int:
    """The replica count to bring back: the recorded one, when no annotation disagrees."""
    before, why = trust.replicas_back(entry, annotations, what)
    if why:
        raise RestoreRefused(why)
    return before


def _reason(annotations: dict[str, str], what: str) -> str:
    reason = annotations.get(RECLAIM_REASON)
    if reason is None:
        raise RestoreRefused(f"{what} was not stopped by gpusteward (no {RECLAIM_REASON} "
                             f"annotation): not restored")
    return reason
