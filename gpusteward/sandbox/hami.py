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
* which device takes it (``Fit``, device.go; core/hami.py ``DeviceLoad.fits``, which
  gpusteward's queue enforcement uses too); devices by the pod's
  ``hami.io/gpu-scheduler-policy`` (``spread``, HAMi's default, or ``binpack``), nodes
  binpacked (HAMi's default node policy);
* the pod annotations its Filter writes (``hami.io/vgpu-node``, ``hami.io/vgpu-time``,
  ``hami.io/vgpu-devices-to-allocate`` and ``-allocated``, core/hami.py's encoding).

Not reproduced: HAMi's mutating webhook (it sets ``schedulerName: hami-scheduler`` and, from
2.7, ``gpucores: 100`` on a pod asking neither memory nor cores; sandbox pods name the
scheduler themselves), NUMA and card-type filters, MIG, quotas.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusteward.core import hami
from gpusteward.core.hami import CORES, GPU, MEM, MEM_PERCENT
from gpusteward.sandbox.simgpu import SimGpu, model_name_for_product

NODE = "hami.io/vgpu-node"
TIME = "hami.io/vgpu-time"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
SCHEDULER_NAME = hami.SCHEDULER


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


def requests(pod: Mapping[str, Any]) -> list[hami.Ask]:
    """Each regular container's ask, in order (one with no GPU: 0 vGPUs)."""
    out = []
    for c in pod["spec"].get("containers", ()):
        res = c.get("resources") or {}
        asked = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        percent = int(asked[MEM_PERCENT]) if MEM_PERCENT in asked else None
        out.append(hami.Ask.of(int(asked.get(GPU, 0)), int(asked.get(MEM, 0)), percent,
                               int(asked.get(CORES, 0))))
    return out


@dataclass
class NodeDevices:
    name: str
    devices: list[hami.DeviceLoad]

    @classmethod
    def of(cls, node: Mapping[str, Any], placed: Iterable[Mapping[str, Any]]) -> NodeDevices:
        register = (node["metadata"].get("annotations") or {}).get(hami.NODE_REGISTER)
        slices = [s for pod in placed for s in hami.slices(pod["metadata"].get("annotations")
                                                             or {})]
        return cls(node["metadata"]["name"],
                   list(hami.loads(hami.node_devices(register), slices).values()))

    @property
    def load(self) -> float:
        return sum(d.load for d in self.devices)

    def place(self, asks: list[hami.Ask], policy: str) -> list[list[hami.Slice]] | None:
        return hami.place(self.devices, asks, binpack=policy == "binpack")


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
