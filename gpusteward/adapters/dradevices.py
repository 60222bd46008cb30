"""GPU UUIDs of the DRA devices on this node: the kubelet's PodResources API names a device a
claim holds by driver, pool and device name only (``DynamicResource.claim_resources``), and the
driver's ResourceSlice for this node carries each device's ``uuid`` attribute
(NVIDIA/k8s-dra-driver-gpu ``deviceinfo.go``). LIST with ``fieldSelector=spec.nodeName=<node>``
when a device is not known yet, at most once per ``min_interval``; a failed LIST keeps what was
known and those GPUs are exported without their DRA pod until it works.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

import aiohttp
import msgspec
from kubernetes_asyncio import client

from gpusteward.adapters.dra import RESOURCE_API
from gpusteward.adapters.errors import AdapterError
from gpusteward.adapters.kube import list_raw
from gpusteward.core.dra import DEFAULT_DRIVER
from gpusteward.core.drawire import WireSlice, slice_devices

log = logging.getLogger("gpusteward.agent.dra")

DeviceKey = tuple[str, str, str]  # (driver, pool, device name)
SliceLister = Callable[[], Awaitable[dict[DeviceKey, str]]]
_slices = msgspec.json.Decoder(WireSlice)


def slice_lister(api: client.ApiClient, node: str, driver: str = DEFAULT_DRIVER,
                 timeout: float = 10.0) -> SliceLister:
    """LIST this node's ResourceSlices: (driver, pool, device) -> GPU UUID."""
    selectors = [("fieldSelector", f"spec.nodeName={node}")]

    async def lister() -> dict[DeviceKey, str]:
        items, _ = await asyncio.wait_for(
            list_raw(api, f"{RESOURCE_API}/resourceslices", selectors=selectors), timeout)
        return {(driver, d.pool, d.name): d.uuid for raw in items
                for d in slice_devices(_slices.decode(raw), driver) if d.uuid}

    return lister


class DraDevices:
    def __init__(self, lister: SliceLister, min_interval: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lister, self.min_interval, self.clock = lister, min_interval, clock
        self._uuids: dict[DeviceKey, str] = {}
        self._listed_at: float | None = None
        self._failing = False

    async def uuids(self, keys: Iterable[DeviceKey]) -> dict[DeviceKey, str]:
        wanted = set(keys)
        due = self._listed_at is None or self.clock() - self._listed_at >= self.min_interval
        if wanted - self._uuids.keys() and due:
            self._listed_at = self.clock()
            try:
                self._uuids = await self.lister()
                self._failing = False
            except (AdapterError, aiohttp.ClientError, OSError, TimeoutError,
                    msgspec.DecodeError) as e:
                if not self._failing:
                    log.warning("listing this node's ResourceSlices failed (GPUs held through "
                                "DRA claims are exported without their pod): %s", e)
                self._failing = True
        return {k: self._uuids[k] for k in wanted if k in self._uuids}
