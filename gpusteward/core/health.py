"""GPU health from the sources clusters record faults in: one verdict per pod's GPUs.

A pod on a faulty GPU reads 0 % because its GPU is broken, not because its work is idle: the
reclaimer never judges it idle (core/reclaim/decide.py), the report counts its GPUs apart.
Each source is optional; one that is absent says nothing, and any source that says "faulty"
wins over one that says "healthy".

Node sources (every GPU of the node is suspect: they do not say which GPU failed):
- a taint whose key the policy lists (``health.nodeTaints``), as a health pipeline such as
  NVIDIA NVSentinel's fault-quarantine sets it while it cordons the node;
- a condition the policy lists (``health.nodeConditions``) with status True, as NVSentinel's
  health monitors (and node-problem-detector setups) write them;
- an annotation the policy lists (``health.nodeAnnotations``), as NVSentinel's fault-quarantine
  records the event it quarantined the node for;
- GPUs allocatable below capacity: the device plugin reported devices Unhealthy, and the
  kubelet keeps them in capacity but leaves them out of allocatable.
The device sources name one GPU and the pod holding it:
- a DRA device taint whose key the policy lists (``health.deviceTaints``) with effect
  NoSchedule or NoExecute, as NVIDIA's DRA driver taints a device after a critical XID;
- telemetry (adapters/faults.py): an XID counted within the window; a DCGM health watch
  failed (DCGM_EXP_GPU_HEALTH_STATUS) or a row remap failed (DCGM_FI_DEV_ROW_REMAP_FAILURE).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

import msgspec

from gpusteward.core.dra import WITHHOLDING_EFFECTS, DraDevice
from gpusteward.core.model import Node, Pod
from gpusteward.core.policy import Health

# A condition's reason is free text its writer chose; it goes into an annotation and an Event.
REASON_CHARS = 128


class Source(StrEnum):
    """Where a fault was read: shown after its reason, in Events, the report and filter reasons."""

    NODE_TAINT = "node-taint"
    NODE_CONDITION = "node-condition"
    NODE_ANNOTATION = "node-annotation"
    DEVICE_PLUGIN = "device-plugin"  # allocatable below capacity
    DEVICE_TAINT = "device-taint"  # a DRA device's
    XID = "xid"
    DCGM_HEALTH = "dcgm-health"  # DCGM's health watches, its row remapping


# A pipeline's verdict names what failed; the device plugin's count only that something did.
_RANK = {s: i for i, s in enumerate((Source.XID, Source.DCGM_HEALTH, Source.DEVICE_TAINT,
                                      Source.NODE_CONDITION,
                                      Source.NODE_ANNOTATION, Source.NODE_TAINT,
                                      Source.DEVICE_PLUGIN))}


class Fault(msgspec.Struct, frozen=True):
    source: Source
    reason: str

    def __str__(self) -> str:
        return f"{self.reason} ({self.source})"


def node_faults(node: Node, health: Health) -> tuple[Fault, ...]:
    """What the node's own object says is wrong with its GPUs, the most telling first."""
    out = [Fault(Source.NODE_TAINT, f"node {node.name} tainted {t}")
           for t in node.taints if t.key in health.node_taints]
    out += [Fault(Source.NODE_CONDITION, f"node {node.name} condition {c.type}"
                  + (f" ({c.reason[:REASON_CHARS]})" if c.reason else ""))
            for c in node.conditions if c.status == "True" and c.type in health.node_conditions]
    out += [Fault(Source.NODE_ANNOTATION, f"node {node.name} annotated {key}")
            for key in sorted(node.annotation_keys & set(health.node_annotations))]
    for name, total in sorted(node.capacity.items()):
        usable = node.resources.get(name, 0)
        if usable < total:
            out.append(Fault(Source.DEVICE_PLUGIN,
                             f"node {node.name}: {total - usable} of {total} {name} unhealthy "
                             f"(allocatable {usable} < capacity {total}); which is not published"))
    return tuple(sorted(out, key=lambda f: (_RANK[f.source], f.reason)))


def device_fault(device: DraDevice, health: Health) -> Fault | None:
    """The fault a DRA device's taints declare: a listed key that withholds the device."""
    for t in device.taints:
        if t.key in health.device_taints and t.effect in WITHHOLDING_EFFECTS:
            return Fault(Source.DEVICE_TAINT, f"device {device.pool}/{device.name} tainted {t}")
    return None


def pod_faults(pods: Iterable[Pod], nodes: Mapping[str, Node], health: Health,
               *gpu_faults: Mapping[str, Fault]) -> dict[str, Fault]:
    """Bound pod key -> the fault its GPUs are under: its own GPUs' (each of ``gpu_faults``
    keyed by pod, the more telling first: telemetry, then DRA device taints) before its
    node's. Pods on healthy GPUs are absent."""
    by_node = {name: node_faults(node, health) for name, node in nodes.items()}
    out = {}
    for p in pods:
        if p.node is None:
            continue
        own = next((f for faults in gpu_faults if (f := faults.get(p.key)) is not None), None)
        on_node = by_node.get(p.node, ())
        if own is not None or on_node:
            out[p.key] = own if own is not None else on_node[0]
    return out
