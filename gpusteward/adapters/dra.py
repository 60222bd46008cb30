"""List+watch of the resource.k8s.io/v1 kinds behind DRA GPUs, into a ``core.dra.DraFleet``.

The same raw list/watch, decoding and re-list rules as the node and pod watchers
(adapters/kube.py): a re-list after 410 Gone replaces the kind's whole picture.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec
from kubernetes_asyncio import client

from gpusteward.adapters.errors import KubeForbidden, KubeNotFound
from gpusteward.adapters.kube import Event, Watcher, list_raw
from gpusteward.core.drafleet import DraFleet
from gpusteward.core.drawire import (
    WireClaim,
    WireClass,
    WireSlice,
    slice_devices,
    to_claim,
    to_class,
)

log = logging.getLogger("gpusteward.dra")
RESOURCE_API = "/apis/resource.k8s.io/v1"
KINDS = ("resourceslices", "deviceclasses", "resourceclaims")
_slice = msgspec.json.Decoder(WireSlice)
_class = msgspec.json.Decoder(WireClass)
_claim = msgspec.json.Decoder(WireClaim)


class DraWatcher(Watcher):
    """Keeps one DRA kind of a DraFleet in step with the API server."""

    def __init__(self, api: client.ApiClient, dra: DraFleet, kind: str, **kw: Any):
        super().__init__(api, dra.store, kind, (), **kw)
        self.dra = dra
        self.path = f"{RESOURCE_API}/{kind}"

    async def relist(self) -> str:
        items, version = await list_raw(self.api, self.path, self.page_size)
        driver, dra = self.dra.driver, self.dra
        if self.kind == "resourceslices":
            slices = [_slice.decode(r) for r in items]
            dra.replace_slices({w.metadata.name: slice_devices(w, driver) for w in slices})
        elif self.kind == "deviceclasses":
            dra.replace_classes(to_class(_class.decode(r), driver) for r in items)
        else:
            dra.replace_claims(to_claim(_claim.decode(r), driver) for r in items)
        self.synced.set()
        return version

    def _apply_object(self, event: Event) -> str:
        gone = event.type == "DELETED"
        driver, dra = self.dra.driver, self.dra
        wire: WireSlice | WireClass | WireClaim
        if self.kind == "resourceslices":
            wire = _slice.decode(event.object)
            dra.set_slice(wire.metadata.name, None if gone else slice_devices(wire, driver))
        elif self.kind == "deviceclasses":
            wire = _class.decode(event.object)
            dra.set_class(wire.metadata.name, None if gone else to_class(wire, driver))
        else:
            wire = _claim.decode(event.object)
            key = f"{wire.metadata.namespace}/{wire.metadata.name}"
            dra.set_claim(key, None if gone else to_claim(wire, driver))
        return wire.metadata.resource_version


def start(api: client.ApiClient, dra: DraFleet) -> asyncio.Task[Any]:
    """The three DRA watches, running until the task is cancelled."""
    async def run() -> None:
        await asyncio.gather(*(DraWatcher(api, dra, kind).run() for kind in KINDS))
    return asyncio.create_task(run())


async def read(api: client.ApiClient, dra: DraFleet) -> None:
    """One LIST of each DRA kind into ``dra`` (the reclaimer's and the report's snapshot). A
    cluster without resource.k8s.io/v1, or RBAC without it, has no DRA GPUs to show: logged."""
    try:
        slices, classes, claims = await asyncio.gather(
            *(list_raw(api, f"{RESOURCE_API}/{kind}") for kind in KINDS))
    except (KubeForbidden, KubeNotFound) as e:
        log.warning("no DRA GPUs read: %s", e)
        return
    dra.replace_slices({w.metadata.name: slice_devices(w, dra.driver)
                        for w in (_slice.decode(r) for r in slices[0])})
    dra.replace_classes(to_class(_class.decode(r), dra.driver) for r in classes[0])
    dra.replace_claims(to_claim(_claim.decode(r), dra.driver) for r in claims[0])
