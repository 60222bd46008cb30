"""A DRA pool's GPUs as NVIDIA's DRA driver for GPUs publishes them: one ResourceSlice per node
and the driver's DeviceClasses, so the real kube-scheduler allocates claims on kwok nodes.

Shapes follow NVIDIA/k8s-dra-driver-gpu: `cmd/gpu-kubelet-plugin/deviceinfo.go` (device names
`gpu-<minor>` and `gpu-<minor>-mig-<gi profile id>-<start>-<size>`; attributes `type` "gpu" or
"mig", `uuid`, `productName` (NVML's name, with spaces), `brand`, `architecture`,
`cudaComputeCapability`, `driverVersion`, `cudaDriverVersion`, `pcieBusID`; MIG devices add
`profile` and `parentUUID` and carry their parent's productName; capacity `memory` in bytes) and
its Helm chart's DeviceClasses `gpu.nvidia.com` / `mig.nvidia.com`, which select the driver's
devices by `type`. The kubelet plugin publishes one pool per node, named for the node, with
`spec.nodeName` set (k8s.io/dynamic-resource-allocation `resourceslice` controller).

Only the control plane is needed to allocate: the scheduler's DynamicResources plugin reads the
slices and writes `status.allocation`; kwok then runs the pod without calling a kubelet plugin.
v1.36 needs no feature gate for it: DynamicResourceAllocation is GA, DRAExtendedResource
(`extendedResourceName`) and DRADeviceTaints are beta and on by default; only
DRADeviceTaintRules (DeviceTaintRule objects) is beta and off (`pkg/features/kube_features.go`).
UUIDs are the DCGM simulator's (``SimGpu.uuid``), so telemetry joins by UUID.
"""

from __future__ import annotations

from typing import Any

from gpusteward.adapters.dra import RESOURCE_API
from gpusteward.core.dra import DEFAULT_DRIVER, EXTENDED_CLAIM_ANNOTATION
from gpusteward.sandbox.fleet import Fleet, Pool, family
from gpusteward.sandbox.simgpu import SimGpu, model_name_for_product

DRIVER = DEFAULT_DRIVER
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
# KEP-5004 (DRAExtendedResource, beta and on by default in 1.36): pods asking this extended
# resource on a node that does not offer it as allocatable are served by the class instead.
EXTENDED_RESOURCE = "nvidia.com/gpu"
# deviceinfo.go reads these from NVML; one plausible driver for the whole sandbox.
_DRIVER_VERSION, _CUDA_DRIVER_VERSION = "580.95.5", "13.0.0"
_ARCHITECTURE = {"hopper": "Hopper", "ampere": "Ampere", "ada-lovelace": "Ada Lovelace",
                 "turing": "Turing", "blackwell": "Blackwell"}
_COMPUTE_CAPABILITY = {"Hopper": "9.0.0", "Ampere": "8.0.0", "Ada Lovelace": "8.9.0",
                       "Turing": "7.5.0", "Blackwell": "10.0.0"}


def _string(value: str) -> dict[str, str]:
    return {"string": value}


def _version(value: str) -> dict[str, str]:
    return {"version": value}


def gpu_device(node: str, index: int, product: str, memory_mib: int) -> dict[str, Any]:
    """One whole GPU as the driver's GpuInfo.GetDevice publishes it; ``product`` in GFD's
    spelling, published in NVML's."""
    gpu = SimGpu(node=node, index=index, model_name=model_name_for_product(product))
    architecture = _ARCHITECTURE.get(family(product), "Unknown")
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "type": _string("gpu"),
            "uuid": _string(gpu.uuid),
            "productName": _string(gpu.model_name),
            "brand": _string("Nvidia"),
            "architecture": _string(architecture),
            "cudaComputeCapability": _version(_COMPUTE_CAPABILITY.get(architecture, "8.0.0")),
            "driverVersion": _version(_DRIVER_VERSION),
            "cudaDriverVersion": _version(_CUDA_DRIVER_VERSION),
            "pcieBusID": _string(gpu.pci_bus_id.lower()),
        },
        "capacity": {"memory": {"value": f"{memory_mib}Mi"}},
    }


def resource_slice(node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    """The node's one slice: pool named for the node, generation 1, the whole pool in it."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices},
    }


def device_classes() -> list[dict[str, Any]]:
    """The driver's classes; the GPU class also serves `nvidia.com/gpu` (KEP-5004)."""
    def cls(name: str, kind: str, extra: dict[str, Any]) -> dict[str, Any]:
        expression = (f"device.driver == '{DRIVER}' && "
                      f"device.attributes['{DRIVER}'].type == '{kind}'")
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}], **extra}}
    return [cls(GPU_CLASS, "gpu", {"extendedResourceName": EXTENDED_RESOURCE}),
            cls(MIG_CLASS, "mig", {})]


def fleet_slices(fleet: Fleet) -> list[dict[str, Any]]:
    """One ResourceSlice per node of the fleet's DRA pools."""
    return [resource_slice(node, [gpu_device(node, i, pool.product, pool.memory_mi_b)
                                  for i in range(pool.gpus)])
            for pool in fleet.pools if pool.dra for node in pool.node_names()]


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def pool_slice_names(pool: Pool) -> list[str]:
    return [slice_name(node) for node in pool.node_names()] if pool.dra else []


__all__ = ["EXTENDED_CLAIM_ANNOTATION", "RESOURCE_API", "device_classes", "fleet_slices",
           "pool_slice_names"]
