"""What the scheduler needs to know about one node right now: card, allocation, live load, health.

Built once per node whenever its objects or its telemetry change (never per request), from the
node, the GPU pods bound to it and its GPU readings.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from gpusteward.core import hami
from gpusteward.core.attribution import held_only
from gpusteward.core.health import Source, node_faults
from gpusteward.core.model import GpuReading, Node, Pod
from gpusteward.core.policy import Health
from gpusteward.core.sharing import replicas


class NodeState(msgspec.Struct, frozen=True):
    node: Node
    tier: str | None
    allocated: int
    # Mean GPU utilization 0..1 with burst correction; None when telemetry is missing or stale.
    util: float | None
    # GPUs unusable for new work; None when health is unknown (missing or stale telemetry).
    unhealthy_free: int | None
    # GPUs with a fault, held by a pod or not; None when health is unknown.
    faulty: int | None = None
    health_reason: str = ""
    # GPUs of pods the extender expects here that the watch has not shown bound yet.
    inflight: int = 0
    # GPUs reserved here for a waiting pod (core/reclaim/reserve.py): not free for another.
    reserved: int = 0
    # On a HAMi node, each registered GPU's (slots, MiB, cores) taken by the bound pods.
    vgpu_used: tuple[tuple[int, int, int], ...] = ()

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def free(self) -> int:
        return max(0, self.node.gpus - self.allocated - self.reserved)

    @property
    def healthy_free(self) -> int:
        """Free GPUs new work may take: not faulty, not withheld by a DRA device taint."""
        return max(0, self.free - (self.unhealthy_free or 0) - len(self.node.withheld))

    @property
    def telemetry_known(self) -> bool:
        return self.util is not None

    def device_loads(self) -> list[hami.DeviceLoad]:
        """The HAMi node's GPUs as they stand, fresh objects a fit may change."""
        return [hami.DeviceLoad(d, *used) for d, used in zip(self.node.vgpus, self.vgpu_used,
                                                             strict=True)]


def build_node_state(
    node: Node,
    tier: str | None,
    pods: Iterable[Pod],
    readings: tuple[GpuReading, ...],
    health: Health,
    now: float,
    stale_after: float,
    inflight: int = 0,
    warmup: float = 0.0,
    reserved: int = 0,
) -> NodeState:
    """inflight: GPUs of pods just placed here whose binding the watch has not delivered.

    reserved: GPUs held here for a waiting pod; taken, for every other pod, and soon busy.

    warmup: a pod bound this recently counts as fully busy even where a sample covers it.
    """
    bound = [p for p in pods if not p.deleting and p.phase not in ("Succeeded", "Failed")]
    allocated = sum(p.gpus for p in bound)
    used = _vgpu_used(node, bound)
    fresh = held_only((r for r in readings if now - r.sampled_at <= stale_after),
                      {p.key for p in bound if p.gpus > 0})
    quarantined = [f for f in node_faults(node, health) if f.source != Source.DEVICE_PLUGIN]
    if quarantined:  # the node's own object says its GPUs failed: none takes new work
        reason = "; ".join(str(f) for f in quarantined)
        return NodeState(node, tier, allocated, None, max(0, node.gpus - allocated),
                         node.gpus // replicas(node), reason, inflight, reserved, used)
    if not fresh:
        return NodeState(node, tier, allocated, None, None, inflight=inflight, reserved=reserved,
                         vgpu_used=used)
    young_after = min(min(r.sampled_at for r in fresh), now - warmup)
    young = [p for p in bound if p.bound_at is not None and p.bound_at > young_after]
    shares = replicas(node)
    faulty, unhealthy_free, reason = _faults(fresh, health, shares)
    util = _burst_util(fresh, node.gpus / shares, young, (inflight + reserved) / shares, shares)
    return NodeState(node, tier, allocated, util, unhealthy_free, faulty, reason, inflight,
                     reserved, used)


def _vgpu_used(node: Node, bound: list[Pod]) -> tuple[tuple[int, int, int], ...]:
    if not node.vgpus:
        return ()
    loads = hami.loads(node.vgpus, (s for p in bound for s in hami.slices(p.annotations)))
    return tuple((loads[d.id].slots, loads[d.id].mem, loads[d.id].cores) for d in node.vgpus)


def _burst_util(readings: tuple[GpuReading, ...], gpus: float, young: list[Pod],
                inflight: float, shares: int) -> float | None:
    """Mean utilization, counting the GPUs of young and in-flight pods as fully busy.

    Per reported GPU: a time-sliced GPU (`shares` replicas) is one reading and one GPU, so
    `gpus` and `inflight` come in GPUs and a young pod counts its replicas' share.

    Young pods were bound after the sample, or so recently that their GPUs still read idle while
    they pull images and load: every pod of a burst would otherwise see the same idle node. Their
    own readings are left out so that no GPU counts twice.

    A GPU without a utilization reading (e.g. MIG without GR_ENGINE_ACTIVE) adds nothing; if no
    GPU has one the load is unknown.
    """
    utils = [r for r in readings if r.util is not None]
    if not utils:
        return None
    young_keys = {p.key for p in young}
    measured = sum(r.util or 0.0 for r in utils if r.pod not in young_keys)
    total = max(gpus, len(readings), 1)
    return min(1.0, (measured + sum(p.gpus for p in young) / shares + inflight) / total)


def _faults(readings: tuple[GpuReading, ...], health: Health,
            shares: int) -> tuple[int, int, str]:
    """(faulty GPUs, free slots they take away, reasons).

    A faulty GPU takes all its `shares` slots (time-slicing replicas) away, less the one the
    exporter attributes to a pod, which is already counted as allocated. Other pods sharing that
    GPU are not visible in its one series, so this may take away too much, never too little.
    """
    reasons = []
    free = 0
    for r in readings:
        why = gpu_fault(r, health)
        if why:
            reasons.append(f"gpu {r.gpu}: {why}")
            free += shares - (r.pod is not None)
    return len(reasons), free, "; ".join(reasons)


def gpu_fault(r: GpuReading, health: Health) -> str:
    if r.xid and r.xid not in health.ignored_xids:
        return f"XID {r.xid}"
    if r.temp_c is not None and r.temp_c > health.max_temperature_c:
        return f"{r.temp_c:.0f}°C over {health.max_temperature_c:.0f}°C"
    return ""
