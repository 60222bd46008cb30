"""HAMi's vGPU slices: which device a pod's slice is on and how much of it the slice holds (pure).

HAMi (github:Project-HAMi/HAMi, read at v2.10.0 4707fb0, v2.8.0 and v2.7.0) splits each GPU into
``deviceSplitCount`` vGPUs (allocatable ``nvidia.com/gpu`` is GPUs x split, chart default 10) and
records what it placed where:

* the node's ``hami.io/node-nvidia-register``: its devices. From v2.8.0 a JSON list of
  DeviceInfo (``pkg/device/devices.go`` ``MarshalNodeDevices``; ``id`` the UUID, ``count`` the
  split, ``devmem`` MiB, ``devcore`` percent, ``type`` the NVML name prefixed ``NVIDIA-`` unless
  it starts with ``NVIDIA``; every field ``omitempty``). Up to v2.7 ``EncodeNodeDevices``'s
  ``id,count,devmem,devcore,type,numa,health[,index,mode]`` per device, each ended by ``:``.
* the pod's ``hami.io/vgpu-devices-allocated``, written by HAMi's Filter and never changed: per
  container (init containers first, one entry each, empty for a container without a GPU), per
  device ``UUID,NVIDIA,Usedmem,Usedcores`` (MiB, percent), each device ended by ``:`` and each
  container by ``;`` (``EncodeContainerDevices``, ``EncodePodSingleDevice``): a pod with one
  GPU container and one other reads ``GPU-8dcd...,NVIDIA,1024,30:;;``.

A slice's share of its GPU: its cores (``nvidia.com/gpucores``, percent of the SMs), else its
memory's fraction of the device's. A container asking neither gets the whole memory
(``GenerateResourceRequests`` sets gpumem-percentage 100) and, from v2.7.0, cores 100 (the
webhook's ``defaultExclusiveCoreIfNeeded``): the whole device either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import msgspec

ALLOCATED = "hami.io/vgpu-devices-allocated"
# What a container asks HAMi for (pkg/device/nvidia/device.go GenerateResourceRequests).
GPU, MEM, MEM_PERCENT, CORES = ("nvidia.com/gpu", "nvidia.com/gpumem",
                                "nvidia.com/gpumem-percentage", "nvidia.com/gpucores")
SLICE_RESOURCES = frozenset({MEM, MEM_PERCENT, CORES})
# HAMi's scheduler profile (its chart's schedulerName), which its webhook gives every pod that
# asks nvidia.com/gpu or a slice of one (pkg/scheduler/webhook.go).
SCHEDULER = "hami-scheduler"
NODE_REGISTER = "hami.io/node-nvidia-register"
_CONTAINERS, _DEVICES, _FIELDS = ";", ":", ","
T = TypeVar("T")


class VgpuDevice(msgspec.Struct, frozen=True):
    """One GPU of a node as HAMi registers it (the fields gpusteward reads)."""

    id: str = ""  # the GPU's UUID
    count: int = 1  # vGPUs it is split into
    devmem: int = 0  # MiB
    devcore: int = 100  # percent
    type: str = ""


class Slice(NamedTuple):
    """One device a container was given: its UUID, memory (MiB) and cores (percent)."""

    uuid: str
    type: str
    mem_mib: int
    cores: int


_register = msgspec.json.Decoder(list[VgpuDevice])


def node_devices(text: str | None) -> tuple[VgpuDevice, ...]:
    """A node's registered devices, in either encoding; none where the annotation is absent or
    does not decode (then its allocatable counts as plain GPUs, as without HAMi)."""
    if not text:
        return ()
    if text.lstrip().startswith("["):
        try:
            return tuple(d for d in _register.decode(text) if d.id)
        except msgspec.DecodeError:
            return ()
    return _records(text, 5, lambda f: VgpuDevice(f[0], int(f[1]), int(f[2]), int(f[3]), f[4]))


def product(devices: tuple[VgpuDevice, ...]) -> str | None:
    """The node's card as GPU Feature Discovery would label it (``nvidia.com/gpu.product``: the
    NVML name, spaces as dashes), ``-SHARED`` where HAMi splits it: for a HAMi node without
    GFD. None without devices or a type."""
    kind = next((d.type for d in devices if d.type), "")
    if not kind:
        return None
    # HAMi prefixes ``NVIDIA-`` to an NVML name without NVIDIA in front (``Tesla T4``); GFD
    # does not (``Tesla-T4``, ``NVIDIA-H100-80GB-HBM3``).
    name = "-".join(kind.removeprefix("NVIDIA-").split())
    return f"{name}-SHARED" if split(devices) > 1 else name


def slices(annotations: Mapping[str, str]) -> tuple[Slice, ...]:
    """Every device slice HAMi gave the pod's containers; () for a pod HAMi did not place or
    whose annotation does not parse (it then counts by its resources, as any pod)."""
    text = annotations.get(ALLOCATED)
    if not text:
        return ()
    return _records(text.replace(_CONTAINERS, _DEVICES), 4,
                    lambda f: Slice(f[0], f[1], int(f[2]), int(f[3])))


def _records(text: str, least: int, make: Callable[[list[str]], T]) -> tuple[T, ...]:
    """``make`` over each ``:``-ended record of ``,``-separated fields (at least ``least``, the
    first not empty); nothing at all where one does not parse."""
    out = []
    for record in text.split(_DEVICES):
        if not record:
            continue
        fields = record.split(_FIELDS)
        if len(fields) < least or not fields[0]:
            return ()
        try:
            out.append(make(fields))
        except ValueError:
            return ()
    return tuple(out)


def share(piece: Slice, device: VgpuDevice | None) -> float:
    """The slice's part of its GPU, 0-1: its cores, else its memory's fraction of the device's;
    the whole GPU where neither is known."""
    if piece.cores > 0:
        return min(1.0, piece.cores / (device.devcore if device and device.devcore > 0 else 100))
    if device is not None and device.devmem > 0 and piece.mem_mib > 0:
        return min(1.0, piece.mem_mib / device.devmem)
    return 1.0


def split(devices: tuple[VgpuDevice, ...]) -> int:
    """vGPUs per GPU on a node (allocatable is devices x split); 1 without HAMi devices."""
    if not devices:
        return 1
    return max(1, round(sum(d.count for d in devices) / len(devices)))


class Ask(NamedTuple):
    """One container's request as HAMi reads it: ``vgpus``, each on its own device, of
    ``mem_mib`` MiB, or else ``percent`` of the device's memory (101: none asked), and
    ``cores`` percent of its SMs."""

    vgpus: int
    mem_mib: int = 0
    percent: int = 101
    cores: int = 0

    @classmethod
    def of(cls, vgpus: int, mem_mib: int, percent: int | None, cores: int) -> Ask:
        """GenerateResourceRequests: a percentage above 100 is 100, one of 0 or less none;
        neither memory nor percentage (and no defaultMemory, the chart's 0) is 100 %."""
        pct = 101 if percent is None or percent <= 0 else min(percent, 100)
        if pct == 101 and mem_mib == 0:
            pct = 100
        return cls(vgpus, mem_mib, pct, cores)

    def mem_on(self, device: VgpuDevice) -> int:
        return self.mem_mib or device.devmem * self.percent // 100


@dataclass
class DeviceLoad:
    """One registered GPU and the slices placed on it."""

    device: VgpuDevice
    slots: int = 0
    mem: int = 0
    cores: int = 0

    def fits(self, ask: Ask) -> bool:
        """HAMi's Fit (device.go): a free vGPU slot, the memory and cores left, a 100-core ask
        only on an unused GPU, a 0-core ask not on a GPU whose cores are all taken."""
        d = self.device
        return not (self.slots >= d.count or d.devmem - self.mem < ask.mem_on(d)
                    or d.devcore - self.cores < ask.cores
                    or (ask.cores == 100 and self.slots > 0)
                    or (ask.cores == 0 and self.cores >= d.devcore))

    def add(self, piece: Slice, sign: int = 1) -> None:
        self.slots += sign
        self.mem += sign * piece.mem_mib
        self.cores += sign * piece.cores

    def take(self, ask: Ask) -> Slice:
        piece = Slice(self.device.id, "NVIDIA", ask.mem_on(self.device), ask.cores)
        self.add(piece)
        return piece

    @property
    def load(self) -> float:
        d = self.device
        return self.cores / max(d.devcore, 1) + self.mem / max(d.devmem, 1)


def loads(devices: Iterable[VgpuDevice], placed: Iterable[Slice]) -> dict[str, DeviceLoad]:
    """A node's devices with these slices on them (slices of other GPUs ignored)."""
    out = {d.id: DeviceLoad(d) for d in devices}
    for piece in placed:
        if piece.uuid in out:
            out[piece.uuid].add(piece)
    return out


def place(devices: Iterable[DeviceLoad], asks: Iterable[Ask],
          binpack: bool = False) -> list[list[Slice]] | None:
    """Each ask's slices, every vGPU of it on its own device, taken from ``devices`` (their
    loads change); None where one does not fit. Devices by load: least first (HAMi's default
    ``spread``), most first with ``binpack``."""
    pool = list(devices)
    out = []
    for ask in asks:
        order = sorted(pool, key=lambda d: -d.load if binpack else d.load)
        chosen = [d for d in order if d.fits(ask)][: ask.vgpus]
        if len(chosen) < ask.vgpus:
            return None
        out.append([d.take(ask) for d in chosen])
    return out
