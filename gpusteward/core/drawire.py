"""The three resource.k8s.io/v1 kinds gpusteward reads, straight from API JSON, and what
core/dra.py makes of each:

* ResourceSlice: a driver's devices on a node. NVIDIA's DRA driver for GPUs (driver
  `gpu.nvidia.com`; NVIDIA/k8s-dra-driver-gpu `cmd/gpu-kubelet-plugin/deviceinfo.go`) gives
  every device the attributes `type` ("gpu" or "mig"), `uuid` and `productName` (NVML's name,
  with spaces), and a MIG device its `profile` too. A device's `taints` (KEP-5055, beta in
  1.36) are `{key, value, effect, timeAdded}`; with its NVMLDeviceHealthCheck gate on, the
  driver taints a GPU after a critical XID `gpu.nvidia.com/xid=<code>:NoSchedule`, after an
  application XID the same key with effect None (its tests/bats GPU health tests).
* DeviceClass: its CEL selectors name the driver; `extendedResourceName` (KEP-5004) lets a pod
  ask `nvidia.com/gpu` and be served by the class through a claim the scheduler makes.
* ResourceClaim: `spec.devices.requests` (what is asked), `status.allocation.devices.results`
  (the devices given), `status.reservedFor` (the pods using them). A claim made from a pod's
  ResourceClaimTemplate, or for its DRA-served extended resource, is controlled by the pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from gpusteward.core.dra import (
    EXTENDED_CLAIM_ANNOTATION,
    DraClaim,
    DraClass,
    DraDevice,
    gfd_product,
)
from gpusteward.core.kubewire import MAX_COUNT, Meta
from gpusteward.core.model import Taint


class Attribute(msgspec.Struct):
    string: str | None = None  # the ones read here are strings (int, bool, version unread)


class DeviceTaint(msgspec.Struct):
    key: str = ""
    value: str = ""
    effect: str = ""  # timeAdded unread


class WireDevice(msgspec.Struct):
    name: str = ""
    attributes: dict[str, Attribute] | None = None
    taints: list[DeviceTaint] | None = None


class SlicePool(msgspec.Struct):
    name: str = ""
    generation: int = 0


class SliceSpec(msgspec.Struct, rename="camel"):
    driver: str = ""
    node_name: str | None = None
    pool: SlicePool = msgspec.field(default_factory=SlicePool)
    devices: list[WireDevice] | None = None


class WireSlice(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: SliceSpec = msgspec.field(default_factory=SliceSpec)


class Cel(msgspec.Struct):
    expression: str = ""


class Selector(msgspec.Struct):
    cel: Cel | None = None


class ClassSpec(msgspec.Struct, rename="camel"):
    selectors: list[Selector] | None = None
    extended_resource_name: str | None = None


class WireClass(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: ClassSpec = msgspec.field(default_factory=ClassSpec)


class ExactRequest(msgspec.Struct, rename="camel"):
    device_class_name: str = ""
    allocation_mode: str = "ExactCount"
    count: int = 1


class DeviceRequest(msgspec.Struct):
    name: str = ""
    exactly: ExactRequest | None = None
    # firstAvailable: alternatives; the first one counts until allocation says which.
    firstAvailable: list[ExactRequest] | None = None  # wire name


class ClaimDevices(msgspec.Struct):
    requests: list[DeviceRequest] | None = None


class ClaimSpec(msgspec.Struct):
    devices: ClaimDevices = msgspec.field(default_factory=ClaimDevices)


class Result(msgspec.Struct):
    request: str = ""
    driver: str = ""
    pool: str = ""
    device: str = ""


class AllocatedDevices(msgspec.Struct):
    results: list[Result] | None = None


class Allocation(msgspec.Struct):
    devices: AllocatedDevices = msgspec.field(default_factory=AllocatedDevices)


class Consumer(msgspec.Struct):
    resource: str = ""
    name: str = ""
    uid: str = ""


class ClaimStatus(msgspec.Struct, rename="camel"):
    allocation: Allocation | None = None
    reserved_for: list[Consumer] | None = None


class WireClaim(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: ClaimSpec = msgspec.field(default_factory=ClaimSpec)
    status: ClaimStatus | None = None


def _string(attrs: Mapping[str, Attribute], name: str, driver: str) -> str | None:
    # Attribute names may be qualified by the driver's domain; the driver's own are not.
    a = attrs.get(name) or attrs.get(f"{driver}/{name}")
    return a.string if a is not None else None


def slice_devices(w: WireSlice, driver: str) -> tuple[DraDevice, ...]:
    """The driver's GPU and MIG devices in a node-local slice; other drivers' and devices of
    other types (vfio, IMEX channels) are not GPUs gpusteward counts."""
    if w.spec.driver != driver or not w.spec.node_name:
        return ()
    out = []
    for d in w.spec.devices or ():
        attrs = d.attributes or {}
        kind = _string(attrs, "type", driver)
        if kind not in ("gpu", "mig"):
            continue
        name = _string(attrs, "productName", driver)
        profile = _string(attrs, "profile", driver) if kind == "mig" else None
        out.append(DraDevice(node=w.spec.node_name, pool=w.spec.pool.name, name=d.name,
                             uuid=_string(attrs, "uuid", driver) or "",
                             product=gfd_product(name) if name else None, profile=profile,
                             taints=tuple(Taint(t.key, t.value, t.effect)
                                          for t in d.taints or () if t.key)))
    return tuple(out)


def to_class(w: WireClass, driver: str) -> DraClass:
    mentions = any(s.cel and (f"'{driver}'" in s.cel.expression
                              or f'"{driver}"' in s.cel.expression)
                   for s in w.spec.selectors or ())
    return DraClass(w.metadata.name, mentions, w.spec.extended_resource_name)


def _requests(spec: ClaimSpec) -> Iterable[ExactRequest]:
    for r in spec.devices.requests or ():
        if r.exactly is not None:
            yield r.exactly
        elif r.firstAvailable:
            yield r.firstAvailable[0]


def to_claim(w: WireClaim, driver: str) -> DraClaim:
    m = w.metadata
    pods = [o.uid for o in m.owner_references or () if o.kind == "Pod" and o.controller]
    status = w.status or ClaimStatus()
    pods += [c.uid for c in status.reserved_for or () if c.resource == "pods" and c.uid]
    asked = []
    for r in _requests(w.spec):
        # "All" asks for every matching device: its count is known only once allocated.
        count = min(max(r.count, 0), MAX_COUNT) if r.allocation_mode == "ExactCount" else 0
        asked.append((r.device_class_name, count))
    results = status.allocation.devices.results if status.allocation else None
    devices = tuple((r.driver, r.pool, r.device) for r in results or () if r.driver == driver)
    extended = (m.annotations or {}).get(EXTENDED_CLAIM_ANNOTATION) == "true"
    return DraClaim(key=f"{m.namespace}/{m.name}", pods=tuple(dict.fromkeys(pods)),
                    asked=tuple(asked), devices=devices, extended=extended)
