"""The shared view of the fleet: nodes, GPU pods and GPU telemetry, as immutable values.

Adapters build these from the API server's watch cache and from Prometheus; the pure decisions
(scoring, filtering, reclaim) only ever read them.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from gpusteward.core import hami
from gpusteward.core.hami import VgpuDevice

TEAM_LABEL = "gpusteward.io/team"
CLASS_KEY = "gpusteward.io/class"
# On a pending pod: the GPUs a queue reclaim freed for it, as JSON (core/reclaim/reserve.py);
# the extender's fleet indexes the pods that carry it (core/fleet.py).
RESERVED = "gpusteward.io/reserved"


class Taint(msgspec.Struct, frozen=True):
    key: str
    value: str = ""
    effect: str = ""

    def __str__(self) -> str:  # as kubectl writes it
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


class WithheldDevice(msgspec.Struct, frozen=True):
    """A DRA device no claim holds that a NoSchedule or NoExecute device taint keeps from new
    claims (KEP-5055): the scheduler allocates it to no pod that does not tolerate the taint."""

    resource: str  # the device-plugin unit it stands for (core/dra.DraDevice.resource)
    taint: Taint


class Toleration(msgspec.Struct, frozen=True):
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


class NodeCondition(msgspec.Struct, frozen=True):
    """A node condition as its writer set it (kubelet, node-problem-detector, a health
    pipeline such as NVSentinel)."""

    type: str
    status: str = ""
    reason: str = ""
    message: str = ""


class Node(msgspec.Struct, frozen=True):
    name: str
    product: str | None  # the GFD nvidia.com/gpu.product label
    gpus: int  # GPU allocatable, summed over the policy's resource names
    labels: Mapping[str, str] = msgspec.field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    # The allocatable behind `gpus`, per resource name (MIG profiles and shared GPUs weigh
    # differently: core/sharing.py); empty means all `gpus` are of `nvidia.com/gpu`.
    resources: Mapping[str, int] = msgspec.field(default_factory=dict)
    # The capacity of the same resources: the device plugin's devices, healthy or not (the
    # kubelet leaves an unhealthy device out of allocatable only: core/health.py).
    capacity: Mapping[str, int] = msgspec.field(default_factory=dict)
    conditions: tuple[NodeCondition, ...] = ()
    # The keys of its annotations only: a health pipeline's quarantine annotation holds a whole
    # event, and 5,000 nodes' annotations were many megabytes the extender never reads.
    annotation_keys: frozenset[str] = frozenset()
    # Its DRA devices that count in `gpus` but take no new claim (core/drafleet.py).
    withheld: tuple[WithheldDevice, ...] = ()
    # Its GPUs as HAMi registers them, where HAMi splits them into vGPUs (core/hami.py).
    vgpus: tuple[VgpuDevice, ...] = ()


class OwnerRef(msgspec.Struct, frozen=True):
    kind: str
    name: str
    uid: str = ""
    controller: bool = False
    api_version: str = msgspec.field(default="", name="apiVersion")


class Pod(msgspec.Struct, frozen=True):
    namespace: str
    name: str
    uid: str
    gpus: int
    node: str | None = None
    phase: str = "Pending"
    priority: int = 0
    priority_class: str = ""
    preemption_policy: str = "PreemptLowerPriority"
    labels: Mapping[str, str] = msgspec.field(default_factory=dict)
    annotations: Mapping[str, str] = msgspec.field(default_factory=dict)
    owners: tuple[OwnerRef, ...] = ()
    created_at: float = 0.0
    # Wall-clock time the pod was first seen bound to its node (burst correction).
    bound_at: float | None = None
    # status.startTime: when its kubelet took the pod (the start of its run).
    started_at: float | None = None
    deleting: bool = False
    node_selector: Mapping[str, str] = msgspec.field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    unschedulable_since: float | None = None
    mirror: bool = False
    # The request behind `gpus`, per resource name; empty means all of `nvidia.com/gpu`.
    resources: Mapping[str, int] = msgspec.field(default_factory=dict)
    # Set by the scheduler's preemption: the node it frees for this pending pod.
    nominated_node: str | None = None
    # The scheduler is preempting this pod (DisruptionTarget, reason PreemptionByScheduler).
    preempted: bool = False
    # Its spec.resourceClaims entries: DRA devices may be behind them (core/dra.py).
    claims: tuple[str, ...] = ()
    # spec.schedulingGroup.podGroupName: the Workload API's PodGroup it is one of (gangs.py).
    pod_group: str | None = None
    # 1.35's spec.workloadRef instead: ``workload/group[/replica]`` (gangs.py).
    workload_group: str | None = None
    # A waiting pod HAMi places (its scheduler named, or a slice asked): each container's
    # nvidia.com/gpu ask with its cores and memory, what it needs of a HAMi node's GPUs
    # (core/reclaim/room.py); it fits no other node.
    vgpu_asks: tuple[hami.Ask, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def controller(self) -> OwnerRef | None:
        return next((o for o in self.owners if o.controller), None)

    @property
    def run_start(self) -> float:
        """When its run began: the kubelet's startTime, else its binding, else its creation."""
        return self.started_at or self.bound_at or self.created_at


class Reservation(msgspec.Struct, frozen=True):
    """A pending pod's RESERVED annotation: GPUs a queue reclaim freed for it on ``node``,
    until ``until`` (RFC 3339), for the GPUs and priority it had (core/reclaim/reserve.py)."""

    node: str
    gpus: int
    priority: int
    until: str


_reservation = msgspec.json.Decoder(Reservation)


def reservation_of(pod: Pod) -> Reservation | None:
    """The pod's reservation as written; None when it has none or it does not decode (its
    time is checked by core/reclaim/reserve.read)."""
    text = pod.annotations.get(RESERVED)
    if text is None:
        return None
    try:
        return _reservation.decode(text)
    except msgspec.DecodeError:
        return None


class GpuReading(msgspec.Struct, frozen=True):
    """One GPU's latest telemetry, each value with the time it was sampled."""

    node: str
    gpu: str  # index as dcgm-exporter labels it
    util: float | None = None  # 0..1
    temp_c: float | None = None
    xid: int = 0  # last XID within the health window, 0 when none
    fb_used_mib: float | None = None
    sampled_at: float = 0.0
    pod: str | None = None  # "namespace/name" of the pod the exporter attributes it to


class Telemetry(msgspec.Struct, frozen=True):
    """All GPU readings from one refresh, grouped by node."""

    nodes: Mapping[str, tuple[GpuReading, ...]] = msgspec.field(default_factory=dict)
    fetched_at: float = 0.0

    def for_node(self, node: str) -> tuple[GpuReading, ...]:
        return self.nodes.get(node, ())


def team_of(pod: Pod, namespace_labels: Mapping[str, str] | None = None) -> str:
    """Pod label, else namespace label, else the namespace name."""
    if TEAM_LABEL in pod.labels:
        return pod.labels[TEAM_LABEL]
    if namespace_labels and TEAM_LABEL in namespace_labels:
        return namespace_labels[TEAM_LABEL]
    return pod.namespace


def class_of(labels: Mapping[str, str], annotations: Mapping[str, str], default: str) -> str:
    """The workload class: pod label, else pod annotation, else the policy default."""
    return labels.get(CLASS_KEY) or annotations.get(CLASS_KEY) or default
