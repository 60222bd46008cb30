"""One pod's GPU usage over the report window, from per-slot utilization samples.

A slot (t - step, t] is, for a pod:
    busy     any of its GPUs peaked at or above the idle threshold in the slot;
    idle     every one of its GPUs has a sample in the slot, all below the threshold;
    unknown  otherwise (no sample, or samples for only some of its GPUs).
Only the part of a slot after the pod started counts (pods that started inside the window).
The pod's state over the window follows the reclaimer's evidence rule: unknown without samples
for all its GPUs or below the minimum coverage, else busy if the peak reaches the threshold, else
idle. Pods that left the cluster inside the window ("gone") count for GPU-hours only, from the
slots their GPUs have samples in.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from gpusteward.core.reclaim.model import Evidence, Rule
from gpusteward.core.reclaim.rules import is_reading, judge, peak_of
from gpusteward.core.report.model import PodUsage, Series, UsageState, Window
from gpusteward.core.times import HOUR


class PodFacts(msgspec.Struct, frozen=True):
    """What the report knows of a pod before looking at its samples."""

    namespace: str
    name: str
    team: str
    card: str
    node: str
    cls: str
    owner: str
    gpus: float  # physical GPUs
    expected_series: int  # distinct GPUs whose samples make its evidence complete
    start: float | None  # when it got its GPUs; None: gone, count only slots with samples
    threshold: float  # idle threshold, percent
    min_coverage: float
    price: float | None  # $ per GPU-hour
    fault: str = ""  # its GPUs are faulty now (core/health.py): why


class _Slot(msgspec.Struct):
    peak: float
    total: float
    gpus: int


def slot_values(series: Iterable[Series]) -> dict[float, _Slot]:
    """slot end -> peak and sum of utilization over the pod's GPUs, and how many have a sample."""
    out: dict[float, _Slot] = {}
    for s in series:
        for t, value in s.points:
            slot = out.get(t)
            if slot is None:
                out[t] = _Slot(value, value, 1)
            else:
                slot.peak, slot.total, slot.gpus = peak_of((slot.peak, value)), \
                    slot.total + value, slot.gpus + 1
    return out


class _Tally(msgspec.Struct):
    allocated: float = 0.0  # seconds
    idle: float = 0.0
    unknown: float = 0.0
    util: float = 0.0  # utilization (0..1) x seconds
    measured: float = 0.0
    slots: int = 0
    covered: int = 0
    peak: float | None = None
    idle_run_from: float | None = None


def pod_usage(facts: PodFacts, series: list[Series], window: Window) -> PodUsage:
    values = slot_values(series)
    tally = _Tally()
    timeline: dict[float, tuple[float, float]] = {}
    for t in window.slots:
        lo = max(t - window.step, window.start if facts.start is None
                 else max(window.start, facts.start))
        slot = values.get(t)
        if t <= lo or (facts.start is None and slot is None):
            continue
        used = _count(tally, facts, slot, lo, t - lo)
        timeline[t] = (facts.gpus, facts.gpus if used else 0.0)
    gpus_seen = len({(s.node, s.gpu) for s in series if s.points})
    state, why = _state(facts, tally, gpus_seen, window.end - window.start)
    if facts.fault and state != UsageState.GONE:
        # A broken GPU reads 0 %: its hours are no one's waste, and no evidence of idleness.
        state, why = UsageState.FAULTY, f"on a faulty GPU: {facts.fault}"
        tally.unknown, tally.idle, tally.idle_run_from = tally.unknown + tally.idle, 0.0, None
    idle_hours = facts.gpus * tally.idle / HOUR
    return PodUsage(
        namespace=facts.namespace, name=facts.name, team=facts.team, card=facts.card,
        node=facts.node, cls=facts.cls, owner=facts.owner, gpus=facts.gpus, state=state, why=why,
        peak_percent=tally.peak, coverage=tally.covered / tally.slots if tally.slots else 0.0,
        allocated_hours=facts.gpus * tally.allocated / HOUR, idle_hours=idle_hours,
        unknown_hours=facts.gpus * tally.unknown / HOUR,
        util_seconds=facts.gpus * tally.util, measured_seconds=facts.gpus * tally.measured,
        idle_since=tally.idle_run_from,  # start of the idle slots that end the window
        idle_cost=None if facts.price is None else idle_hours * facts.price,
        timeline=timeline, fault=facts.fault if state == UsageState.FAULTY else "")


def _count(tally: _Tally, facts: PodFacts, slot: _Slot | None, lo: float, dt: float) -> bool:
    """Add one slot's seconds to the tally; True when the pod's GPUs were busy in it."""
    tally.allocated += dt
    tally.slots += 1
    if slot is not None:
        tally.peak = slot.peak if tally.peak is None else peak_of((tally.peak, slot.peak))
        if not is_reading(slot.peak):
            slot = None  # a broken reading (NaN, ±Inf, out of 0-100): unknown, never idle
    busy = slot is not None and slot.peak >= facts.threshold
    complete = slot is not None and slot.gpus >= facts.expected_series
    if busy or complete:
        assert slot is not None
        tally.covered += 1
        tally.measured += dt
        tally.util += slot.total / slot.gpus / 100 * dt
    if busy:
        tally.idle_run_from = None
    elif complete:
        tally.idle += dt
        if tally.idle_run_from is None:
            tally.idle_run_from = lo
    else:
        tally.unknown += dt
        tally.idle_run_from = None
    return busy


def _state(facts: PodFacts, tally: _Tally, gpus_seen: int,
           span: float) -> tuple[UsageState, str]:
    """The reclaimer's own rule, judged on the whole window."""
    if facts.start is None:
        return UsageState.GONE, "left the cluster inside the window"
    coverage = tally.covered / tally.slots if tally.slots else 0.0
    evidence = Evidence(window=span, peak_percent=tally.peak, coverage=coverage,
                        gpus_seen=gpus_seen)
    state, why = judge(evidence, Rule(facts.threshold, span, facts.min_coverage, grace=0.0),
                       facts.expected_series)
    return UsageState(state), why  # judge never answers protected
