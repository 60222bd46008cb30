"""The reclaim loop's fencing and write-ahead, through its own seams (Reader, Writer, Ledger,
Fence): no write without the fence's word, no reclaim without a recorded intent, no decision
carried out after it went stale."""

from __future__ import annotations

import msgspec
import pytest

from gpusteward.adapters.errors import LeaseLost
from gpusteward.core.policy import ReclaimMode, parse_policy
from gpusteward.core.reclaim.model import Action, PastAction, PastState, Snapshot
from gpusteward.core.times import HOUR
from gpusteward.reclaimer.ledger import LedgerConflict, LedgerError
from gpusteward.reclaimer.loop import Reclaimer
from tests.unit.test_reclaim_decide import NOW, gpu_pod, snapshot, warned

POLICY = parse_policy({"reclaim": {"mode": "enforce", "limits": {"maxPerHour": 3}}})


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Reader:
    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.recent: list[PastAction] = []

    async def read(self, recent: list[PastAction]) -> Snapshot:
        self.recent = list(recent)
        return msgspec.structs.replace(self.snap, recent_actions=tuple(recent))


class Ledger:
    """A ConfigMap's semantics: a write names the version it read, else LedgerConflict."""

    def __init__(self, entries: list[PastAction] | None = None) -> None:
        self.entries = list(entries or [])
        self.version = 1
        self.seen: int | None = None
        self.loads = 0
        self.fail: Exception | None = None

    async def load(self) -> list[PastAction]:
        self.loads += 1
        self.seen = self.version
        return list(self.entries)

    async def save(self, actions: list[PastAction]) -> None:
        if self.fail is not None:
            raise self.fail
        if self.seen != self.version:
            raise LedgerConflict("changed meanwhile", 409)
        self.entries = list(actions)
        self.version += 1
        self.seen = self.version

    def someone_else_writes(self) -> None:
        self.version += 1


class Writer:
    def __init__(self, ledger: Ledger | None = None, result: str = "done") -> None:
        self.ledger = ledger
        self.result = result
        self.applied: list[tuple[str, str]] = []
        self.ledger_at_apply: list[list[PastAction]] = []

    async def apply(self, action: Action) -> str:
        self.applied.append((action.kind, action.pod.name))
        if self.ledger is not None:
            self.ledger_at_apply.append(list(self.ledger.entries))
        return self.result


class Fence:
    def __init__(self, allow: int = 10**6) -> None:
        self.allow = allow  # checks that pass before it starts refusing
        self.checks = 0

    async def check(self) -> None:
        self.checks += 1
        if self.checks > self.allow:
            raise LeaseLost("Lease kube-system/r is held by standby-1")


def reclaimer(pods, *, ledger=None, writer=None, fence=None, clock=None, policy=POLICY):
    clock = clock or Clock()
    return Reclaimer(policy, ReclaimMode.ENFORCE, Reader(snapshot(pods)), writer or Writer(ledger),
                     clock=clock, ledger=ledger, fence=fence)


def fenced(rec: Reclaimer, why: str) -> float:
    return rec.metrics.fenced.labels(why)._value.get()


async def test_no_write_at_all_when_the_fence_refuses():
    writer, fence = Writer(), Fence(allow=0)
    rec = reclaimer([warned("due"), gpu_pod("fresh")], writer=writer, fence=fence)
    await rec.cycle()
    assert writer.applied == []
    assert fenced(rec, "fenced") == 2
    assert rec.metrics.actions.labels("reclaim", "idle", "ml", "fenced")._value.get() == 1


async def test_the_fence_is_asked_before_each_write_and_stops_the_rest_of_the_cycle():
    writer, fence = Writer(), Fence(allow=1)
    rec = reclaimer([gpu_pod("a"), gpu_pod("b"), gpu_pod("c")], writer=writer, fence=fence)
    await rec.cycle()
    assert writer.applied == [("mark", "a")]
    assert fence.checks == 2  # the refusal ends the cycle's writes; no further asking
    assert fenced(rec, "fenced") == 2


async def test_a_reclaim_is_never_attempted_when_the_fence_refuses_and_no_intent_is_left():
    ledger = Ledger()
    writer = Writer(ledger)
    rec = reclaimer([warned("due")], ledger=ledger, writer=writer, fence=Fence(allow=0))
    await rec.cycle()
    assert writer.applied == [] and ledger.entries == []


async def test_a_decision_older_than_its_ttl_is_not_carried_out():
    # The snapshot says NOW; the cycle was held 61 s between reading it and acting.
    writer = Writer()
    rec = reclaimer([warned("due")], writer=writer, clock=Clock(NOW + 61))
    assert rec.decision_ttl == 60  # the policy's default interval, floor 30 s
    await rec.cycle()
    assert writer.applied == []
    assert fenced(rec, "stale") == 1


async def test_the_intent_is_in_the_ledger_before_the_reclaim_and_settled_after():
    ledger = Ledger()
    writer = Writer(ledger)
    rec = reclaimer([warned("due")], ledger=ledger, writer=writer)
    await rec.cycle()
    assert writer.applied == [("reclaim", "due")]
    assert writer.ledger_at_apply == [[PastAction(NOW, "ml", "ml/due", PastState.INTENT,
                                                  "ml/Pod/due")]]
    assert ledger.entries == [PastAction(NOW, "ml", "ml/due", "done", "ml/Pod/due")]


@pytest.mark.parametrize(("result", "kept"), [
    pytest.param("blocked", [], id="pdb-refused-nothing-happened-intent-dropped"),
    pytest.param("stale", [], id="pod-changed-nothing-happened-intent-dropped"),
    pytest.param("error", [PastAction(NOW, "ml", "ml/due", PastState.INTENT, "ml/Pod/due")],
                 id="error-may-have-half-happened-intent-kept"),
])
async def test_the_intent_is_reconciled_by_what_the_action_did(result, kept):
    ledger = Ledger()
    rec = reclaimer([warned("due")], ledger=ledger, writer=Writer(ledger, result))
    await rec.cycle()
    assert ledger.entries == kept


async def test_a_ledger_conflict_means_no_reclaim_and_a_fresh_read_next_cycle():
    ledger = Ledger()
    writer = Writer(ledger)
    rec = reclaimer([warned("due")], ledger=ledger, writer=writer)
    await rec.ledger.load()
    rec._ledger_read = True
    ledger.someone_else_writes()
    await rec.cycle()
    assert writer.applied == []
    await rec.cycle()
    assert ledger.loads == 2
    assert writer.applied == [("reclaim", "due")]


async def test_an_unwritable_ledger_means_no_reclaim():
    ledger = Ledger()
    ledger.fail = LedgerError("writing ConfigMap kube-system/r: HTTP 500", 500)
    writer = Writer(ledger)
    rec = reclaimer([warned("due"), gpu_pod("fresh")], ledger=ledger, writer=writer)
    await rec.cycle()
    assert ("reclaim", "due") not in writer.applied
    assert rec.metrics.ledger_errors._value.get() == 1


async def test_intents_of_a_leader_that_died_count_against_the_hourly_limit():
    # maxPerHour 3: a leader recorded three intents and died before settling any.
    died = [PastAction(NOW - 60, "ml", f"ml/p{i}", PastState.INTENT) for i in range(3)]
    ledger = Ledger(died)
    writer = Writer(ledger)
    rec = reclaimer([warned("due")], ledger=ledger, writer=writer)
    decided = await rec.cycle()
    assert writer.applied == []
    assert [why for _, why in decided.held_back] == ["limit: 3 per hour"]


async def test_a_ledger_state_this_version_does_not_know_counts_and_is_written_back_as_is():
    # A newer reclaimer (or a hand edit) may store a state word this version lacks: it must not
    # make the ledger unreadable, must count against the limit, and must survive our rewrite.
    stored = b'[{"at":%d,"team":"ml","pod":"ml/p0","state":"someday"},' % (NOW - 60) + (
        b'{"at":%d,"team":"ml","pod":"ml/p1","state":"someday"}]' % (NOW - 60))
    ledger = Ledger(msgspec.json.decode(stored, type=list[PastAction]))  # the ledger's decoding
    writer = Writer(ledger)
    rec = reclaimer([warned("due"), warned("late")], ledger=ledger, writer=writer)
    decided = await rec.cycle()
    assert writer.applied == [("reclaim", "due")]  # maxPerHour 3: the two unknown ones count
    assert [why for _, why in decided.held_back] == ["limit: 3 per hour"]
    written = msgspec.json.decode(msgspec.json.encode(ledger.entries))
    assert [(e["pod"], e["state"]) for e in written] == [
        ("ml/p0", "someday"), ("ml/p1", "someday"), ("ml/due", "done")]


async def test_future_dated_entries_count_from_now_and_are_stored_so():
    forged = [PastAction(NOW + 10 * HOUR, "ml", "ml/x")] * 3
    ledger = Ledger(forged)
    clock = Clock()
    rec = reclaimer([warned("due")], ledger=ledger, clock=clock)
    await rec.cycle()
    assert [a.at for a in ledger.entries] == [NOW] * 3  # clamped and written back
    clock.now = NOW + HOUR + 1
    rec.reread_ledger()
    rec.reader.snap = msgspec.structs.replace(rec.reader.snap, now=clock.now)
    await rec.cycle()
    assert rec.reader.recent == []  # an hour after "now", not ten hours later


class LosesTheLeaseMidWrite(Writer):
    """The Lease's local deadline refuses a write request from inside the action (the client's
    gate raises LeaseLost), after ``allow`` actions went through."""

    def __init__(self, allow: int) -> None:
        super().__init__()
        self.allow = allow

    async def apply(self, action: Action) -> str:
        if len(self.applied) >= self.allow:
            raise LeaseLost("last renewal 4.1s ago, past the 3.75s write deadline")
        return await super().apply(action)


async def test_a_write_refused_by_the_lease_deadline_stops_the_rest_of_the_cycle():
    writer = LosesTheLeaseMidWrite(allow=1)
    rec = reclaimer([gpu_pod("fresh-a"), gpu_pod("fresh-b"), gpu_pod("fresh-c")], writer=writer)
    await rec.cycle()
    assert len(writer.applied) == 1
    assert fenced(rec, "fenced") == 2  # the refused write and the one after it


async def test_a_reclaim_refused_by_the_lease_deadline_leaves_its_intent_counting():
    ledger = Ledger()
    rec = reclaimer([warned("due")], ledger=ledger, writer=LosesTheLeaseMidWrite(allow=0))
    await rec.cycle()
    assert [a.state for a in ledger.entries] == [PastState.INTENT]


async def test_a_new_leader_marks_in_its_first_cycle_and_reclaims_only_in_the_next():
    writer = Writer()
    rec = reclaimer([warned("due"), gpu_pod("fresh")], writer=writer)
    rec.reread_ledger()  # what _lead does on taking the Lease
    await rec.cycle()
    assert writer.applied == [("mark", "fresh")]
    assert rec.metrics.actions.labels("reclaim", "idle", "ml", "deferred")._value.get() == 1
    await rec.cycle()
    assert ("reclaim", "due") in writer.applied
