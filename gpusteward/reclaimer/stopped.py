"""`gpusteward reclaimer restore --list`: every workload gpusteward stopped, when, why, and the
command that brings it back. Found by gpusteward's reclaim-reason annotation on the kinds it
stops; kinds the API server does not serve are skipped. One with the annotation but no entry
in gpusteward's stop record (reclaimer/stops.py) is listed "unrecorded": restore refuses it."""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from typing import Any

import msgspec
from kubernetes_asyncio import client

from gpusteward.adapters.errors import KubeNotFound
from gpusteward.adapters.kube import list_raw
from gpusteward.adapters.stopper import Switches
from gpusteward.core.owners import SCALE, Kind
from gpusteward.core.reclaim import kinds
from gpusteward.core.reclaim.model import RECLAIM_REASON, RECLAIMED_AT
from gpusteward.reclaimer.stops import StopBook

# (group, plural, kind) of everything restore can bring back, beside the catalog's kinds.
RESTORABLE = (("batch", "jobs", "Job"), ("apps", "deployments", "Deployment"),
              ("apps", "statefulsets", "StatefulSet"),
              ("keda.sh", "scaledobjects", "ScaledObject"))


class Stopped(msgspec.Struct, frozen=True):
    kind: str
    namespace: str
    name: str
    since: str  # when gpusteward stopped it ("" where it predates the record)
    why: str
    # stopping: the owner has not yet reported its pods gone (Ray); unrecorded: not in the
    # stop record (annotated by hand, or stopped before gpusteward kept one)
    state: str = "stopped"

    @property
    def command(self) -> str:
        if self.state == UNRECORDED:
            return "- (not in gpusteward's stop record: restore refuses it)"
        return f"gpusteward reclaimer restore {self.namespace}/{self.kind}/{self.name}"


UNRECORDED = "unrecorded"


async def stopped(api: client.ApiClient, catalog: kinds.Catalog = kinds.DEFAULT,
                  stops: StopBook | None = None) -> list[Stopped]:
    """``stops``: the stop record to hold the annotated objects against (None: not held)."""
    switches = Switches(api, catalog)
    entries = None if stops is None else await stops.entries()
    found: list[Stopped] = []
    versions: dict[str, str | None] = {}
    for group, plural, kind in (*RESTORABLE, *((k.group, k.plural, k.kind)
                                               for k in catalog.kinds)):
        if group not in versions:
            versions[group] = "v1" if group in ("batch", "apps") else await switches.served(group)
        if versions[group] is None:
            continue
        try:
            items, _ = await list_raw(api, f"/apis/{group}/{versions[group]}/{plural}")
        except KubeNotFound:  # the group is served, this kind of it is not installed
            continue
        recorded = None if entries is None else {
            (e.namespace, e.name, e.uid) for e in entries if (e.group, e.kind) == (group, kind)}
        found += _marked(catalog.known(group, kind), kind,
                         (msgspec.json.decode(i) for i in items), recorded)
    return sorted(found, key=lambda s: (s.since, s.namespace, s.name))


def _marked(k: Kind | None, kind: str, objects: Iterable[Mapping[str, Any]],
            recorded: Container[tuple[str, str, str]] | None = None) -> list[Stopped]:
    """``recorded``: (namespace, name, uid) of this kind in the stop record."""
    out = []
    for obj in objects:
        meta = obj.get("metadata", {})
        ann = meta.get("annotations") or {}
        if RECLAIM_REASON in ann:
            where = (meta.get("namespace", ""), meta.get("name", ""))
            gone = k is None or k.how == SCALE or kinds.let_go(k, obj)
            state = "stopped" if gone else "stopping"
            if recorded is not None and (*where, meta.get("uid", "")) not in recorded:
                state = UNRECORDED
            out.append(Stopped(kind, *where, ann.get(RECLAIMED_AT, ""), ann[RECLAIM_REASON],
                               state))
    return out


def table(rows: list[Stopped]) -> str:
    if not rows:
        return "nothing stopped by gpusteward"
    lines = [("SINCE", "KIND", "NAMESPACE/NAME", "STATE", "WHY", "RESTORE WITH")]
    lines += [(r.since or "-", r.kind, f"{r.namespace}/{r.name}", r.state, r.why, r.command)
              for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(5)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(line, widths, strict=False)),
                                line[5]]) for line in lines)
