"""Typed decoding of the few Node and Pod fields gpusteward uses, straight from API JSON.

A 10,000-pod list decodes ~60x faster into these structs than into kubernetes-asyncio models
(docs/architecture.md, "Layers"), and the same structs decode the Pod in every extender request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from gpusteward.core import hami
from gpusteward.core.cards import PRODUCT_LABEL
from gpusteward.core.model import Node, NodeCondition, OwnerRef, Pod, Taint, Toleration
from gpusteward.core.times import parse_time


class Meta(msgspec.Struct, rename="camel"):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[OwnerRef] | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None


class Resources(msgspec.Struct):
    requests: dict[str, str | int | float] | None = None
    limits: dict[str, str | int | float] | None = None


class Container(msgspec.Struct):
    resources: Resources | None = None


class PodClaim(msgspec.Struct, rename="camel"):
    name: str = ""
    resource_claim_template_name: str | None = None


class SchedulingGroup(msgspec.Struct, rename="camel"):
    """spec.schedulingGroup (Kubernetes 1.36, GenericWorkload): the PodGroup the pod is one of
    (k8s.io/api core/v1 PodSchedulingGroup)."""

    pod_group_name: str | None = None


class WorkloadRef(msgspec.Struct, rename="camel"):
    """spec.workloadRef (Kubernetes 1.35, GenericWorkload alpha; replaced by schedulingGroup in
    1.36): the Workload and the pod group in it (k8s.io/api v0.35 core/v1 WorkloadReference)."""

    name: str = ""
    pod_group: str = ""
    pod_group_replica_key: str = ""

    def group(self) -> str | None:
        """``workload/group[/replica]``; None without a name."""
        if not self.name:
            return None
        return "/".join(p for p in (self.name, self.pod_group, self.pod_group_replica_key) if p)


class GangPolicy(msgspec.Struct, rename="camel"):
    min_count: int | None = None


class PodGroupPolicy(msgspec.Struct):
    gang: GangPolicy | None = None  # absent: the "basic" policy, pods placed one by one


class PodGroupSpec(msgspec.Struct, rename="camel"):
    scheduling_policy: PodGroupPolicy | None = None


class WirePodGroup(msgspec.Struct):
    """A Workload API PodGroup (Kubernetes 1.36, scheduling.k8s.io/v1alpha2; k8s.io/api
    v0.36.3 scheduling/v1alpha2 types.go: spec.schedulingPolicy.gang.minCount)."""

    metadata: Meta
    spec: PodGroupSpec | None = None

    @property
    def min_count(self) -> int | None:
        policy = self.spec.scheduling_policy if self.spec else None
        return policy.gang.min_count if policy and policy.gang else None


class PodSpec(msgspec.Struct, rename="camel"):
    containers: list[Container] = msgspec.field(default_factory=list)
    init_containers: list[Container] | None = None
    node_name: str | None = None
    priority: int | None = None
    priority_class_name: str | None = None
    preemption_policy: str | None = None
    node_selector: dict[str, str] | None = None
    tolerations: list[Toleration] | None = None
    resource_claims: list[PodClaim] | None = None
    scheduling_group: SchedulingGroup | None = None
    workload_ref: WorkloadRef | None = None
    scheduler_name: str | None = None


class Condition(msgspec.Struct, rename="camel"):
    """A pod's or a node's condition."""

    type: str = ""
    status: str = ""
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None


class PodStatus(msgspec.Struct, rename="camel"):
    phase: str | None = None
    start_time: str | None = None
    conditions: list[Condition] | None = None
    nominated_node_name: str | None = None


class WirePod(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus | None = None


class NodeSpec(msgspec.Struct):
    taints: list[Taint] | None = None
    unschedulable: bool = False


class NodeStatus(msgspec.Struct):
    allocatable: dict[str, str | int | float] | None = None
    capacity: dict[str, str | int | float] | None = None
    conditions: list[Condition] | None = None


class WireNode(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: NodeSpec = msgspec.field(default_factory=NodeSpec)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_SUFFIX = {"k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


class QuantityError(ValueError):
    pass


# No node has more; a bound keeps a hostile quantity from turning into a huge int.
MAX_COUNT = 1 << 20


def parse_count(value: str | int | float) -> int:
    """A resource quantity as a whole count (GPUs are never fractional, never negative).

    Only ASCII digits count: ``str.isdigit`` also accepts "²" and "٣", which ``int`` refuses or
    reads as another number. A fraction such as 2.9 is an error, not 2."""
    # Not adapters.connectflags.whole_number: the API server's quantities carry suffixes (2k),
    # padding and JSON numbers, which a command-line flag refuses.
    count: int | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, int) or value.is_integer():
            count = int(value)
    elif isinstance(value, str):
        text = value.strip()
        for suffix, factor in _SUFFIX.items():
            digits = text[: -len(suffix)]
            if text.endswith(suffix) and digits.isascii() and digits.isdigit():
                count = int(digits) * factor
                break
        else:
            if text.isascii() and text.isdigit():
                count = int(text)
    if count is None or not 0 <= count <= MAX_COUNT:
        raise QuantityError(f"{value!r} is not a whole-number quantity between 0 and {MAX_COUNT}")
    return count


def _container_request(c: Container, names: Sequence[str]) -> dict[str, int]:
    if c.resources is None:
        return {}
    # Extended resources must have requests == limits; an API-server-defaulted pod has both.
    requests, limits = c.resources.requests or {}, c.resources.limits or {}
    out = {}
    for n in names:
        if n in requests or n in limits:
            out[n] = max(parse_count(requests[n]) if n in requests else 0,
                         parse_count(limits[n]) if n in limits else 0)
    return out


def vgpu_asks(spec: PodSpec) -> tuple[hami.Ask, ...]:
    """Each container's nvidia.com/gpu ask with HAMi's cores and memory (core/hami.Ask), for a
    pod HAMi places (hami.wants); none where a quantity does not parse (the pod then needs
    whole GPUs, core/reclaim/room.py)."""
    if spec.scheduler_name != hami.SCHEDULER and not any(
            c.resources and hami.SLICE_RESOURCES & {*(c.resources.requests or ()),
                                                     *(c.resources.limits or ())}
            for c in spec.containers):
        return ()
    out = []
    for c in spec.containers:
        if c.resources is None:
            continue
        asked = {**(c.resources.requests or {}), **(c.resources.limits or {})}
        if hami.GPU not in asked:
            continue
        try:
            count = parse_count(asked[hami.GPU])
            percent = parse_count(asked[hami.MEM_PERCENT]) if hami.MEM_PERCENT in asked else None
            out.append(hami.Ask.of(count, parse_count(asked.get(hami.MEM, 0)), percent,
                                   parse_count(asked.get(hami.CORES, 0))))
        except QuantityError:
            return ()
    return tuple(a for a in out if a.vgpus)


def pod_request(spec: PodSpec, names: Sequence[str]) -> dict[str, int]:
    """Effective request per GPU resource: the containers' sum, or one init container's request
    where it is larger. One pass over the containers: a 10,000-pod LIST decodes through here."""
    total: dict[str, int] = {}
    for c in spec.containers:
        for n, count in _container_request(c, names).items():
            total[n] = total.get(n, 0) + count
    for c in spec.init_containers or ():
        init = _container_request(c, names)
        if sum(init.values()) > sum(total.values()):
            total = init
    return {n: count for n, count in total.items() if count}


def _allocatable(amounts: dict[str, str | int | float] | None,
                 names: Sequence[str]) -> dict[str, int]:
    return {n: parse_count(amounts[n]) for n in names if amounts and n in amounts}


def to_node(w: WireNode, names: Sequence[str]) -> Node:
    labels = w.metadata.labels or {}
    annotations = w.metadata.annotations or {}
    resources = _allocatable(w.status.allocatable, names)
    vgpus = hami.node_devices(annotations.get(hami.NODE_REGISTER))
    return Node(
        name=w.metadata.name,
        product=labels.get(PRODUCT_LABEL) or hami.product(vgpus),
        gpus=sum(resources.values()),
        labels=labels,
        taints=tuple(w.spec.taints or ()),
        unschedulable=w.spec.unschedulable,
        resources=resources,
        capacity=_allocatable(w.status.capacity, names),
        conditions=tuple(NodeCondition(c.type, c.status, c.reason or "", c.message or "")
                         for c in w.status.conditions or ()),
        annotation_keys=frozenset(annotations),
        vgpus=vgpus,
    )


def _unschedulable_since(conditions: Iterable[Condition]) -> float | None:
    for c in conditions:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return parse_time(c.last_transition_time)
    return None


def _scheduled_at(conditions: Iterable[Condition]) -> float | None:
    for c in conditions:
        if c.type == "PodScheduled" and c.status == "True":
            return parse_time(c.last_transition_time)
    return None


def _preempted(conditions: Iterable[Condition]) -> bool:
    """The scheduler marks a victim DisruptionTarget/PreemptionByScheduler before deleting it."""
    return any(c.type == "DisruptionTarget" and c.status == "True"
               and c.reason == "PreemptionByScheduler" for c in conditions)


def to_pod(w: WirePod, names: Sequence[str], bound_at: float | None = None) -> Pod:
    """bound_at: when the caller first saw the binding; else the PodScheduled condition's time."""
    m, s = w.metadata, w.spec
    conditions = (w.status.conditions if w.status else None) or ()
    started = w.status.start_time if w.status else None
    annotations = m.annotations or {}
    if bound_at is None and s.node_name:
        bound_at = _scheduled_at(conditions)
    resources = pod_request(s, names)
    return Pod(
        namespace=m.namespace,
        name=m.name,
        uid=m.uid,
        gpus=sum(resources.values()),
        resources=resources,
        node=s.node_name or None,
        phase=(w.status.phase if w.status else None) or "Pending",
        priority=s.priority or 0,
        priority_class=s.priority_class_name or "",
        preemption_policy=s.preemption_policy or "PreemptLowerPriority",
        labels=m.labels or {},
        annotations=annotations,
        owners=tuple(m.owner_references or ()),
        created_at=parse_time(m.creation_timestamp) or 0.0,
        bound_at=bound_at,
        started_at=parse_time(started),
        deleting=m.deletion_timestamp is not None,
        node_selector=s.node_selector or {},
        tolerations=tuple(s.tolerations or ()),
        unschedulable_since=_unschedulable_since(conditions),
        mirror=MIRROR_ANNOTATION in annotations,
        nominated_node=(w.status.nominated_node_name if w.status else None) or None,
        preempted=_preempted(conditions),
        claims=tuple(c.name for c in s.resource_claims or ()),
        pod_group=(s.scheduling_group.pod_group_name if s.scheduling_group else None) or None,
        workload_group=s.workload_ref.group() if s.workload_ref else None,
        vgpu_asks=vgpu_asks(s) if s.node_name is None else (),
    )
