"""Reservations (core/reclaim/reserve.py): a queue claim reserves what it frees for its pod,
ahead of the reclaims, and every way a reservation ends releases it."""

from __future__ import annotations

import json

import pytest

from gpusteward.core.model import RESERVED, Node
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim import reserve
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import PastAction
from gpusteward.core.times import stamp
from tests.unit.test_reclaim_decide import NOW, gpu_pod, idle, pending, snapshot
from tests.unit.test_reclaim_loop import Ledger, Writer, reclaimer

H100 = "NVIDIA-H100-80GB-HBM3"
POLICY = parse_policy({"reclaim": {"mode": "enforce"}, "queue": {"reservationTtl": "90s"}})


def claim_snapshot(recent=()):
    victim = gpu_pod("low", node="n1", gpus=4, priority=10)
    want = pending("want", 4, 1000)
    return snapshot([victim, want], {"ml/low": idle(gpus=4)}, nodes=[Node("n1", H100, 4)],
                    recent=recent)


QUEUE_KINDS = ("reserve", "reclaim", "release")  # the victim's first idle mark aside


def queued(actions) -> list[tuple[str, str]]:
    return [(a.kind, a.pod.name) for a in actions if a.kind in QUEUE_KINDS]


def test_a_queue_claim_reserves_the_freed_gpus_for_its_pod_ahead_of_the_reclaim():
    assert queued(plan(claim_snapshot(), POLICY).actions) == [("reserve", "want"),
                                                              ("reclaim", "low")]
    (r,) = [a for a in plan(claim_snapshot(), POLICY).actions if a.kind == "reserve"]
    assert (r.node, r.until, r.after) == ("n1", NOW + 90, ("low",))
    assert json.loads(reserve.entry(r)) == {"node": "n1", "gpus": 4, "priority": 1000,
                                            "until": stamp(NOW + 90)}


def test_a_claim_a_limit_holds_back_reserves_nothing():
    full = tuple(PastAction(NOW - 60, "ml", f"ml/p{i}") for i in range(30))  # maxPerHour 30
    assert queued(plan(claim_snapshot(full), POLICY).actions) == []


def entry(until: float = NOW + 60) -> str:
    return json.dumps({"node": "n1", "gpus": 4, "priority": 1000, "until": stamp(until)})


def reserved(until: float = NOW + 60, priority: int = 1000, nominated: str = "n1"):
    return pending("want", 4, priority, annotations={RESERVED: entry(until)},
                   nominated_node=nominated)


@pytest.mark.parametrize(("pod", "why", "clears"), [
    pytest.param(reserved(NOW - 1), "expired at", "n1", id="expired"),
    pytest.param(reserved(priority=5), "the pod changed", "n1", id="priority-changed"),
    pytest.param(reserved(nominated="n2"), "nominated it to n2", "", id="renominated"),
    # A hand-made end far off (the TTL is 90 s) would keep the pod out of the queue for ever.
    pytest.param(reserved(NOW + 10**9), "beyond queue.reservationTtl", "n1",
                 id="end-beyond-the-ttl"),
    pytest.param(pending("want", 4, 1000, annotations={RESERVED: "{"}, nominated_node="n1"),
                 "unreadable", "", id="unreadable"),
])
def test_every_end_of_a_reservation_releases_it(pod, why, clears):
    (a,) = reserve.releases([pod], NOW, 90.0, lambda p: "ml")
    assert a.kind == "release" and why in a.message and a.node == clears


def test_a_bound_pod_drops_the_annotation_and_keeps_its_binding():
    pod = gpu_pod("want", gpus=4, priority=1000, annotations={RESERVED: entry()})
    (a,) = reserve.releases([pod], NOW, 90.0, lambda p: "ml")
    assert "bound to n1" in a.message and a.node == ""


@pytest.mark.parametrize("nominated", [
    pytest.param("n1", id="nominated"),
    # a failed scheduling attempt of the pod clears the nomination (kube-scheduler
    # schedule_one.go clearNominatedNode): the reservation, kept by the extender, stands
    pytest.param(None, id="nomination-cleared-by-the-scheduler"),
])
def test_a_live_reservation_is_kept_and_claims_nothing_more(nominated):
    victim = gpu_pod("low", node="n1", gpus=4, priority=10)
    p = plan(snapshot([victim, reserved(nominated=nominated)], {"ml/low": idle(gpus=4)},
                      nodes=[Node("n1", H100, 4)]), POLICY)
    assert queued(p.actions) == []


def test_gpus_reserved_for_one_pod_are_not_free_for_another_claim():
    """n1's 4 GPUs are free (its victim gone) but reserved for "want": "next" gets the idle
    pod on n2 reclaimed for it, not a free ride on n1."""
    other = gpu_pod("low2", node="n2", gpus=4, priority=10)
    nxt = pending("next", 4, 1000)
    p = plan(snapshot([reserved(nominated=None), other, nxt], {"ml/low2": idle(gpus=4)},
                      nodes=[Node("n1", H100, 4), Node("n2", H100, 4)]), POLICY)
    assert queued(p.actions) == [("reserve", "next"), ("reclaim", "low2")]


class RefusesEvictions(Writer):
    """A PodDisruptionBudget refuses the eviction; every other write is done."""

    async def apply(self, action):
        done = await super().apply(action)
        return "blocked" if action.kind == "reclaim" else done


async def test_a_reservation_whose_victim_was_not_reclaimed_is_released_at_once():
    snap = claim_snapshot()
    ledger = Ledger()
    writer = RefusesEvictions(ledger)
    rec = reclaimer([], ledger=ledger, writer=writer, policy=POLICY)
    rec.reader.snap = snap
    await rec.cycle()
    assert [a for a in writer.applied if a[0] in QUEUE_KINDS] == [
        ("reserve", "want"), ("reclaim", "low"), ("release", "want")]


async def test_a_new_leader_reserves_nothing_in_the_cycle_its_reclaims_wait():
    """A reservation in a cycle whose reclaims a takeover defers would be undone at once; and
    kept, it would leave the pod nominated for GPUs nobody frees."""
    writer = Writer()
    rec = reclaimer([], writer=writer, policy=POLICY)
    rec.reader.snap = claim_snapshot()
    rec.reread_ledger()  # what _lead does on taking the Lease
    await rec.cycle()
    assert [a for a in writer.applied if a[0] in QUEUE_KINDS] == []
    await rec.cycle()
    assert [a for a in writer.applied if a[0] in QUEUE_KINDS] == [
        ("reserve", "want"), ("reclaim", "low")]
