"""What a real GPU node gives the NVML agent, for every fake node of the sandbox.

The sandbox's agent mode runs one real ``gpusteward agent`` per GPU node. Each reads NVML from
the NVML test library and asks a kubelet socket which pod holds which GPU; this writer keeps
both true to the DCGM simulator's own model (the ``SimGpu`` list ``simulate`` returns), so per
GPU node there is:

* ``<dir>/<node>.json`` -- the node's GPUs for the library: the simulator's UUIDs, names, bus
  ids, utilization, memory, temperature and power;
* ``<dir>/<node>.sock`` -- PodResources ``List``: each pod with the UUIDs of its GPUs.

Agents reading these export what the simulator would, so a test can compare them series by
series. XIDs: NVML reports a GPU that fell off the bus (XID 79) as ``NVML_ERROR_GPU_IS_LOST``,
so a node labelled with XID 79 loses its GPUs here. Other XIDs reach NVML only as events, which
the agent does not collect; they are logged and left out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from gpusteward.core.dcgm import PodRef, SimGpu
from gpusteward.sandbox.fakenvml import FakeGpu, config_text, replace_file
from gpusteward.sandbox.podresources import Holder, PodResourcesServer

log = logging.getLogger("gpusteward.sandbox.gpuhosts")

MIB = 1 << 20
XID_GPU_LOST = 79

__all__ = ["GpuHosts", "config_path", "holders", "nvml_gpu", "socket_path"]


def config_path(directory: Path, node: str) -> Path:
    return directory / f"{node}.json"


def socket_path(directory: Path, node: str) -> Path:
    return directory / f"{node}.sock"


def nvml_gpu(gpu: SimGpu) -> FakeGpu:
    """The simulator's GPU as NVML would report it (integer percent, mW, bytes)."""
    return FakeGpu(
        uuid=gpu.uuid, name=gpu.model_name, pci_bus_id=gpu.pci_bus_id,
        util_gpu=round(gpu.util_percent), memory_total=gpu.memory_mib * MIB,
        memory_used=gpu.fb_used_mib * MIB, temperature=gpu.temp_c,
        power_mw=round(gpu.power_w * 1000),
        errors={"*": "GPU_IS_LOST"} if gpu.xid == XID_GPU_LOST else {},
    )


def holders(gpus: list[SimGpu]) -> list[Holder]:
    """One Holder per pod, listing its GPUs' UUIDs, as the kubelet would."""
    by_pod: dict[PodRef, list[str]] = {}
    for gpu in gpus:
        if gpu.pod is not None:
            by_pod.setdefault(gpu.pod, []).append(gpu.uuid)
    return [Holder(namespace=ref.namespace, pod=ref.name, container=ref.container,
                   device_ids=tuple(uuids)) for ref, uuids in by_pod.items()]


class GpuHosts:
    """Per node: the NVML library's file (rewritten only on change) and a kubelet socket."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.servers: dict[str, PodResourcesServer] = {}
        self._written: dict[str, str] = {}
        self._unsupported_xid: set[str] = set()

    async def update(self, gpus: list[SimGpu]) -> None:
        by_node: dict[str, list[SimGpu]] = {}
        for gpu in gpus:
            by_node.setdefault(gpu.node, []).append(gpu)
        for node, node_gpus in by_node.items():
            self._warn_unsupported_xid(node, node_gpus)
            server = self.servers.get(node)
            if server is None:
                server = self.servers[node] = PodResourcesServer(socket_path(self.dir, node))
                await server.start()
            server.holders = holders(node_gpus)
            text = config_text([nvml_gpu(g) for g in node_gpus])
            if self._written.get(node) != text:
                replace_file(config_path(self.dir, node), text)
                self._written[node] = text

    def _warn_unsupported_xid(self, node: str, gpus: list[SimGpu]) -> None:
        xids = {g.xid for g in gpus} - {0, XID_GPU_LOST}
        if not xids:
            self._unsupported_xid.discard(node)
        elif node not in self._unsupported_xid:
            self._unsupported_xid.add(node)
            log.warning("%s: XID %s reaches the NVML agent only as an event, which it does not "
                        "collect; only XID 79 (GPU lost) is simulated", node, sorted(xids))

    async def run(self, model: Callable[[], list[SimGpu]], tick: float) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            while True:
                await self.update(model())
                await asyncio.sleep(tick)
        finally:
            await asyncio.gather(*(s.stop() for s in self.servers.values()))
