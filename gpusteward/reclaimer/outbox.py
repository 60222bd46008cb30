"""Notifications leave through an outbox that never holds up a cycle.

A cycle only offers its notices (``offer``: a put into a bounded queue; a full queue drops and
counts). A background task, running while this replica leads, takes them in, records them as
pending in the ConfigMap ``<lease>-notifications`` before the first attempt, delivers them per
sink in order, and records each as sent. Per sink, a failed attempt backs off 1 s, doubling to
5 min; a message still undelivered after ``notifications.retryFor`` is given up and counted.

Exactly once per transition, across failovers: a notice's id names its transition
(core/reclaim/notice.py), and a replica that starts leading loads the record first, so it
neither sends again what its predecessor sent nor forgets what was pending. Only a replica that
dies between a receiver's 2xx and the write of "sent" leaves a duplicate; receivers can drop it
by the ``Idempotency-Key`` header (the notice id).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec

from gpusteward.core.policy import Notifications, Sink
from gpusteward.core.reclaim.model import StoredWord
from gpusteward.core.reclaim.notice import Notice
from gpusteward.core.times import DAY
from gpusteward.reclaimer.metrics import ReclaimerMetrics

log = logging.getLogger("gpusteward.reclaimer.notify")

# Ids of delivered messages kept (a day's at most) against re-sending: with queueSize (<= 500)
# pending ones of ~1 KB, the record stays well inside a ConfigMap's 1 MiB.
KEEP_SENT = 2000
MAX_BACKOFF = 300.0


class Delivery(StoredWord):
    """Where a notice's delivery to one sink stands (the outbox ConfigMap's ``state`` words).
    One this version does not know is settled: neither sent again nor counted as waiting."""

    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


PENDING, SENT, FAILED = Delivery.PENDING, Delivery.SENT, Delivery.FAILED


class Entry(msgspec.Struct, frozen=True):
    key: str  # sink name / notice id
    sink: str
    state: Delivery
    at: float  # pending: when queued; sent, failed: when that happened
    notice: Notice | None = None  # pending only
    attempts: int = 0


class Store(Protocol):
    async def load(self) -> list[Entry]: ...

    async def save(self, items: list[Entry]) -> None: ...


class Deliver(Protocol):
    async def send(self, sink: Sink, notice: Notice) -> str: ...


class Outbox:
    def __init__(self, settings: Notifications, deliver: Deliver, store: Store | None,
                 metrics: ReclaimerMetrics, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.sinks = {s.name: s for s in settings.sinks}
        self.deliver, self.store, self.metrics, self.clock = deliver, store, metrics, clock
        self.queue: asyncio.Queue[tuple[str, Notice]] = asyncio.Queue(settings.queue_size)
        self.entries: dict[str, Entry] = {}
        self.loaded = store is None
        self.dirty = False
        self.retry_at: dict[str, tuple[int, float]] = {}  # sink -> (failures in a row, when)
        self.wake = asyncio.Event()

    def offer(self, notices: list[Notice]) -> None:
        """From the cycle: never waits."""
        for notice in notices:
            for sink in self.settings.sinks:
                if notice.event not in sink.events:
                    continue
                try:
                    self.queue.put_nowait((sink.name, notice))
                except asyncio.QueueFull:
                    self.metrics.notices.labels(sink.name, notice.event, "dropped").inc()
                    log.error("notification %s to sink %s dropped: %d already wait "
                              "(notifications.queueSize)", notice.id, sink.name,
                              self.queue.qsize())
        self.wake.set()

    def restart(self) -> None:
        """On taking the Lease: what the last leader recorded comes first."""
        self.loaded = self.store is None

    async def run(self, fenced: Callable[[], Awaitable[None]]) -> None:
        """Deliver until cancelled; an error in one round is logged and the next starts anew."""
        while True:
            try:
                await self.round(fenced)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the next round starts from the record
                self.loaded = self.store is None
                log.warning("notification round stopped (%s); retrying", e)
            with contextlib.suppress(TimeoutError):  # a backoff may have ended meanwhile
                await asyncio.wait_for(self.wake.wait(), 1.0)
            self.wake.clear()

    async def round(self, fenced: Callable[[], Awaitable[None]]) -> None:
        if not self.loaded:
            assert self.store is not None
            stored = {e.key: e for e in await self.store.load()}
            # The record wins; what only this replica knows (not yet written) is kept.
            mine = {k: e for k, e in self.entries.items() if k not in stored}
            self.entries, self.dirty = stored | mine, bool(mine)
            self.loaded = True
        self._take_in()
        await self._save(fenced)  # pending is on record before the first attempt
        now = self.clock()
        await asyncio.gather(*(self._send_due(name, now, fenced) for name in self.sinks))
        await self._save(fenced)
        self._count_pending()

    def _take_in(self) -> None:
        waiting = sum(1 for e in self.entries.values() if e.state == PENDING)
        while not self.queue.empty():
            sink, notice = self.queue.get_nowait()
            key = f"{sink}/{notice.id}"
            if key in self.entries:  # sent, pending or given up already: once is enough
                continue
            if waiting >= self.settings.queue_size:  # a receiver long down: the record is full
                self.metrics.notices.labels(sink, notice.event, "dropped").inc()
                log.error("notification %s to sink %s dropped: %d wait for delivery "
                          "(notifications.queueSize)", notice.id, sink, waiting)
                continue
            self.entries[key] = Entry(key, sink, PENDING, self.clock(), notice)
            waiting += 1
            self.dirty = True

    async def _send_due(self, name: str, now: float,
                        fenced: Callable[[], Awaitable[None]]) -> None:
        failures, retry_at = self.retry_at.get(name, (0, 0.0))
        if retry_at > now:
            return
        due = sorted((e for e in self.entries.values() if e.sink == name and
                      e.state == PENDING), key=lambda e: (e.at, e.key))
        for entry in due:
            assert entry.notice is not None
            if now - entry.notice.at > float(self.settings.retry_for):
                self._settle(entry, FAILED)
                log.error("notification %s to sink %s given up after %d attempts in %s s",
                          entry.notice.id, name, entry.attempts, self.settings.retry_for)
                continue
            await fenced()
            why = await self.deliver.send(self.sinks[name], entry.notice)
            if not why:
                self._settle(entry, SENT)
                self.retry_at.pop(name, None)
                continue
            failures += 1
            self.retry_at[name] = (failures, self.clock() + min(MAX_BACKOFF, 2.0 ** (failures - 1)))
            self.entries[entry.key] = msgspec.structs.replace(entry, attempts=entry.attempts + 1)
            self.dirty = True
            self.metrics.notice_errors.labels(name).inc()
            log.warning("notification %s to sink %s failed (%s); retrying in %.0fs",
                        entry.notice.id, name, why, self.retry_at[name][1] - self.clock())
            return  # in order: the rest wait for this one

    def _settle(self, entry: Entry, state: Delivery) -> None:
        assert entry.notice is not None
        self.entries[entry.key] = Entry(entry.key, entry.sink, state, self.clock(),
                                        attempts=entry.attempts + (state == SENT))
        self.metrics.notices.labels(entry.sink, entry.notice.event, state).inc()
        self.dirty = True
        if state == SENT:
            log.info("notification %s sent to sink %s", entry.notice.id, entry.sink,
                     extra={"team": entry.notice.team, "pod": entry.notice.workload})

    async def _save(self, fenced: Callable[[], Awaitable[None]]) -> None:
        if not self.dirty or self.store is None:
            return
        now = self.clock()
        done = sorted((e for e in self.entries.values() if e.state != PENDING
                       and now - e.at < DAY), key=lambda e: e.at)[-KEEP_SENT:]
        self.entries = {e.key: e for e in done} | {
            k: e for k, e in self.entries.items() if e.state == PENDING}
        await fenced()
        try:
            await self.store.save(list(self.entries.values()))
        except Exception:
            self.metrics.notice_record_errors.inc()
            raise
        self.dirty = False

    def _count_pending(self) -> None:
        for name in self.sinks:
            self.metrics.notices_pending.labels(name).set(sum(
                1 for e in self.entries.values() if e.sink == name and e.state == PENDING))
