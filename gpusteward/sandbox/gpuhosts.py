"""What a real GPU node gives the NVML agent, for every fake node of the sandbox.

The sandbox's agent mode runs one real ``gpusteward agent`` per GPU node. Each reads NVML from
the NVML test library and asks a kubelet socket which pod holds which GPU; this writer keeps
both true to the DCGM simulator's own model (the ``SimGpu`` list ``simulate`` returns), so per
GPU node there is:

* ``<dir>/<node>.json`` -- the node's GPUs for the library: the simulator's UUIDs, names, bus
  ids, utilization, memory, temperature and power;
* ``<dir>/<node>.sock`` -- PodResources ``List``: each pod with the UUIDs of its GPUs, or, for a
  pod whose GPUs a DRA claim holds, the claim's devices by driver, pool and device name (the
  sandbox's DRA driver names GPU ``i`` ``gpu-<i>`` in the node's pool).

Agents reading these export what the simulator would, so a test can compare them series by
series. XIDs: NVML reports a GPU that fell off the bus (XID 79) as ``NVML_ERROR_GPU_IS_LOST``,
so a node labelled with XID 79 loses its GPUs here. Any other XID is an NVML event; while a node
carries the label, each update is a new event on each of its GPUs, so an agent whose XID hold
outlasts an update shows the XID as long as the simulator does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path

from gpusteward.core.dcgm import MIB, XID_GPU_LOST, PodRef
from gpusteward.core.dra import DEFAULT_DRIVER as DRIVER
from gpusteward.sandbox.fakenvml import FakeGpu, config_text, replace_file
from gpusteward.sandbox.podresources import Holder, PodResourcesServer
from gpusteward.sandbox.simgpu import SimGpu

__all__ = ["GpuHosts", "config_path", "holders", "nvml_gpu", "socket_path"]


def config_path(directory: Path, node: str) -> Path:
    return directory / f"{node}.json"


def socket_path(directory: Path, node: str) -> Path:
    return directory / f"{node}.sock"


def nvml_gpu(gpu: SimGpu, xid_seq: int = 0) -> FakeGpu:
    """The simulator's GPU as NVML would report it (integer percent, mW, bytes); ``xid_seq``
    numbers the XID events so far."""
    lost = gpu.xid == XID_GPU_LOST
    event = gpu.xid != 0 and not lost
    return FakeGpu(
        uuid=gpu.uuid, name=gpu.model_name, pci_bus_id=gpu.pci_bus_id,
        util_gpu=round(gpu.util_percent), memory_total=gpu.memory_mib * MIB,
        memory_used=gpu.fb_used_mib * MIB, temperature=gpu.temp_c,
        power_mw=round(gpu.power_w * 1000),
        xid=gpu.xid if event else 0, xid_seq=xid_seq if event else 0,
        errors={"*": "GPU_IS_LOST"} if lost else {},
    )


def holders(gpus: list[SimGpu], claims: Mapping[str, str] | None = None) -> list[Holder]:
    """One Holder per pod, listing its GPUs' UUIDs, as the kubelet would; ``claims``: pod key
    -> the DRA claim holding its GPUs, listed by device instead."""
    by_pod: dict[PodRef, list[SimGpu]] = {}
    for gpu in gpus:
        if gpu.pod is not None:
            by_pod.setdefault(gpu.pod, []).append(gpu)
    out = []
    for ref, held in by_pod.items():
        claim = (claims or {}).get(f"{ref.namespace}/{ref.name}")
        devices = tuple((DRIVER, g.node, f"gpu-{g.index}") for g in held)
        out.append(Holder(namespace=ref.namespace, pod=ref.name, container=ref.container,
                          device_ids=() if claim else tuple(g.uuid for g in held),
                          claim=(claim, devices) if claim else None))
    return out


class GpuHosts:
    """Per node: the NVML library's file (rewritten only on change) and a kubelet socket."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.servers: dict[str, PodResourcesServer] = {}
        self._written: dict[str, str] = {}
        self._xid_events = 0  # one more per update that carries an XID event

    async def update(self, gpus: list[SimGpu], claims: Mapping[str, str] | None = None) -> None:
        by_node: dict[str, list[SimGpu]] = {}
        for gpu in gpus:
            by_node.setdefault(gpu.node, []).append(gpu)
        if any(g.xid not in (0, XID_GPU_LOST) for g in gpus):
            self._xid_events += 1
        for node, node_gpus in by_node.items():
            server = self.servers.get(node)
            if server is None:
                server = self.servers[node] = PodResourcesServer(socket_path(self.dir, node))
                await server.start()
            server.holders = holders(node_gpus, claims)
            text = config_text([nvml_gpu(g, self._xid_events) for g in node_gpus])
            if self._written.get(node) != text:
                replace_file(config_path(self.dir, node), text)
                self._written[node] = text

    async def run(self, model: Callable[[], tuple[list[SimGpu], Mapping[str, str]]],
                  tick: float) -> None:
        """``model``: the GPUs, and pod key -> the DRA claim holding its GPUs."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            while True:
                await self.update(*model())
                await asyncio.sleep(tick)
        finally:
            await asyncio.gather(*(s.stop() for s in self.servers.values()))
