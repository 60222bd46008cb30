"""Demoting an idle Kueue Workload through Kueue's priority boost (core/reclaim/demote.py):
which reclaims demote, that a demotion is made once, and when the boost goes. The annotation and
its int32 range: kueue v0.17.0 pkg/controller/constants PriorityBoostAnnotationKey,
pkg/util/priority PriorityBoost; the real Kueue acting on it: tests/e2e/test_kueue.py."""

from __future__ import annotations

import msgspec
import pytest

from gpusteward.core.owners import KUEUE_PRIORITY_BOOST
from gpusteward.core.policy import PolicyError, parse_policy
from gpusteward.core.reclaim import demote
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import RECLAIM_REASON, RECLAIMED_AT, Owner
from gpusteward.core.times import HOUR, stamp
from tests.unit.test_reclaim_decide import NOW, gpu_pod, idle, snapshot, warned
from tests.unit.test_reclaim_kueue import demand, workload, workload_pod

DEMOTE = parse_policy({"reclaim": {"kueue": {"action": "demote"}}})
SINCE = NOW - 600  # when the Workload was demoted


def due(name: str = "idle-0", wl: str = "idle", demoted_at: float | None = None,
        labels: dict | None = None, age: float = 2 * HOUR):
    """An idle Kueue pod past its reclaim deadline, and its owner resolved to its Workload."""
    _, owner = workload_pod(name, wl)
    pod = warned(name, labels={"kueue.x-k8s.io/queue-name": "team", **(labels or {})},
                 age=age)
    return pod, msgspec.structs.replace(owner, pods=(pod.uid,), demoted_at=demoted_at)


def actions(pods, policy, busy=(), workloads=None):
    ev = {p.key: idle(peak=90 if p.name in busy else 1, gpus=p.gpus) for p, _ in pods}
    snap = snapshot([p for p, _ in pods], ev, owners={p.uid: o for p, o in pods})
    if workloads is not None:
        snap = msgspec.structs.replace(snap, kueue=demand(workloads))
    return [(a.kind, a.pod.name, a.reason, a.how) for a in plan(snap, policy).actions
            if a.kind in ("reclaim", "undemote")]


def test_an_idle_workload_at_its_deadline_is_demoted_not_deactivated():
    assert actions([due()], DEMOTE) == [("reclaim", "idle-0", "idle", "demote")]
    assert actions([due()], parse_policy({})) == [("reclaim", "idle-0", "idle", "deactivate")]


def test_a_class_chooses_its_own_kueue_action():
    policy = parse_policy({"reclaim": {"kueue": {"action": "demote"}},
                           "classes": {"batch": {}, "notebook": {"kueueAction": "deactivate"}}})
    pods = [due("a-0", "a"), due("b-0", "b", labels={"gpusteward.io/class": "notebook"})]
    assert sorted(actions(pods, policy)) == [("reclaim", "a-0", "idle", "demote"),
                                             ("reclaim", "b-0", "idle", "deactivate")]


def test_the_demotion_message_names_the_boost():
    snap = snapshot([due()[0]], owners={due()[0].uid: due()[1]})
    (a,) = [a for a in plan(snap, DEMOTE).actions if a.kind == "reclaim"]
    assert "priority boost of -1000000000" in a.message


def test_a_demoted_workload_is_not_demoted_again_while_it_stays_idle():
    assert actions([due(demoted_at=SINCE)], DEMOTE) == []


def test_a_workload_waiting_for_quota_still_has_a_demoted_one_deactivated():
    pod, owner = due(demoted_at=SINCE)
    pod = msgspec.structs.replace(pod, priority=10)
    waiting = [workload("want", priority=1000), workload("idle", admitted_to="gpus", priority=10)]
    assert actions([(pod, owner)], DEMOTE, workloads=waiting) == [
        ("reclaim", "idle-0", "queue", "deactivate")]


@pytest.mark.parametrize(
    ("busy", "age", "reason"),
    [
        pytest.param(True, 2 * HOUR, "active", id="busy-again"),
        pytest.param(False, 60, "readmitted", id="pod-created-since"),
    ],
)
def test_the_boost_goes_when_the_workload_works_again_or_is_admitted_again(busy, age, reason):
    pod, owner = due(demoted_at=SINCE, age=age)
    found = actions([(pod, owner)], DEMOTE, busy=("idle-0",) if busy else ())
    assert found == [("undemote", "idle-0", reason, "demote")]


def test_the_boost_stays_on_an_idle_workload_demoted_after_its_pods_started():
    assert actions([due(demoted_at=SINCE)], DEMOTE) == []


def test_one_undemotion_per_workload():
    a = due("w-0", "w", demoted_at=SINCE)
    b = due("w-1", "w", demoted_at=SINCE)
    owner = msgspec.structs.replace(a[1], pods=(a[0].uid, b[0].uid))
    found = actions([(a[0], owner), (b[0], owner)], DEMOTE, busy=("w-0", "w-1"))
    assert [k for k, *_ in found] == ["undemote"]


def test_an_undemotion_comes_before_the_marks_it_rests_on_are_cleared():
    pod, owner = due(demoted_at=SINCE)
    snap = snapshot([pod], {pod.key: idle(peak=90)}, owners={pod.uid: owner})
    assert [a.kind for a in plan(snap, DEMOTE).actions] == ["undemote", "clear"]


def _wl(annotations: dict[str, str]) -> dict:
    return {"metadata": {"annotations": annotations}}


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param({KUEUE_PRIORITY_BOOST: "-1000", RECLAIM_REASON: "idle",
                      RECLAIMED_AT: stamp(SINCE)}, SINCE, id="ours"),
        pytest.param({KUEUE_PRIORITY_BOOST: "-1000"}, None, id="someone-elses-boost"),
        pytest.param({KUEUE_PRIORITY_BOOST: "500", RECLAIM_REASON: "idle",
                      RECLAIMED_AT: stamp(SINCE)}, None, id="a-raise-is-no-demotion"),
        pytest.param({KUEUE_PRIORITY_BOOST: "low", RECLAIM_REASON: "idle",
                      RECLAIMED_AT: stamp(SINCE)}, None, id="unreadable-boost"),
        pytest.param({KUEUE_PRIORITY_BOOST: "-1000", RECLAIM_REASON: "idle",
                      RECLAIMED_AT: "yesterday"}, None, id="unreadable-time"),
        pytest.param({RECLAIM_REASON: "idle", RECLAIMED_AT: stamp(SINCE)}, None,
                     id="deactivated-not-demoted"),
    ],
)
def test_only_a_demotion_of_gpustewards_reads_as_one(annotations, expected):
    assert demote.demoted_at(_wl(annotations)) == expected


def test_the_patches_set_and_remove_the_boost_and_the_record():
    set_ = demote.patch(-7, "idle", stamp(SINCE))["metadata"]["annotations"]
    assert set_ == {KUEUE_PRIORITY_BOOST: "-7", RECLAIM_REASON: "idle",
                    RECLAIMED_AT: stamp(SINCE)}
    assert demote.demoted_at(_wl(set_)) == SINCE
    assert demote.UNDO["metadata"]["annotations"] == dict.fromkeys(set_)


@pytest.mark.parametrize(
    ("fields", "bad"),
    [
        pytest.param({"reclaim": {"kueue": {"priorityBoost": 0}}}, "reclaim.kueue.priorityBoost",
                     id="zero-is-no-demotion"),
        pytest.param({"reclaim": {"kueue": {"priorityBoost": -(2**31) - 1}}},
                     "reclaim.kueue.priorityBoost", id="beyond-int32"),
        pytest.param({"reclaim": {"kueue": {"action": "suspend"}}}, "reclaim.kueue.action",
                     id="unknown-action"),
        pytest.param({"classes": {"batch": {"kueueAction": "evict"}}},
                     "classes.batch.kueueAction", id="unknown-class-action"),
    ],
)
def test_bad_kueue_fields_are_refused_by_name(fields, bad):
    with pytest.raises(PolicyError) as e:
        parse_policy(fields)
    assert bad in str(e.value)


def test_an_owner_not_demoted_is_never_undemoted():
    pod = gpu_pod("p", age=60)
    owner = Owner("Job", "ml", "p", (pod.uid,))
    assert demote.undemotions([pod], lambda _: owner, {}, lambda _: "ml") == []
