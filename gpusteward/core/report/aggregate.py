"""The fleet report: per-pod usage summed into groups, totals and timelines (pure).

    allocated  physical GPUs held by bound pods now
    used       ... of pods whose GPUs were busy in the window (peak >= idle threshold)
    idle       ... of pods whose GPUs stayed below the threshold, with enough samples
    unknown    ... of pods without enough samples (never counted as idle or busy)
    faulty     ... of pods on GPUs a health source calls faulty (core/health.py), and, in the
               card and node groups and the totals, faulty GPUs no pod holds: the free GPUs
               of a quarantined node, and the devices the device plugin reports unhealthy
    free       allocatable - allocated - faulty free GPUs (card and node groups, the totals)
GPU-hours come from the per-slot samples (usage.py); idle cost is idle GPU-hours times the
card tier's `costPerGpuHour` where the policy gives one.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping

from gpusteward.core.health import Source, node_faults
from gpusteward.core.policy import Policy
from gpusteward.core.report.facts import UNKNOWN_CARD, pod_usages
from gpusteward.core.report.model import (
    DIMENSIONS,
    FaultyPod,
    GroupRow,
    PodUsage,
    Report,
    ReportInput,
    TimePoint,
    UsageState,
    Window,
)
from gpusteward.core.report.sections import queue, queue_groups, quotas, top_idle
from gpusteward.core.sharing import node_physical_gpus, physical, pod_share

KEYS: Mapping[str, Callable[[PodUsage], str]] = {
    "team": lambda u: u.team,
    "card": lambda u: u.card,
    "node": lambda u: u.node,
    "namespace": lambda u: u.namespace,
    "class": lambda u: u.cls,
}
TIMELINE_DIMENSIONS = ("team", "card")


def build_report(inp: ReportInput, policy: Policy, by: str = "team", top: int = 10) -> Report:
    if by not in DIMENSIONS:
        raise ValueError(f"--by must be one of {', '.join(DIMENSIONS)}, not {by!r}")
    usages = pod_usages(inp, policy)
    spare = faulty_spare(inp, policy)
    capacity = _capacity(inp, by)
    snap = inp.snapshot
    ok = snap.telemetry_ok and inp.range_ok
    problem = "; ".join(p for p in (snap.telemetry_problem, inp.range_problem) if p)
    waiting = queue(snap, policy)
    return Report(
        window=inp.window, by=by, telemetry_ok=ok, telemetry_problem=problem,
        groups=groups(usages, by, capacity, _by_group(inp, by, spare)),
        totals=row("total", usages, _fleet(inp), _total(spare.values())),
        top_idle=top_idle(usages, snap, policy, top), queue=waiting,
        queue_groups=queue_groups(waiting), quotas=quotas(usages, snap, policy),
        timelines={d: timeline(usages, d, inp.window) for d in TIMELINE_DIMENSIONS},
        faulty=faulty_pods(usages))


Spare = tuple[float, float]  # faulty GPUs no pod holds: (of the allocatable, beyond it)


def faulty_spare(inp: ReportInput, policy: Policy) -> dict[str, Spare]:
    """Node -> physical GPUs no pod holds that a health source calls faulty: every free GPU of
    a node quarantined by a pipeline's condition, annotation or taint (allocatable, so not
    free), its DRA devices withheld by a taint that ``health.deviceTaints`` lists (allocatable
    too), and the unhealthy devices the kubelet keeps out of allocatable (capacity -
    allocatable)."""
    snap = inp.snapshot
    held: dict[str, float] = defaultdict(float)
    for p in snap.pods:
        if p.node is not None:
            held[p.node] += pod_share(p, snap.nodes.get(p.node))
    out = {}
    for node in snap.nodes.values():
        faults = node_faults(node, policy.health)
        tainted = Counter(w.resource for w in node.withheld
                          if w.taint.key in policy.health.device_taints)
        if not faults and not tainted:
            continue
        quarantined = any(f.source != Source.DEVICE_PLUGIN for f in faults)
        free = (max(0.0, node_physical_gpus(node) - held[node.name]) if quarantined
                else physical(tainted, 0, node))
        lost = {n: c - node.resources.get(n, 0) for n, c in node.capacity.items()}
        out[node.name] = (free, physical({n: c for n, c in lost.items() if c > 0}, 0, node))
    return out


def _total(spares: Iterable[Spare]) -> Spare:
    free, beyond = 0.0, 0.0
    for f, b in spares:
        free, beyond = free + f, beyond + b
    return free, beyond


def _by_group(inp: ReportInput, by: str, spare: Mapping[str, Spare]) -> dict[str, Spare]:
    if by not in ("card", "node"):
        return {}
    out: dict[str, list[Spare]] = defaultdict(list)
    for name, gpus in spare.items():
        node = inp.snapshot.nodes[name]
        out[name if by == "node" else node.product or UNKNOWN_CARD].append(gpus)
    return {group: _total(s) for group, s in out.items()}


def faulty_pods(usages: Iterable[PodUsage]) -> tuple[FaultyPod, ...]:
    found = [FaultyPod(u.namespace, u.name, u.team, u.node, u.gpus, u.fault)
             for u in usages if u.state == UsageState.FAULTY]
    return tuple(sorted(found, key=lambda f: (-f.gpus, f.namespace, f.pod)))


def _capacity(inp: ReportInput, by: str) -> dict[str, float]:
    """Allocatable physical GPUs per group, for the dimensions that have hardware."""
    out: dict[str, float] = defaultdict(float)
    for node in inp.snapshot.nodes.values():
        if node.gpus <= 0:
            continue
        if by == "card":
            out[node.product or UNKNOWN_CARD] += node_physical_gpus(node)
        elif by == "node":
            out[node.name] += node_physical_gpus(node)
    return dict(out)


def _fleet(inp: ReportInput) -> float:
    return sum(node_physical_gpus(n) for n in inp.snapshot.nodes.values() if n.gpus > 0)


def groups(usages: list[PodUsage], by: str, capacity: Mapping[str, float],
           spare: Mapping[str, Spare] | None = None) -> tuple[GroupRow, ...]:
    members: dict[str, list[PodUsage]] = defaultdict(list)
    for u in usages:
        members[KEYS[by](u)].append(u)
    names = sorted(set(members) | set(capacity))
    spare = spare or {}
    return tuple(row(n, members.get(n, []), capacity.get(n), spare.get(n, (0.0, 0.0)))
                 for n in names)


def row(name: str, usages: Iterable[PodUsage], allocatable: float | None,
        spare: Spare = (0.0, 0.0)) -> GroupRow:
    """``spare``: the group's faulty GPUs no pod holds (faulty_spare), never free."""
    usages = list(usages)
    now = [u for u in usages if u.state != UsageState.GONE]
    allocated = _sum(u.gpus for u in now)
    used = _sum(u.gpus for u in now if u.state == UsageState.BUSY)
    measured = sum(u.measured_seconds for u in usages)
    costs = [u.idle_cost for u in usages if u.idle_cost is not None]
    return GroupRow(
        name=name, allocatable=allocatable, allocated=allocated, used=used,
        idle=_sum(u.gpus for u in now if u.state == UsageState.IDLE),
        unknown=_sum(u.gpus for u in now if u.state == UsageState.UNKNOWN),
        faulty=_sum(u.gpus for u in now if u.state == UsageState.FAULTY) + sum(spare),
        free=None if allocatable is None else max(0.0, allocatable - allocated - spare[0]),
        allocation_ratio=_ratio(allocated, allocatable), active_ratio=_ratio(used, allocated),
        mean_util_percent=(100 * sum(u.util_seconds for u in usages) / measured
                           if measured else None),
        allocated_gpu_hours=_sum(u.allocated_hours for u in usages),
        idle_gpu_hours=_sum(u.idle_hours for u in usages),
        unknown_gpu_hours=_sum(u.unknown_hours for u in usages),
        idle_cost=_sum(costs) if costs else None)


def timeline(usages: list[PodUsage], dimension: str,
             window: Window) -> dict[str, tuple[TimePoint, ...]]:
    """Allocated vs used GPUs per slot, for each group of one dimension."""
    sums: dict[str, dict[float, list[float]]] = defaultdict(dict)
    for u in usages:
        slots = sums[KEYS[dimension](u)]
        for t, (allocated, used) in u.timeline.items():
            acc = slots.setdefault(t, [0.0, 0.0])
            acc[0] += allocated
            acc[1] += used
    return {name: tuple(TimePoint(t, *slots.get(t, (0.0, 0.0))) for t in window.slots)
            for name, slots in sorted(sums.items())}


def _sum(values: Iterable[float]) -> float:
    return float(sum(values))


def _ratio(part: float, whole: float | None) -> float | None:
    return part / whole if whole else None
