"""The reclaim cycle: read a snapshot, decide (pure), log the evidence, act as the mode allows."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gpusteward.adapters.errors import AdapterError
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import HOUR, Action, PastAction, Plan, Snapshot, Verdict
from gpusteward.reclaimer.metrics import ReclaimerMetrics

log = logging.getLogger("gpusteward.reclaimer")

# What each mode lets through to the API server.
WRITES = {"observe": set(), "warn": {"mark", "warn", "clear"},
          "enforce": {"mark", "warn", "clear", "reclaim"}}


class Reader(Protocol):
    async def read(self, recent: list[PastAction]) -> Snapshot: ...


class Writer(Protocol):
    async def apply(self, action: Action) -> str: ...


class Ledger(Protocol):
    """Where the last hour's reclaims outlive this process (``adapters.ledger``)."""

    async def load(self) -> list[PastAction]: ...

    async def save(self, actions: list[PastAction]) -> None: ...


class DecisionLog:
    """The last logged decision per pod UID, so a pod's decision line is written when it
    changes (one line per GPU pod per cycle was ~14 million lines a day at 10,000 pods), not
    every cycle. Actions are logged every time; the cycle line counts the rest."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[object, ...]] = {}
        self.fresh: set[str] = set()  # pods (namespace/name) whose decision changed this cycle

    def changed(self, uid: str, v: Verdict) -> bool:
        # The figures (peak, coverage) move every cycle; the decision is what they led to.
        decision = (v.state, v.team, v.gpus, v.borrowed, None if v.rule is None else
                    v.rule.window, v.reasons if v.state == "protected" else ())
        if self.last.get(uid) == decision:
            return False
        self.last[uid] = decision
        return True

    def prune(self, present: set[str]) -> None:
        """Forget pods that are gone, so the map stays as large as the fleet."""
        for uid in self.last.keys() - present:
            del self.last[uid]


@dataclass
class Reclaimer:
    policy: Policy
    mode: str
    reader: Reader
    writer: Writer
    metrics: ReclaimerMetrics = field(default_factory=ReclaimerMetrics)
    clock: Callable[[], float] = time.time
    # Reclaims of the last hour, for the per-hour limits; read from the ledger when this
    # replica starts leading and written back after every cycle that reclaimed.
    recent: list[PastAction] = field(default_factory=list)
    ledger: Ledger | None = None
    _ledger_read: bool = False
    _ledger_behind: bool = False
    decisions: DecisionLog = field(default_factory=DecisionLog)

    def reread_ledger(self) -> None:
        """On taking the Lease: another replica may have reclaimed since this one last led."""
        self._ledger_read = False

    async def cycle(self) -> Plan:
        started = time.perf_counter()
        if self.ledger is not None and not self._ledger_read:
            # Unreadable ledger: the cycle fails here, before anything is decided or done.
            self.recent = self._last_hour(await self.ledger.load())
            self._ledger_read = True
        snap = await self.reader.read(self.recent)
        decided = plan(snap, self.policy)
        logged = audit(decided, snap, self.decisions)
        results = [await self._act(a) for a in decided.actions]
        await self._write_ledger()
        self.metrics.observe(snap, decided, float(self.policy.reclaim.interval))
        elapsed = time.perf_counter() - started
        self.metrics.cycle.observe(elapsed)
        self.metrics.cycles.labels("halted" if decided.halted else "ok").inc()
        summarize(decided, results, self.mode, elapsed, logged)
        return decided

    async def _act(self, action: Action) -> str:
        if action.kind not in WRITES[self.mode]:
            result = "skipped"
        else:
            result = await self.writer.apply(action)
            if action.kind == "reclaim" and result == "done":
                self.recent = [*self._last_hour(self.recent), PastAction(self.clock(), action.team)]
                self._ledger_behind = self.ledger is not None
        self.metrics.actions.labels(action.kind, action.reason, action.team, result).inc()
        # What the mode skips repeats every cycle (observe never writes the mark): it is
        # news only with a new decision.
        quiet = result == "skipped" and action.pod.key not in self.decisions.fresh
        log.log(logging.DEBUG if quiet else logging.INFO,
                "action=%s pod=%s team=%s reason=%s how=%s mode=%s result=%s msg=%r",
                action.kind, action.pod.key, action.team, action.reason, action.how or "-",
                self.mode, result, action.message,
                extra={"pod": action.pod.key, "team": action.team, "action": action.kind})
        return result

    def _last_hour(self, actions: list[PastAction]) -> list[PastAction]:
        now = self.clock()
        return [a for a in actions if now - a.at < HOUR]

    async def _write_ledger(self) -> None:
        """A failed write is retried after the next cycle; this replica's count stays right."""
        if self.ledger is None or not self._ledger_behind:
            return
        try:
            await self.ledger.save(self.recent)
        except AdapterError as e:
            self.metrics.ledger_errors.inc()
            log.error("per-hour reclaim count not saved (a restart would forget it): %s", e)
            return
        self._ledger_behind = False

    async def run(self) -> None:
        """Cycle forever; an error in one cycle is logged and the next cycle starts afresh."""
        interval = float(self.policy.reclaim.interval)
        while True:
            try:
                # A cycle that hangs (a stuck connection) must not stop all later cycles.
                async with asyncio.timeout(max(120.0, 5 * interval)):
                    await self.cycle()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.metrics.cycles.labels("error").inc()
                log.exception("reclaim cycle failed; nothing more is done until the next cycle")
            await asyncio.sleep(interval)


def audit(p: Plan, snap: Snapshot, decisions: DecisionLog) -> int:
    """A line per pod whose decision changed, with the evidence it rests on; how many."""
    if p.halted:
        log.warning("cycle halted, nothing reclaimed: %s", p.halted)
        return 0
    uids = {pod.key: pod.uid or pod.key for pod in snap.pods}
    decisions.fresh = set()
    for v in p.verdicts:
        if not decisions.changed(uids.get(v.pod, v.pod), v):
            continue
        decisions.fresh.add(v.pod)
        ev = v.evidence
        log.info("decision pod=%s team=%s gpus=%d state=%s peak=%s coverage=%s window=%s "
                 "borrowed=%s why=%r", v.pod, v.team, v.gpus, v.state,
                 "-" if ev is None or ev.peak_percent is None else f"{ev.peak_percent:.1f}",
                 "-" if ev is None else f"{ev.coverage:.2f}",
                 "-" if v.rule is None else f"{v.rule.window:.0f}s", v.borrowed,
                 "; ".join(v.reasons), extra={"pod": v.pod, "team": v.team, "state": v.state})
    decisions.prune(set(uids.values()))
    for action, why in p.held_back:
        log.info("held-back pod=%s team=%s reason=%s why=%r", action.pod.key, action.team,
                 action.reason, why, extra={"pod": action.pod.key, "team": action.team})
    return len(decisions.fresh)


def summarize(p: Plan, results: list[str], mode: str, elapsed: float, logged: int) -> None:
    states = {s: sum(1 for v in p.verdicts if v.state == s)
              for s in ("busy", "idle", "unknown", "protected")}
    reclaimed = sum(1 for a, r in zip(p.actions, results, strict=True)
                    if a.kind == "reclaim" and r == "done")
    gpus = sum(a.pod.gpus for a, r in zip(p.actions, results, strict=True)
               if a.kind == "reclaim" and r == "done")
    log.info("cycle mode=%s pods=%d busy=%d idle=%d unknown=%d protected=%d "
             "decisions_changed=%d actions=%d reclaimed=%d gpus_returned=%d held_back=%d "
             "halted=%r took=%.3fs", mode, len(p.verdicts), states["busy"], states["idle"],
             states["unknown"], states["protected"], logged, len(p.actions), reclaimed, gpus,
             len(p.held_back), p.halted, elapsed)
