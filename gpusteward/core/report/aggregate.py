"""The fleet report: per-pod usage summed into groups, totals and timelines (pure).

    allocated  physical GPUs held by bound pods now
    used       ... of pods whose GPUs were busy in the window (peak >= idle threshold)
    idle       ... of pods whose GPUs stayed below the threshold, with enough samples
    unknown    ... of pods without enough samples (never counted as idle or busy)
    free       allocatable - allocated (card and node groups, and the totals)
GPU-hours come from the per-slot samples (usage.py); idle cost is idle GPU-hours times the
card tier's `costPerGpuHour` where the policy gives one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from gpusteward.core.policy import Policy
from gpusteward.core.report.facts import UNKNOWN_CARD, pod_usages
from gpusteward.core.report.model import (
    DIMENSIONS,
    GroupRow,
    PodUsage,
    Report,
    ReportInput,
    TimePoint,
    UsageState,
    Window,
)
from gpusteward.core.report.sections import queue, queue_groups, quotas, top_idle
from gpusteward.core.sharing import node_physical_gpus

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
    capacity = _capacity(inp, by)
    snap = inp.snapshot
    ok = snap.telemetry_ok and inp.range_ok
    problem = "; ".join(p for p in (snap.telemetry_problem, inp.range_problem) if p)
    waiting = queue(snap, policy)
    return Report(
        window=inp.window, by=by, telemetry_ok=ok, telemetry_problem=problem,
        groups=groups(usages, by, capacity), totals=row("total", usages, _fleet(inp)),
        top_idle=top_idle(usages, snap, policy, top), queue=waiting,
        queue_groups=queue_groups(waiting), quotas=quotas(usages, snap, policy),
        timelines={d: timeline(usages, d, inp.window) for d in TIMELINE_DIMENSIONS})


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


def groups(usages: list[PodUsage], by: str, capacity: Mapping[str, float]) -> tuple[GroupRow, ...]:
    members: dict[str, list[PodUsage]] = defaultdict(list)
    for u in usages:
        members[KEYS[by](u)].append(u)
    names = sorted(set(members) | set(capacity))
    return tuple(row(n, members.get(n, []), capacity.get(n)) for n in names)


def row(name: str, usages: Iterable[PodUsage], allocatable: float | None) -> GroupRow:
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
        free=None if allocatable is None else max(0.0, allocatable - allocated),
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
