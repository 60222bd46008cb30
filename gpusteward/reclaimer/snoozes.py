"""The reclaimer's snooze records: read when this replica starts leading, handed to each cycle's
pure decision (core/reclaim/snooze.py), and the records it changes kept — first written to the
ConfigMap, then announced with an Event on the object carrying the snooze. Recording first
means a failover never announces one sighting twice; a failed write announces nothing and the
next cycle sees the value anew."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from gpusteward.core.reclaim.model import Closed, SnoozeOutcome, SnoozeRecord
from gpusteward.core.reclaim.snooze import kept

log = logging.getLogger("gpusteward.reclaimer")

EVENT = {SnoozeOutcome.SNOOZED: "GPUReclaimSnoozed", SnoozeOutcome.CAPPED: "GPUReclaimSnoozed"}
IGNORED, ENDED = "GPUReclaimSnoozeIgnored", "GPUReclaimSnoozeEnded"


class Store(Protocol):
    async def load(self) -> list[SnoozeRecord]: ...

    async def save(self, items: list[SnoozeRecord]) -> None: ...


class Events(Protocol):
    async def emit(self, workload: str, reason: str, message: str,
                   warning: bool = False) -> None: ...


class SnoozeBook:
    def __init__(self, store: Store | None = None, events: Events | None = None) -> None:
        self.store, self.events = store, events
        self.records: list[SnoozeRecord] = []
        self.loaded = store is None

    async def current(self) -> tuple[SnoozeRecord, ...]:
        """The records; an unreadable store fails the cycle before anything is decided."""
        if not self.loaded:
            assert self.store is not None
            self.records = await self.store.load()
            self.loaded = True
        return tuple(self.records)

    async def settle(self, changed: tuple[SnoozeRecord, ...], now: float, writes: bool,
                     fenced: Callable[[], Awaitable[None]]) -> None:
        """Keep this cycle's changes. ``writes``: the mode lets the reclaimer write (not
        observe: records stay in memory, nothing is announced)."""
        if not changed:
            return
        replaced = {(r.workload, r.value, r.seen) for r in changed}
        merged = kept([*(r for r in self.records if (r.workload, r.value, r.seen)
                         not in replaced), *changed], now)
        if writes and self.store is not None:
            try:
                await fenced()
                await self.store.save(merged)
            except Exception as e:  # any failure: not kept, seen anew next cycle
                self.loaded = False
                log.warning("snooze records not written (%s); next cycle sees them anew", e)
                return
        self.records = merged
        for r in changed:
            log.info("snooze workload=%s value=%r outcome=%s closed=%s msg=%r", r.workload,
                     r.value, r.outcome, r.closed or "-", r.message,
                     extra={"team": r.team, "pod": r.workload})
            if writes and self.events is not None and r.closed != Closed.WITHDRAWN:
                await self.events.emit(r.workload, *announcement(r))


def announcement(r: SnoozeRecord) -> tuple[str, str, bool]:
    """(Event reason, message, warning)."""
    if r.closed == Closed.ENDED:
        return ENDED, r.message, False
    if r.outcome in EVENT:
        return EVENT[r.outcome], r.message, False
    return IGNORED, r.message, True
