"""HAMi in the sandbox: its node records and a stand-in for its scheduler extender's device choice.

HAMi's Go module is not served here, so none of its binaries runs; this reproduces what they
write and answer, from github:Project-HAMi/HAMi v2.10.0 (4707fb0):

* the device plugin's ``hami.io/node-nvidia-register`` (``pkg/device/devices.go``
  ``MarshalNodeDevices`` of ``DeviceInfo``: Go's field order, every field ``omitempty``;
  ``plugin/register.go`` fills ``count`` with deviceSplitCount, ``devmem`` MiB, ``devcore``
  100, ``type`` the NVML name, ``mode`` ``hami-core``);
* a container's request (``pkg/device/nvidia/device.go`` ``GenerateResourceRequests``): its
  ``nvidia.com/gpu`` vGPUs, each with ``nvidia.com/gpumem`` MiB or ``nvidia.com/gpumem-
  percentage`` (neither: 100 %) and ``nvidia.com/gpucores`` (default 0);
* which device takes it (``Fit``, device.go): a free vGPU slot, the memory and cores left, a
  100-core request only on an unused device, a 0-core request not on a device whose cores are
  all taken; devices by the pod's ``hami.io/gpu-scheduler-policy`` (``spread``, HAMi's
  default, or ``binpack``), nodes binpacked (HAMi's default node policy);
* the pod annotations its Filter writes (``hami.io/vgpu-node``, ``hami.io/vgpu-time``,
  ``hami.io/vgpu-devices-to-allocate`` and ``-allocated``, core/hami.py's encoding).

Not reproduced: HAMi's mutating webhook (it sets ``schedulerName: hami-scheduler`` and, from
2.7, ``gpucores: 100`` on a pod asking neither memory nor cores; sandbox pods name the
scheduler themselves), NUMA and card-type filters, MIG, quotas.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpusteward.core import hami
from gpusteward.sandbox.simgpu import SimGpu, model_name_for_product

GPU, MEM, MEM_PERCENT, CORES = ("nvidia.com/gpu", "nvidia.com/gpumem",
                                "nvidia.com/gpumem-percentage", "nvidia.com/gpucores")
NODE = "hami.io/vgpu-node"
TIME = "hami.io/vgpu-time"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
SCHEDULER_NAME = "hami-scheduler"
# Every resource HAMi's extender manages, all ignored by kube-scheduler's own fit (the chart's
# templates/scheduler/configmap.yaml).
MANAGED = (GPU, MEM, CORES, MEM_PERCENT, "nvidia.com/priority")


def uuid(node: str, index: int) -> str:
    """The GPU's UUID, as the sandbox's DCGM simulator names it."""
    return SimGpu(node, index, "").uuid


def register_annotation(node: str, gpus: int, split: int, product: str,
                        memory_mib: int) -> dict[str, str]:
    kind = model_name_for_product(product)
    kind = kind if kind.startswith("NVIDIA") else f"NVIDIA-{kind}"
    devices = []
    for i in range(gpus):
        entry: dict[str, Any] = {"id": uuid(node, i)}
        if i:
            entry["index"] = i
        entry |= {"count": split, "devmem": memory_mib, "devcore": 100, "type": kind,
                  "mode": "hami-core", "health": True}
        devices.append(entry)
    return {hami.NODE_REGISTER: json.dumps(devices, separators=(",", ":"))}


@dataclass(frozen=True)
class Request:
    """One container's ask: ``count`` vGPUs, each of ``mem`` MiB (or ``percent`` of a device's
    memory) and ``cores`` percent."""

    count: int
    mem: int
    percent: int
    cores: int


def requests(pod: Mapping[str, Any]) -> list[Request]:
    """Each regular container's request, in order (one with no GPU: count 0)."""
    out = []
    for c in pod["spec"].get("containers", ()):
        res = c.get("resources") or {}
        asked = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        mem, percent = int(asked.get(MEM, 0)), 101  # 101: no percentage asked
        if MEM_PERCENT in asked and int(asked[MEM_PERCENT]) > 0:
            percent = min(int(asked[MEM_PERCENT]), 100)
        if percent == 101 and mem == 0:
            percent = 100
        out.append(Request(int(asked.get(GPU, 0)), mem, percent, int(asked.get(CORES, 0))))
    return out


@dataclass
class Device:
    """One registered GPU and what HAMi has placed on it."""

    info: hami.VgpuDevice
    used: int = 0
    mem: int = 0
    cores: int = 0

    def fits(self, r: Request) -> bool:
        want = r.mem or self.info.devmem * r.percent // 100
        return not (self.used >= self.info.count or self.info.devmem - self.mem < want
                    or self.info.devcore - self.cores < r.cores
                    or (r.cores == 100 and self.used > 0)
                    or (r.cores == 0 and self.cores >= self.info.devcore))

    def take(self, r: Request) -> hami.Slice:
        want = r.mem or self.info.devmem * r.percent // 100
        self.used, self.mem, self.cores = self.used + 1, self.mem + want, self.cores + r.cores
        return hami.Slice(self.info.id, "NVIDIA", want, r.cores)

    @property
    def load(self) -> float:
        return self.cores / max(self.info.devcore, 1) + self.mem / max(self.info.devmem, 1)


@dataclass
class NodeDevices:
    name: str
    devices: list[Device] = field(default_factory=list)

    @classmethod
    def of(cls, node: Mapping[str, Any], placed: Iterable[Mapping[str, Any]]) -> NodeDevices:
        register = (node["metadata"].get("annotations") or {}).get(hami.NODE_REGISTER)
        devices = {d.id: Device(d) for d in hami.node_devices(register)}
        for pod in placed:
            for s in hami.slices(pod["metadata"].get("annotations") or {}):
                if s.uuid in devices:
                    d = devices[s.uuid]
                    d.used, d.mem, d.cores = d.used + 1, d.mem + s.mem_mib, d.cores + s.cores
        return cls(node["metadata"]["name"], list(devices.values()))

    @property
    def load(self) -> float:
        return sum(d.load for d in self.devices)

    def place(self, asks: list[Request], policy: str) -> list[list[hami.Slice]] | None:
        """Each container's slices, every vGPU on its own device; None where one does not fit.
        Devices are taken most loaded first under ``binpack``, least under ``spread``."""
        out = []
        for r in asks:
            order = sorted(self.devices, key=lambda d: (-d.load if policy == "binpack"
                                                        else d.load))
            chosen = [d for d in order if d.fits(r)][: r.count]
            if len(chosen) < r.count:
                return None
            out.append([d.take(r) for d in chosen])
        return out


def encode(containers: list[list[hami.Slice]]) -> str:
    """EncodePodSingleDevice: every device ended by ``:``, every container by ``;``."""
    return "".join("".join(f"{s.uuid},{s.type},{s.mem_mib},{s.cores}:" for s in c) + ";"
                   for c in containers)


def placed_on(node: str, pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods HAMi has placed on ``node`` that still hold their devices."""
    return [p for p in pods
            if (p["metadata"].get("annotations") or {}).get(NODE) == node
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
