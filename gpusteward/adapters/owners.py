"""Resolve every GPU pod to the top-most owner gpusteward knows, and how that owner is stopped.

The chain is walked through controller references (Pod -> ReplicaSet -> Deployment, Pod -> Job
-> JobSet -> TrainJob, Pod -> StatefulSet -> Notebook, worker Pod -> StatefulSet -> leader Pod ->
StatefulSet -> LeaderWorkerSet ...). Built-in kinds come from the snapshot's LISTs; an owner of a
known custom kind (core.reclaim.kinds) is read with one GET, cached for the cycle. The walk stops
at a kind gpusteward does not know: that kind is the owner, and it is blocked, not evicted.

Optional kinds cost nothing where they are absent: Kueue Workloads are listed only for pods
labelled with a Kueue queue and only where the API server serves kueue.x-k8s.io; HPAs, and
ScaledObjects where keda.sh is served, are listed only when a scalable owner is found.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
from kubernetes_asyncio import client

from gpusteward.adapters.errors import KubeNotFound, KubeRefused, kube_error
from gpusteward.adapters.kube import list_raw
from gpusteward.adapters.stopper import Switches
from gpusteward.core.kubewire import Meta, WirePod
from gpusteward.core.model import OwnerRef, Pod
from gpusteward.core.owners import (
    BUILT_IN,
    DEACTIVATE,
    KUEUE_JOB_UID,
    KUEUE_QUEUE,
    NO_SWITCH,
    PAUSE,
    SCALE,
    group_of,
)
from gpusteward.core.reclaim import demote, kinds, kueue
from gpusteward.core.reclaim.model import REPLICAS_BEFORE, SNOOZE_UNTIL, Owner, Switch

log = logging.getLogger("gpusteward.reclaimer")
MAX_HOPS = 8  # controller chains are short; a longer one is a loop or a mistake
HPA_PATH = "/apis/autoscaling/v2/horizontalpodautoscalers"
KEDA = ("keda.sh", "ScaledObject")  # KEDA makes itself the HPA's controller (keda hpa.go)


class Link(msgspec.Struct, frozen=True):
    """One object in a controller chain."""

    kind: str
    group: str
    version: str
    namespace: str
    name: str
    uid: str = ""
    labels: Mapping[str, str] = msgspec.field(default_factory=dict)
    annotations: Mapping[str, str] = msgspec.field(default_factory=dict)
    controller: OwnerRef | None = None
    obj: Mapping[str, Any] | None = None  # the raw object of a custom kind
    spec: Any = None  # a listed built-in's spec (replicas, suspend)


def link_of(kind: str, group: str, version: str, meta: Meta, spec: Any = None,
            obj: Mapping[str, Any] | None = None) -> Link:
    return Link(kind, group, version, meta.namespace, meta.name, meta.uid, meta.labels or {},
                meta.annotations or {},
                next((o for o in meta.owner_references or () if o.controller), None), obj, spec)


class OwnerChains:
    """One resolution per snapshot; counts its API calls like the SnapshotReader."""

    def __init__(self, api: client.ApiClient, catalog: kinds.Catalog = kinds.DEFAULT) -> None:
        self.api = api
        self.catalog = catalog
        self.switches = Switches(api, catalog)
        self.api_calls = 0

    async def resolve(self, pods: Iterable[Pod], wires: Sequence[WirePod],
                      listed: Iterable[Link]) -> dict[str, Owner]:
        """pod uid -> the owner to act on."""
        self._known = {link.uid: link for link in listed}
        self._known |= {w.metadata.uid: link_of("Pod", "", "v1", w.metadata) for w in wires}
        self._fetched: dict[str, Link | None] = {}
        self._workloads: list[Mapping[str, Any]] | None = None
        self._kueue_version: str | None = None
        self._hpas: list[Mapping[str, Any]] | None = None
        self._scaled: list[Mapping[str, Any]] | None = None
        tops: dict[str, Owner] = {}
        for pod in pods:
            chain = await self._chain(pod)
            if len(chain) > 1 or KUEUE_QUEUE in pod.labels:  # Kueue admits bare pods too
                tops[pod.uid] = await self._owner(chain)
        members: dict[tuple[str, str | None], list[str]] = {}
        for uid, o in tops.items():
            members.setdefault(_key(o), []).append(uid)
        return {uid: msgspec.structs.replace(o, pods=tuple(members[_key(o)]))
                for uid, o in tops.items()}

    async def _chain(self, pod: Pod) -> list[Link]:
        chain = [self._known.get(pod.uid) or Link("Pod", "", "v1", pod.namespace, pod.name,
                                                  pod.uid, pod.labels, pod.annotations,
                                                  pod.controller)]
        for _ in range(MAX_HOPS):
            ref = chain[-1].controller
            if ref is None:
                break
            group = group_of(ref.api_version) or BUILT_IN.get(ref.kind, "")
            version = ref.api_version.rpartition("/")[2]
            here = Link(ref.kind, group, version, pod.namespace, ref.name, ref.uid)
            found = (await self._read(here) if self.catalog.walkable(group, ref.kind) else None)
            chain.append(found or here)
            if found is None:
                break
        return chain

    async def _read(self, ref: Link) -> Link | None:
        """A built-in from the LISTs (or the pods); a known custom kind by GET, once a cycle."""
        if ref.uid in self._known:
            return self._known[ref.uid]
        k = self.catalog.known(ref.group, ref.kind)
        if k is None:
            return None
        if ref.uid not in self._fetched:
            obj = await self._get_json(f"/apis/{ref.group}/{ref.version}/namespaces/"
                                       f"{ref.namespace}/{k.plural}/{ref.name}")
            meta = msgspec.convert((obj or {}).get("metadata", {}), Meta)
            self._fetched[ref.uid] = (link_of(ref.kind, ref.group, ref.version, meta, obj=obj)
                                      if obj is not None and meta.uid == ref.uid else None)
        return self._fetched[ref.uid]

    async def _owner(self, chain: list[Link]) -> Owner:
        top = chain[-1]
        base = Owner(top.kind, top.namespace, top.name, group=top.group, version=top.version,
                     snooze=top.annotations.get(SNOOZE_UNTIL))
        queue = next((c.labels[KUEUE_QUEUE] for c in chain if KUEUE_QUEUE in
                      c.labels), None)
        if queue is not None and (kueue := await self._kueue(chain, base, queue)) is not None:
            return kueue
        if (top.group, top.kind) in NO_SWITCH:
            return msgspec.structs.replace(base, blocked=NO_SWITCH[(top.group, top.kind)])
        if not self.catalog.walkable(top.group, top.kind):
            return base  # the policy's ownerActions.unknown decides: block by default
        k = self.catalog.known(top.group, top.kind)
        scalable = k is not None and k.how == SCALE or (
            top.group == "apps" and top.kind in ("Deployment", "StatefulSet"))
        if scalable and (auto := await self._autoscaled(top, base)) is not None:
            return auto
        if k is None:
            return msgspec.structs.replace(base, in_progress=_built_in_in_progress(top))
        if top.obj is not None and (why := kinds.refused(k, top.obj)):
            return msgspec.structs.replace(base, blocked=why)
        stopped = (REPLICAS_BEFORE in top.annotations if k.how == SCALE
                   else top.obj is not None and kinds.switched_off(k, top.obj))
        return msgspec.structs.replace(base, how=k.how, in_progress=stopped)

    async def _kueue(self, chain: list[Link], base: Owner, queue: str) -> Owner | None:
        """The Workload Kueue made for the top-most object of the chain it manages; None where
        Kueue is not installed. Never the Job's suspend: Kueue owns that field."""
        workloads = await self._kueue_workloads()
        if workloads is None:
            return None
        for link in reversed(chain):
            for wl in workloads:
                meta = wl.get("metadata", {})
                if (meta.get("namespace") == link.namespace and
                        (meta.get("labels") or {}).get(KUEUE_JOB_UID) == link.uid):
                    k = self.catalog.known("kueue.x-k8s.io", "Workload")
                    assert k is not None
                    version = wl.get("apiVersion", "").rpartition("/")[2]
                    return msgspec.structs.replace(
                        base, how=DEACTIVATE, in_progress=kinds.switched_off(k, wl),
                        via=Switch("Workload", k.group, version, meta.get("name", "")),
                        demoted_at=demote.demoted_at(wl))
        return msgspec.structs.replace(
            base, blocked=f"Kueue-managed (queue {queue}) but Kueue has no Workload for it "
                          f"yet; its suspend is Kueue's to set")

    async def _kueue_workloads(self) -> list[Mapping[str, Any]] | None:
        if self._workloads is None:
            version = await self._served("kueue.x-k8s.io")
            self._workloads = [] if version is None else await self._list(
                f"/apis/kueue.x-k8s.io/{version}/workloads")
            if version is None:
                return None
            self._kueue_version = version
        return self._workloads

    async def kueue_demand(self, names: Sequence[str]) -> kueue.KueueDemand | None:
        """Workloads waiting for quota and what holds it (core.reclaim.kueue), read only where
        a resolved pod is Kueue's (so its Workloads were listed) and some Workload waits: the
        LocalQueues and ClusterQueues are listed then, else nothing more is read."""
        version = self._kueue_version
        if version is None or not self._workloads:
            return None
        try:
            workloads = [msgspec.convert(w, kueue.WireWorkload) for w in self._workloads]
        except msgspec.ValidationError as e:
            log.warning("Kueue Workloads unreadable, no queue demand from Kueue: %s", e)
            return None
        if not any(w.status.admission is None and w.spec.active is not False
                   for w in workloads):
            return kueue.KueueDemand()
        base = f"/apis/kueue.x-k8s.io/{version}"
        local = await self._list(f"{base}/localqueues")
        cluster = await self._list(f"{base}/clusterqueues")
        try:
            return kueue.demand(workloads, msgspec.convert(local, list[kueue.WireLocalQueue]),
                                msgspec.convert(cluster, list[kueue.WireClusterQueue]), names)
        except msgspec.ValidationError as e:
            log.warning("Kueue queues unreadable, no queue demand from Kueue: %s", e)
            return None

    async def _autoscaled(self, top: Link, base: Owner) -> Owner | None:
        """An HPA on the owner would undo a scale-down: pause KEDA's ScaledObject at zero
        replicas where KEDA drives the HPA, else block."""
        if self._hpas is None:
            self._hpas = await self._list(HPA_PATH)
        for hpa in self._hpas:
            meta, ref = hpa.get("metadata", {}), hpa.get("spec", {}).get("scaleTargetRef", {})
            if (meta.get("namespace") != top.namespace or ref.get("kind") != top.kind or
                    ref.get("name") != top.name or
                    group_of(ref.get("apiVersion", "")) != top.group):
                continue
            by: Mapping[str, Any] = next(
                (o for o in meta.get("ownerReferences") or () if o.get("controller")), {})
            if (group_of(by.get("apiVersion", "")), by.get("kind")) == KEDA:
                version = by["apiVersion"].rpartition("/")[2]
                return await self._keda(top, base, Switch(KEDA[1], KEDA[0], version, by["name"]))
            return msgspec.structs.replace(
                base, blocked=f"driven by HorizontalPodAutoscaler {meta.get('name')}, which "
                              f"would undo a scale-down")
        return await self._keda(top, base, None)

    async def _keda(self, top: Link, base: Owner, named: Switch | None) -> Owner | None:
        """The owner stopped through a KEDA ScaledObject: the one its HPA names, or, with no HPA
        left, one gpusteward paused that targets it (KEDA deletes its HPA when it takes a
        pause). In progress while KEDA has not taken the pause; due again once it has but the
        target still runs, which the stop then finishes (kinds.keda_pause)."""
        for so in await self._scaled_objects():
            meta, ref = so.get("metadata", {}), so.get("spec", {}).get("scaleTargetRef", {})
            if meta.get("namespace") != top.namespace or (
                    meta.get("name") != named.name if named else
                    (ref.get("name"), ref.get("kind", "Deployment")) != (top.name, top.kind)):
                continue
            state = kinds.keda_pause(so)
            if named is None and not state:
                return None  # a ScaledObject without an HPA and not paused by us: not KEDA's now
            version = so.get("apiVersion", "").rpartition("/")[2]
            return msgspec.structs.replace(
                base, how=PAUSE, in_progress=state == kinds.KedaPause.ASKED,
                via=Switch(KEDA[1], KEDA[0], version, meta.get("name", "")))
        if named is None:
            return None
        return msgspec.structs.replace(base, how=PAUSE, via=named)

    async def _scaled_objects(self) -> list[Mapping[str, Any]]:
        """Every ScaledObject, listed once a cycle where the API server serves keda.sh."""
        if self._scaled is None:
            version = await self._served(KEDA[0])
            self._scaled = [] if version is None else await self._list(
                f"/apis/{KEDA[0]}/{version}/scaledobjects")
        return self._scaled

    async def _served(self, group: str) -> str | None:
        self.api_calls += 1
        return await self.switches.served(group)

    async def _list(self, path: str) -> list[Mapping[str, Any]]:
        self.api_calls += 1
        try:
            items, _ = await list_raw(self.api, path)
        except KubeNotFound:
            return []
        return [msgspec.json.decode(i) for i in items]

    async def _get_json(self, path: str) -> dict[str, Any] | None:
        self.api_calls += 1
        try:
            return await self.switches.get(path)
        except KubeNotFound:
            return None
        except KubeRefused as e:
            raise kube_error(e.status, e.reason, f"GET {path}: HTTP {e.status}: {e.reason}",
                             e.detail) from e


def _key(o: Owner) -> tuple[str, str | None]:
    return (f"{o.group}/{o.kind}/{o.namespace}/{o.name}", o.via.name if o.via else None)


def _built_in_in_progress(top: Link) -> bool:
    if top.spec is None:
        return False
    if top.kind == "Job":
        return bool(top.spec.suspend)
    return top.kind in ("Deployment", "StatefulSet") and REPLICAS_BEFORE in top.annotations
