"""What a replayed policy would have done: the events, and the figures the report shows."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from gpusteward.core.times import HOUR


class Warned(msgspec.Struct, frozen=True):
    pod: str  # namespace/name
    team: str
    gpus: int
    at: float
    reclaim_at: float


class Reclaimed(msgspec.Struct, frozen=True):
    """GPUs the policy would have taken back: from ``at`` until the pod's recorded end."""

    pod: str
    team: str
    card: str
    node: str
    gpus: int
    owner: str  # namespace/Kind/name
    how: str  # evict | suspend | scale, or "kept down": a later pod of a workload it stopped
    reason: str  # idle | over-quota | queue
    at: float
    until: float
    # The record ends, running, within a cycle and an eviction grace of the reclaim (a
    # reclaimer acting live took it, or it ended just then): freed until the window's end.
    to_window_end: bool = False

    @property
    def gpu_hours(self) -> float:
        return self.gpus * max(0.0, self.until - self.at) / HOUR


class Comeback(msgspec.Struct, frozen=True):
    """A false-positive risk: marked idle, then busy again before the reclaim deadline (or, if
    reclaimed, busy again in the record after the reclaim)."""

    pod: str
    team: str
    gpus: int
    idle_at: float
    back_at: float
    peak_percent: float
    reclaimed: bool


class Earlier(msgspec.Struct, frozen=True):
    """A pending GPU pod that freed GPUs would have let start before it did."""

    pod: str
    team: str
    gpus: int
    pending_from: float
    started_at: float
    could_start_at: float

    @property
    def earlier_s(self) -> float:
        return self.started_at - self.could_start_at


class Outcome(msgspec.Struct, frozen=True):
    policy: str  # its name (the file it came from)
    start: float
    end: float
    step: float
    warned: tuple[Warned, ...]
    reclaimed: tuple[Reclaimed, ...]
    comebacks: tuple[Comeback, ...]
    earlier: tuple[Earlier, ...]
    halted_steps: int  # cycles that would have halted for lack of telemetry
    gaps: tuple[str, ...]

    @property
    def gpu_hours(self) -> float:
        return sum(r.gpu_hours for r in self.reclaimed)

    def hours_by(self, axis: str) -> dict[str, float]:
        """GPU-hours freed per team or per card, largest first."""
        return _totals((getattr(r, axis) or "unknown", r.gpu_hours) for r in self.reclaimed)


def _totals(pairs: Iterable[tuple[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in pairs:
        out[key] = out.get(key, 0.0) + value
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))
