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

from collections.abc import Callable, Mapping
from typing import NamedTuple, TypeVar

import msgspec

ALLOCATED = "hami.io/vgpu-devices-allocated"
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
