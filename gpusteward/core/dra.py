"""GPUs allocated through Dynamic Resource Allocation, as gpusteward counts them: a driver's
devices, the claims that ask for and hold them, the classes that name the driver.

DRA devices join the existing units: a whole GPU is one `nvidia.com/gpu`, a MIG device one
`nvidia.com/mig-<profile>` (core/sharing.py prices it by its slices), and the device's
productName becomes the product in GFD's spelling, so card patterns match either. The API's
shapes and their decoding are core/drawire.py; the join into the fleet's Nodes and Pods is
core/drafleet.py.
"""

from __future__ import annotations

import re

import msgspec

from gpusteward.core.model import Taint
from gpusteward.core.sharing import FULL_GPU, MIG_RESOURCE_PREFIX

DEFAULT_DRIVER = "gpu.nvidia.com"
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
# A device taint's effects (KEP-5055, resource.k8s.io/v1 DeviceTaint): NoSchedule keeps new
# claims off the device, NoExecute also evicts the pods using it, None only informs (NVIDIA's
# DRA driver taints a device `gpu.nvidia.com/xid=<code>` with None for application XIDs).
WITHHOLDING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


class DraDevice(msgspec.Struct, frozen=True):
    node: str
    pool: str
    name: str
    uuid: str = ""
    product: str | None = None  # GFD spelling of productName
    profile: str | None = None  # MIG profile, for a MIG device
    taints: tuple[Taint, ...] = ()  # spec.devices[].taints of its ResourceSlice

    @property
    def withheld_by(self) -> Taint | None:
        """The first taint that keeps new claims off the device, if any."""
        return next((t for t in self.taints if t.effect in WITHHOLDING_EFFECTS), None)

    @property
    def resource(self) -> str:
        """The device-plugin resource this device stands for (core/sharing.py units)."""
        return f"{MIG_RESOURCE_PREFIX}{self.profile}" if self.profile else FULL_GPU


class DraClaim(msgspec.Struct, frozen=True):
    key: str  # namespace/name
    pods: tuple[str, ...]  # uids: the controlling pod and the pods it is reserved for
    asked: tuple[tuple[str, int], ...]  # (device class, count) per request
    devices: tuple[tuple[str, str, str], ...]  # allocated (driver, pool, device)
    # Made by the scheduler for the pod's DRA-served extended resources (KEP-5004).
    extended: bool = False


class DraClass(msgspec.Struct, frozen=True):
    name: str
    gpu: bool  # its selectors name the driver
    extended_resource: str | None = None


def gfd_product(product_name: str) -> str:
    """NVML's productName as GFD writes the `nvidia.com/gpu.product` label: spaces become
    dashes, other characters a label value cannot hold are dropped (k8s-device-plugin
    `internal/lm/resource.go`, getProductName/sanitise): "NVIDIA H100 80GB HBM3" ->
    "NVIDIA-H100-80GB-HBM3"."""
    return _LABEL_UNSAFE.sub("", "-".join(product_name.split()))[:63].strip("-_.")
