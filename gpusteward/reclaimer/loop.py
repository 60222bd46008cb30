"""The reclaim cycle: read a snapshot, decide (pure), log the evidence, act as the mode allows.

Every action passes the Fence first (the API server confirms this replica still holds the
Lease), every write request the Lease's local deadline (a LeaseLost from inside a write stops the
cycle's writes like a failed Fence), and every write is fenced by the API server on the
resourceVersion it was derived from (reclaimer.actor). No decision older than ``decision_ttl`` is
carried out, and a reclaim is recorded in the ledger as an intent before it is attempted
(write-ahead), so a crash between the two still counts it against the per-hour limits. The
stop it makes is written ahead too, in gpusteward's stop record (``reclaimer.stops``), the only
thing restore trusts: a stop that cannot be recorded is not made.

A replica that has just taken the Lease re-derives every mark in a cycle of its own before it
reclaims anything: its first cycle as leader marks, warns and clears, and holds its reclaims
back (``deferred``), so nothing is stopped on the strength of marks it has not decided itself.
That cycle first touches the owner of every reclaim another leader began and did not finish
(core.reclaim.takeover), so an owner stop still on its way from that leader is refused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from gpusteward.adapters.errors import AdapterError, KubeError, KubeForbidden, LeaseLost
from gpusteward.core.policy import Policy, ReclaimMode
from gpusteward.core.reclaim import notice, reserve, takeover
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import (
    Action,
    ActionKind,
    ActResult,
    PastAction,
    PastState,
    Plan,
    Snapshot,
    StopEntry,
    Verdict,
    VerdictState,
)
from gpusteward.core.reclaim.rules import remembered
from gpusteward.reclaimer.ledger import LedgerConflict
from gpusteward.reclaimer.metrics import ReclaimerMetrics
from gpusteward.reclaimer.outbox import Outbox
from gpusteward.reclaimer.selfservice import SelfService
from gpusteward.reclaimer.snoozes import SnoozeBook

log = logging.getLogger("gpusteward.reclaimer")

# What each mode lets through to the API server.
_STAGES = {ActionKind.MARK, ActionKind.WARN, ActionKind.CLEAR, ActionKind.BLOCK, ActionKind.FAULT,
           ActionKind.RELEASE, ActionKind.UNDEMOTE, ActionKind.COOL, ActionKind.UNBLOCK}
# Held back in a new leader's first cycle: its reclaims, and the reservations made for them.
_AFTER_TAKEOVER = {ActionKind.RECLAIM, ActionKind.RESERVE}
WRITES: dict[ReclaimMode, set[ActionKind]] = {
    ReclaimMode.OBSERVE: set(), ReclaimMode.WARN: _STAGES,
    ReclaimMode.ENFORCE: _STAGES | {ActionKind.RECLAIM, ActionKind.FENCE, ActionKind.RESERVE}}


class Reader(Protocol):
    async def read(self, recent: list[PastAction]) -> Snapshot: ...


class Writer(Protocol):
    async def apply(self, action: Action) -> ActResult: ...


class Ledger(Protocol):
    """Where the last hour's reclaims outlive this process (``reclaimer.ledger``). ``save``
    raises LedgerConflict when someone wrote since this replica's last load or save."""

    async def load(self) -> list[PastAction]: ...

    async def save(self, actions: list[PastAction]) -> None: ...


class StopRecord(Protocol):
    """What gpusteward stopped, for restore to trust (``reclaimer.stops.StopBook``); raises
    AdapterError when it cannot be read or written."""

    async def ahead(self, action: Action) -> StopEntry | None: ...

    async def forget(self, entry: StopEntry) -> None: ...


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
                    v.rule.window, v.reasons if v.state == VerdictState.PROTECTED else ())
        if self.last.get(uid) == decision:
            return False
        self.last[uid] = decision
        return True

    def prune(self, present: set[str]) -> None:
        """Forget pods that are gone, so the map stays as large as the fleet."""
        for uid in self.last.keys() - present:
            del self.last[uid]


class Fence(Protocol):
    """Asked before every write (``adapters.lease.LeaseGuard``)."""

    async def check(self) -> None:
        """Return only while this replica may write to the cluster; else raise LeaseLost."""


class Halt(Exception):
    """Stop carrying out this cycle's decisions; the result word says why."""

    def __init__(self, result: ActResult, why: str):
        super().__init__(why)
        self.result = result


@dataclass
class Reclaimer:
    policy: Policy
    mode: ReclaimMode
    reader: Reader
    writer: Writer
    metrics: ReclaimerMetrics = field(default_factory=ReclaimerMetrics)
    clock: Callable[[], float] = time.time
    # Reclaims of the last hour (intents included), for the per-hour limits; read from the
    # ledger when this replica starts leading, written ahead of each reclaim.
    recent: list[PastAction] = field(default_factory=list)
    ledger: Ledger | None = None
    fence: Fence | None = None
    _ledger_read: bool = False
    _ledger_behind: bool = False
    _new_leader: bool = False  # its first cycle since taking the Lease: reclaims wait
    decisions: DecisionLog = field(default_factory=DecisionLog)
    snoozes: SnoozeBook = field(default_factory=SnoozeBook)
    selfservice: SelfService | None = None  # answers restore requests (none: they wait)
    outbox: Outbox | None = None  # notifications (none: not sent)
    # Each stop, recorded before it is made (none: not recorded, and restore refuses it).
    stops: StopRecord | None = None

    @property
    def decision_ttl(self) -> float:
        """A decision older than this is dropped, not carried out: the world it saw is gone."""
        return max(float(self.policy.reclaim.interval), 30.0)

    def reread_ledger(self) -> None:
        """On taking the Lease: another replica may have reclaimed since this one last led, and
        marked pods this one has not judged; the first cycle re-derives the marks."""
        self._ledger_read = False
        self._new_leader = True
        self.snoozes.loaded = self.snoozes.store is None

    async def cycle(self) -> Plan:
        started = time.perf_counter()
        if self.ledger is not None and not self._ledger_read:
            # Unreadable ledger: the cycle fails here, before anything is decided or done.
            loaded = await self.ledger.load()
            self.recent = self._remembered(loaded)
            # Future-dated entries were clamped to now: store that, so they age from here.
            self._ledger_behind = any(a.at > self.clock() for a in loaded)
            self._ledger_read = True
        snap = await self.reader.read(self.recent)
        snap = msgspec.structs.replace(snap, snoozes=await self.snoozes.current())
        decided = plan(snap, self.policy)
        logged = audit(decided, snap, self.decisions)
        if self._new_leader:  # another leader's reclaims may still be on their way
            await self._act_all(takeover.fences(snap), snap.now)
        results = await self._act_all(decided.actions, snap.now)
        self._new_leader = False
        if self.outbox is not None:
            self.outbox.offer(notice.from_cycle(decided, results, snap.owners, self.policy,
                                                snap.now))
        await self.snoozes.settle(decided.snoozes, snap.now, self.mode != ReclaimMode.OBSERVE,
                                  self._fenced)
        await self._restore(decided)
        await self._write_ledger()
        self.metrics.observe(snap, decided, float(self.policy.reclaim.interval))
        elapsed = time.perf_counter() - started
        self.metrics.cycle.observe(elapsed)
        self.metrics.cycles.labels("halted" if decided.halted else "ok").inc()
        summarize(decided, results, self.mode, elapsed, logged)
        return decided

    async def _restore(self, decided: Plan) -> None:
        if self.selfservice is None or not decided.restores:
            return
        try:
            answered = await self.selfservice.answer(
                decided.restores, self.mode != ReclaimMode.OBSERVE, self._fenced)
        except Halt as h:
            log.warning("restore requests not answered (%s): %s", h.result, h)
            return
        except LeaseLost as e:
            log.warning("restore requests not answered (fenced): %s", e)
            return
        for ask, result, _ in answered:
            self.metrics.restores.labels(ask.team, result).inc()
        if self.outbox is not None:
            self.outbox.offer(notice.restored(answered, self.clock()))

    async def _act_all(self, actions: tuple[Action, ...],
                       decided_at: float) -> list[ActResult]:
        results: list[ActResult] = []
        halt: Halt | None = None
        freed: set[str] = set()  # pods whose reclaim this cycle is done
        reserved: list[Action] = []  # reservations made ahead of their victims' reclaims
        for action in actions:
            if action.kind not in WRITES[self.mode]:
                result = ActResult.SKIPPED
            elif action.kind in _AFTER_TAKEOVER and self._new_leader:
                result = ActResult.DEFERRED
            elif halt is not None:
                result = halt.result
            else:
                try:
                    result = await self._act(action, decided_at)
                except Halt as h:
                    halt, result = h, h.result
                    log.warning("this cycle's remaining writes are not carried out (%s): %s",
                                h.result, h)
            if result in (ActResult.FENCED, ActResult.STALE) and action.kind in WRITES[self.mode]:
                self.metrics.fenced.labels(result).inc()
            self.metrics.actions.labels(action.kind, action.reason, action.team, result).inc()
            # What the mode skips repeats every cycle (observe never writes the mark): it is
            # news only with a new decision.
            quiet = result == ActResult.SKIPPED and action.pod.key not in self.decisions.fresh
            log.log(logging.DEBUG if quiet else logging.INFO,
                    "action=%s pod=%s team=%s reason=%s how=%s mode=%s result=%s msg=%r",
                    action.kind, action.pod.key, action.team, action.reason, action.how or "-",
                    self.mode, result, action.message,
                    extra={"pod": action.pod.key, "team": action.team, "action": action.kind})
            if action.kind == ActionKind.RECLAIM and result == ActResult.DONE:
                freed.update(p.uid for p in (action.pod, *action.peers))
            if action.kind == ActionKind.RESERVE and result == ActResult.DONE:
                reserved.append(action)
            results.append(result)
        await self._undo_reservations(reserved, freed, decided_at)
        return results

    async def _undo_reservations(self, reserved: list[Action], freed: set[str],
                                 decided_at: float) -> None:
        """A reservation whose victims were not all reclaimed frees nothing: it goes now."""
        for r in reserved:
            if freed.issuperset(r.after):
                continue
            release = reserve.undone(r, "its victims were not all reclaimed")
            try:
                result = await self._act(release, decided_at)
            except Halt as h:
                result = h.result
            log.info("action=release pod=%s result=%s msg=%r", r.pod.key, result,
                     release.message, extra={"pod": r.pod.key, "action": release.kind})

    async def _act(self, action: Action, decided_at: float) -> ActResult:
        age = self.clock() - decided_at
        if age > self.decision_ttl:
            raise Halt(ActResult.STALE,
                       f"decided {age:.0f}s ago, longer than {self.decision_ttl:g}s")
        await self._fenced()
        try:
            if action.kind != ActionKind.RECLAIM:
                return await self.writer.apply(action)
            stop, unrecorded = await self._record_stop(action)
            if unrecorded is not None:
                return unrecorded
            assert action.owner is not None  # a reclaim always names what it stops
            intent = PastAction(self.clock(), action.team, action.pod.key, PastState.INTENT,
                                action.owner.key)
            await self._record(intent)
            result = await self.writer.apply(action)
        except LeaseLost as e:  # a write refused by the Lease's deadline: the intent counts
            raise Halt(ActResult.FENCED, str(e)) from e
        self._settle(intent, result)
        await self._settle_stop(action, stop, result)
        return result

    async def _record_stop(self, action: Action) -> tuple[StopEntry | None, ActResult | None]:
        """Write ahead: the stop is in the stop record before it is made, or it is not made
        (the result then says why)."""
        if self.stops is None:
            return None, None
        try:
            return await self.stops.ahead(action), None
        except LeaseLost:
            raise
        except AdapterError as e:
            # the record's own error carries the status of the refusal behind it
            forbidden = isinstance(e, KubeError) and e.status == KubeForbidden.STATUS
            log.error("pod=%s reclaim not attempted: its stop could not be recorded for restore%s"
                      ": %s", action.pod.key, " (grant the reclaimer's ServiceAccount what it "
                      "names)" if forbidden else "", e, extra={"pod": action.pod.key})
            return None, ActResult.FORBIDDEN if forbidden else ActResult.ERROR

    async def _settle_stop(self, action: Action, stop: StopEntry | None,
                           result: ActResult) -> None:
        """Stale: nothing was written, so the entry goes. Any other result may have stopped the
        owner, even half-way (a KEDA pause taken, its target not scaled): the entry stays."""
        if stop is None or self.stops is None or result != ActResult.STALE:
            return
        try:
            await self.stops.forget(stop)
        except LeaseLost as e:
            log.warning("pod=%s stop record keeps an entry for a stop not made (fenced): %s",
                        action.pod.key, e)
        except AdapterError as e:
            log.warning("pod=%s stop record keeps an entry for a stop not made: %s",
                        action.pod.key, e)

    async def _fenced(self) -> None:
        if self.fence is None:
            return
        try:
            await self.fence.check()
        except LeaseLost as e:
            raise Halt(ActResult.FENCED, str(e)) from e

    async def _record(self, intent: PastAction) -> None:
        """Write ahead: the intent is stored before the reclaim, or the reclaim is not tried."""
        ahead = [*self._remembered(self.recent), intent]
        if self.ledger is not None:
            try:
                await self.ledger.save(ahead)
            except LeaseLost:
                raise
            except LedgerConflict as e:
                self._ledger_read = False  # another writer: re-read and re-decide next cycle
                raise Halt(ActResult.CONFLICT, f"per-hour ledger changed meanwhile: {e}") from e
            except AdapterError as e:
                self.metrics.ledger_errors.inc()
                raise Halt(ActResult.ERROR,
                           f"per-hour ledger not written, so no reclaim: {e}") from e
        self.recent = ahead
        self._ledger_behind = False

    def _settle(self, intent: PastAction, result: ActResult) -> None:
        """Done: the intent becomes a reclaim. Refused before anything changed: forget it. An
        error may have happened half-way: the intent keeps counting."""
        if result == ActResult.ERROR:
            return
        rest = [a for a in self.recent if a is not intent]
        done = msgspec.structs.replace(intent, state=PastState.DONE)
        self.recent = rest + ([done] if result == ActResult.DONE else [])
        self._ledger_behind = self.ledger is not None

    def _remembered(self, actions: list[PastAction]) -> list[PastAction]:
        """The reclaims the limits or a cooldown still need (rules.remembered). Entries dated
        in the future (a skewed clock, a hand edit) count from now."""
        now, keep = self.clock(), remembered(self.policy)
        clamped = (a if a.at <= now else msgspec.structs.replace(a, at=now) for a in actions)
        return [a for a in clamped if now - a.at < keep]

    async def _write_ledger(self) -> None:
        """The settled intents; a failed write is retried after the next cycle (until then the
        ledger over-counts, never under-counts)."""
        if self.ledger is None or not self._ledger_behind:
            return
        try:
            await self._fenced()
            await self.ledger.save(self._remembered(self.recent))
        except (Halt, LeaseLost) as h:
            log.warning("per-hour ledger not written: %s", h)
            return
        except LedgerConflict as e:
            self._ledger_read = False
            log.warning("per-hour ledger changed meanwhile; re-read next cycle: %s", e)
            return
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
            except LeaseLost as e:  # a write refused by the Lease's deadline
                self.metrics.cycles.labels("fenced").inc()
                log.warning("reclaim cycle stopped, this replica may no longer write: %s", e)
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


def summarize(p: Plan, results: list[ActResult], mode: ReclaimMode, elapsed: float,
              logged: int) -> None:
    states = {s: sum(1 for v in p.verdicts if v.state == s) for s in VerdictState}
    reclaimed = [a for a, r in zip(p.actions, results, strict=True)
                 if a.kind == ActionKind.RECLAIM and r == ActResult.DONE]
    gpus = sum(a.pod.gpus for a in reclaimed)
    log.info("cycle mode=%s pods=%d busy=%d idle=%d unknown=%d protected=%d "
             "decisions_changed=%d actions=%d reclaimed=%d gpus_returned=%d held_back=%d "
             "halted=%r took=%.3fs", mode, len(p.verdicts), states[VerdictState.BUSY],
             states[VerdictState.IDLE], states[VerdictState.UNKNOWN],
             states[VerdictState.PROTECTED], logged, len(p.actions), len(reclaimed), gpus,
             len(p.held_back), p.halted, elapsed)
