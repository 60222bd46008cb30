"""Typed decoding of the few Node and Pod fields gpusteward uses, straight from API JSON.

A 10,000-pod list decodes ~60x faster into these structs than into kubernetes-asyncio models
(DESIGN.md), and the same structs decode the Pod in every extender request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

import msgspec

from gpusteward.core.cards import PRODUCT_LABEL
from gpusteward.core.model import Node, OwnerRef, Pod, Taint, Toleration


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


class PodSpec(msgspec.Struct, rename="camel"):
    containers: list[Container] = msgspec.field(default_factory=list)
    init_containers: list[Container] | None = None
    node_name: str | None = None
    priority: int | None = None
    priority_class_name: str | None = None
    preemption_policy: str | None = None
    node_selector: dict[str, str] | None = None
    tolerations: list[Toleration] | None = None


class Condition(msgspec.Struct, rename="camel"):
    type: str = ""
    status: str = ""
    reason: str | None = None
    last_transition_time: str | None = None


class PodStatus(msgspec.Struct, rename="camel"):
    phase: str | None = None
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


class WireNode(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: NodeSpec = msgspec.field(default_factory=NodeSpec)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_SUFFIX = {"k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


class QuantityError(ValueError):
    pass


def parse_count(value: str | int | float) -> int:
    """A resource quantity as a whole count (GPUs are never fractional)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        for suffix, factor in _SUFFIX.items():
            if text.endswith(suffix) and text[: -len(suffix)].isdigit():
                return int(text[: -len(suffix)]) * factor
        if text.isdigit():
            return int(text)
    raise QuantityError(f"{value!r} is not a whole-number quantity")


def _sum_resources(amounts: dict[str, str | int | float] | None, names: Sequence[str]) -> int:
    if not amounts:
        return 0
    return sum(parse_count(amounts[n]) for n in names if n in amounts)


def _container_gpus(c: Container, names: Sequence[str]) -> int:
    if c.resources is None:
        return 0
    # Extended resources must have requests == limits; an API-server-defaulted pod has both.
    return max(
        _sum_resources(c.resources.requests, names), _sum_resources(c.resources.limits, names)
    )


def pod_gpus(spec: PodSpec, names: Sequence[str]) -> int:
    """Effective GPU request: the larger of the sum over containers and any one init container."""
    regular = sum(_container_gpus(c, names) for c in spec.containers)
    init = max((_container_gpus(c, names) for c in spec.init_containers or ()), default=0)
    return max(regular, init)


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def to_node(w: WireNode, names: Sequence[str]) -> Node:
    labels = w.metadata.labels or {}
    return Node(
        name=w.metadata.name,
        product=labels.get(PRODUCT_LABEL),
        gpus=_sum_resources(w.status.allocatable, names),
        labels=labels,
        taints=tuple(w.spec.taints or ()),
        unschedulable=w.spec.unschedulable,
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
    annotations = m.annotations or {}
    if bound_at is None and s.node_name:
        bound_at = _scheduled_at(conditions)
    return Pod(
        namespace=m.namespace,
        name=m.name,
        uid=m.uid,
        gpus=pod_gpus(s, names),
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
        deleting=m.deletion_timestamp is not None,
        node_selector=s.node_selector or {},
        tolerations=tuple(s.tolerations or ()),
        unschedulable_since=_unschedulable_since(conditions),
        mirror=MIRROR_ANNOTATION in annotations,
        nominated_node=(w.status.nominated_node_name if w.status else None) or None,
        preempted=_preempted(conditions),
    )
