"""The recorded history a what-if replay steps through, on the reclaimer's own time grid.

Step ``i`` stands for the reclaim cycle at ``start + i * step``; a GPU's per-step figures cover
``(t - step, t]``, so consecutive steps partition time and a window of ``k`` steps is exactly the
``[window]`` range the live reclaimer's PromQL reads at ``t`` (adapters/snapshot.py).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence

import msgspec

from gpusteward.core.model import Node, Pod
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.model import Owner

NO_SAMPLE = -1.0  # a step's peak where the GPU has no sample at all (readings are 0-100)
BROKEN = float("inf")  # a step's peak where a sample was NaN, infinite or negative


class Grid(msgspec.Struct, frozen=True):
    start: float  # the first cycle's time (Unix seconds)
    step: float  # the reclaimer's interval
    steps: int

    def time(self, i: int) -> float:
        return self.start + i * self.step

    @property
    def end(self) -> float:
        return self.time(self.steps - 1)


def xid_steps(policy: Policy, step: float) -> int:
    """The cycles an XID keeps its GPU faulty: those within health.xidWindow of it."""
    return max(1, math.ceil(float(policy.health.xid_window) / step))


class Span(msgspec.Struct, frozen=True):
    """Steps ``first``..``last`` (inclusive) in which the pod was recorded in one state."""

    first: int
    last: int

    def holds(self, i: int) -> bool:
        return self.first <= i <= self.last


class GpuUse(msgspec.Struct, frozen=True):
    """One of the pod's GPUs: per step, its peak utilization % and its number of samples."""

    peaks: Sequence[float]
    samples: Sequence[float]


class Figures:
    """One series' figures from step ``first`` on, as they arrive: peaks and sample counts
    per step (the history reader folds range-query answers into these)."""

    def __init__(self, first: int):
        self.first = first
        self.peaks = array("d")
        self.samples = array("d")

    @property
    def end(self) -> int:
        return self.first + max(len(self.peaks), len(self.samples))

    def put(self, slot: int, at: int, values: array) -> None:
        """Figures from step ``at`` on (chunks arrive in time order; a gap stays unsampled)."""
        target, gap = (self.peaks, NO_SAMPLE) if slot == 0 else (self.samples, 0.0)
        if at < self.first:  # an earlier point than the first seen: shift the start back
            self.peaks[:0] = array("d", [NO_SAMPLE]) * (self.first - at)
            self.samples[:0] = array("d", bytes(8 * (self.first - at)))
            self.first = at
        at -= self.first
        if at > len(target):
            target.extend(array("d", [gap]) * (at - len(target)))
        target[at:at + len(values)] = values

    def framed(self, first: int, end: int) -> GpuUse:
        """Its figures over steps ``first``..``end - 1`` (unsampled outside its own)."""
        def pad(values: array, gap: float) -> array:
            before = array("d", [gap]) * (self.first - first)
            after = array("d", [gap]) * (end - self.first - len(values))
            return before + values + after

        return GpuUse(pad(self.peaks, NO_SAMPLE), pad(self.samples, 0.0))

    @classmethod
    def merged(cls, pieces: list[Figures]) -> Figures:
        """One GPU's series over time (an exporter restart renames them): highest peak and
        the samples of all, per step."""
        if len(pieces) == 1:
            return pieces[0]
        first, end = min(p.first for p in pieces), max(p.end for p in pieces)
        framed = [p.framed(first, end) for p in pieces]
        out = cls(first)
        out.peaks = array("d", map(max, *(f.peaks for f in framed)))
        out.samples = array("d", map(sum, zip(*(f.samples for f in framed), strict=True)))
        return out


class PodRecord(msgspec.Struct, frozen=True):
    """A GPU pod as recorded: what it was (``pod``: node, GPUs, priority, labels, owners; its
    phase and marks are the replay's), where it ran and waited, and its GPUs' use."""

    pod: Pod
    card: str = ""  # its GPUs' model name, "" when no series named one
    running: Span | None = None  # Running on ``pod.node``
    pending: Span | None = None  # Pending, not bound to a node
    gpus: tuple[GpuUse, ...] = ()
    offset: int = 0  # the step of its GPUs' first figures (they cover only its own time)
    # (step, reason): an XID the policy does not ignore rose on one of its GPUs while it ran
    faults: tuple[tuple[int, str], ...] = ()

    @property
    def last(self) -> int:
        spans = [s.last for s in (self.running, self.pending) if s is not None]
        return max(spans) if spans else -1


class History(msgspec.Struct, frozen=True):
    grid: Grid
    pods: tuple[PodRecord, ...]
    nodes: Mapping[str, Node]
    owners: Mapping[str, Owner]  # pod uid -> the workload the reclaimer would act on
    scrape_interval: float  # the policy's: a window expects window / this many samples
    # Per step: whether the reclaimer would have had fresh telemetry (any GPU sample within the
    # policy's staleAfter); without it the cycle halts, as the live one does.
    telemetry: Sequence[bool] = ()
    tiers: Mapping[str, str | None] = msgspec.field(default_factory=dict)  # node -> card tier
    # The longest grace an evicted pod may have taken to go (the policy's evictionGrace or the
    # API server's default 30 s): how long after a reclaim its record may still run.
    eviction_grace: float = 30.0
    # Plain statements of what the record lacked, and how that bounds the replay's figures.
    gaps: tuple[str, ...] = ()
