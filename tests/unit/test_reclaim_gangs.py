"""Gang pods are never evicted one by one: a gang is evicted whole or not at all
(core/reclaim/gangs.py, issue 29).

Shapes: the PodGroup link is Kubernetes 1.36's ``spec.schedulingGroup.podGroupName``
(k8s.io/api v0.36.3 core/v1/types.go, PodSchedulingGroup); the labels are the controllers' own
constants: Kueue v0.17 pkg/controller/jobs/pod/constants (GroupNameLabel), JobSet v0.11
api/jobset/v1alpha2 (JobSetNameKey), KubeRay v1.6 ray-operator/controllers/ray/utils/constant.go
(RayClusterLabelKey), LeaderWorkerSet v0.8 api/leaderworkerset/v1 (SetNameLabelKey,
GroupIndexLabelKey)."""

from __future__ import annotations

import json

import msgspec
import pytest

from gpusteward.core.kubewire import WirePod, WirePodGroup, to_pod
from gpusteward.core.model import Node
from gpusteward.core.owners import How
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.gangs import gang_of
from gpusteward.core.reclaim.model import IDLE_SINCE, QUEUE_BLOCKED, RECLAIM_BLOCKED, Owner
from gpusteward.core.report.sections import decisions
from tests.factories import H100
from tests.unit.test_reclaim_decide import (
    POLICY,
    gpu_pod,
    idle,
    pending,
    snapshot,
    warned,
)

GANGS = [
    pytest.param({"pod_group": "train"}, "PodGroup ml/train", id="workload-api-podgroup"),
    pytest.param({"labels": {"kueue.x-k8s.io/pod-group-name": "g"}}, "Kueue pod group ml/g",
                 id="kueue-pod-group"),
    pytest.param({"labels": {"jobset.sigs.k8s.io/jobset-name": "llm"}}, "JobSet ml/llm",
                 id="jobset"),
    pytest.param({"labels": {"ray.io/cluster": "rc", "ray.io/node-type": "worker"}},
                 "RayCluster ml/rc", id="raycluster-worker"),
    pytest.param({"labels": {"leaderworkerset.sigs.k8s.io/name": "serve",
                             "leaderworkerset.sigs.k8s.io/group-index": "2"}},
                 "LeaderWorkerSet ml/serve group 2", id="leaderworkerset-group"),
]


@pytest.mark.parametrize(("fields", "gang"), GANGS)
def test_a_due_rank_of_a_gang_not_all_due_is_blocked_and_says_which(fields, gang):
    # rank-1 is idle too, but only just marked: not due yet
    ranks = [warned("rank-0", **fields), gpu_pod("rank-1", annotations={IDLE_SINCE: "x"},
                                                  **fields)]
    p = plan(snapshot([*ranks, warned("solo")]), POLICY)
    by_pod = {a.pod.name: a for a in p.actions if a.kind in ("reclaim", "block")}
    assert (by_pod["solo"].kind, by_pod["solo"].how) == ("reclaim", "evict")
    assert by_pod["rank-0"].kind == "block" and gang_of(ranks[0]) == gang
    assert f"1 of the 2 running pods of {gang} are due (rank-0)" in by_pod["rank-0"].message
    assert "rank-1" not in by_pod


@pytest.mark.parametrize(("fields", "gang"), GANGS)
def test_a_gang_due_whole_is_evicted_whole_in_one_reclaim(fields, gang):
    ranks = [warned(f"rank-{i}", gpus=2, **fields) for i in (2, 0, 1)]
    acts = [a for a in plan(snapshot(ranks), POLICY).actions if a.kind in ("reclaim", "block")]
    (one,) = acts
    assert (one.kind, one.how, one.pod.name) == ("reclaim", "evict", "rank-0")
    assert [p.name for p in one.peers] == ["rank-1", "rank-2"]
    assert one.message == f"reclaiming 6 idle GPU(s) by eviction of all 3 pods of {gang}"
    assert one.owner.pods == ("rank-0", "rank-1", "rank-2")
    assert f"{one.owner.kind} ml/{one.owner.name}" == gang


def test_a_gang_eviction_is_one_reclaim_for_the_limits():
    policy = parse_policy({"reclaim": {"limits": {"maxPerCycle": 1}}})
    ranks = [warned(f"rank-{i}", pod_group="train") for i in range(4)]
    p = plan(snapshot([*ranks, warned("solo")]), policy)
    reclaims = [a for a in p.actions if a.kind == "reclaim"]
    held = [(a.pod.name, why) for a, why in p.held_back]
    # one of the two passes the limit of one per cycle: the whole gang, or the solo pod
    assert len(reclaims) == 1 and len(held) == 1, (reclaims, held)
    assert {reclaims[0].pod.name, held[0][0]} == {"rank-0", "solo"}


def test_a_protected_rank_keeps_its_whole_gang():
    ranks = [warned("rank-0", pod_group="train"), warned("rank-1", pod_group="train",
                                                         priority=1_000_000)]
    acts = plan(snapshot(ranks), POLICY).actions  # priority 1,000,000: protected by default
    assert not [a for a in acts if a.kind == "reclaim"]
    (block,) = [a for a in acts if a.kind == "block"]
    assert block.pod.name == "rank-0" and "1 of the 2 running pods" in block.message


def test_the_block_is_said_once_the_pod_carries_it():
    rank, busy = warned("rank-0", pod_group="train"), gpu_pod("rank-1", pod_group="train")
    ev = {rank.key: idle(), busy.key: idle(peak=90.0)}
    first = next(a for a in plan(snapshot([rank, busy], ev), POLICY).actions
                 if a.kind == "block")
    said = warned("rank-0", pod_group="train",
                  annotations={RECLAIM_BLOCKED: first.message.partition(": ")[2]})
    assert [a.kind for a in plan(snapshot([said, busy], ev), POLICY).actions] == []


def test_one_idle_rank_of_a_busy_eight_pod_gang_is_never_evicted():
    ranks = [warned(f"rank-{i}", pod_group="train") for i in range(8)]
    ev = {r.key: idle(peak=95.0) for r in ranks}
    ev["ml/rank-3"] = idle()
    acts = plan(snapshot(ranks, ev), POLICY).actions
    assert [a for a in acts if a.kind == "reclaim"] == []
    assert [(a.kind, a.pod.name) for a in acts if a.kind == "block"] == [("block", "rank-3")]


def test_a_gang_stopped_through_its_owners_switch_is_still_reclaimed_whole():
    # A JobSet with a suspend switch: the owner is acted on once, as before (GROUP_ACTIONS).
    owner = Owner("JobSet", "ml", "llm", pods=("r0", "r1"), group="jobset.x-k8s.io/v1alpha2",
                  how=How.SUSPEND)
    labels = {"jobset.sigs.k8s.io/jobset-name": "llm"}
    pods = [warned("r0", labels=labels), warned("r1", labels=labels)]
    acts = [a for a in plan(snapshot(pods, owners={"r0": owner, "r1": owner}), POLICY).actions
            if a.kind == "reclaim"]
    assert [(a.how, a.owner.name) for a in acts] == [("suspend", "llm")]


def test_a_waiting_pod_never_takes_one_pod_of_a_gang():
    gang = gpu_pod("rank-0", node="n1", gpus=4, priority=10, pod_group="train")
    plain = gpu_pod("low", node="n2", gpus=4, priority=10)
    want = pending("want", 4, 1000)
    p = plan(snapshot([gang, plain, want], nodes=[Node("n1", H100, 4), Node("n2", H100, 4)]),
             POLICY)
    assert [(a.pod.name, a.reason) for a in p.actions if a.kind == "reclaim"] == [
        ("low", "queue")]
    alone = plan(snapshot([gang, want], nodes=[Node("n1", H100, 4)]), POLICY)
    assert [a for a in alone.actions if a.kind == "reclaim"] == []


def test_the_api_servers_pod_group_link_is_read_from_the_pod():
    # spec.schedulingGroup as a 1.36 API server serves it (GenericWorkload on).
    wire = msgspec.json.decode(msgspec.json.encode({
        "metadata": {"name": "rank-0", "namespace": "ml", "uid": "u1"},
        "spec": {"nodeName": "n1", "schedulingGroup": {"podGroupName": "train-0"},
                 "containers": [{"name": "c", "resources": {
                     "limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}}), type=WirePod)
    pod = to_pod(wire, ["nvidia.com/gpu"])
    assert pod.pod_group == "train-0" and gang_of(pod) == "PodGroup ml/train-0"
    bare = msgspec.json.decode(b'{"metadata": {"name": "p"}, "spec": {}}', type=WirePod)
    assert to_pod(bare, ["nvidia.com/gpu"]).pod_group is None
    assert gang_of(to_pod(bare, ["nvidia.com/gpu"])) is None


def test_a_1_35_pods_workload_ref_names_its_gang():
    # spec.workloadRef as a 1.35 API server serves it (k8s.io/api v0.35.3 core/v1
    # WorkloadReference; 1.36 replaced it with schedulingGroup, keeping tag 42 reserved).
    wire = msgspec.json.decode(msgspec.json.encode({
        "metadata": {"name": "rank-1", "namespace": "ml", "uid": "u2"},
        "spec": {"nodeName": "n1", "workloadRef": {"name": "train", "podGroup": "workers",
                                                  "podGroupReplicaKey": "0"},
                 "containers": [{"name": "c", "resources": {
                     "limits": {"nvidia.com/gpu": "1"}}}]}}), type=WirePod)
    pod = to_pod(wire, ["nvidia.com/gpu"])
    assert gang_of(pod) == "Workload group ml/train/workers/0"
    p = plan(snapshot([warned("rank-1", workload_group=pod.workload_group)]), POLICY)
    assert [(a.kind, a.message) for a in p.actions] == [
        ("reclaim", "reclaiming 1 idle GPU(s) by eviction of all 1 pods of "
                    "Workload group ml/train/workers/0")]


def waiting_gang(size: int, group: str = "big") -> list:
    return [pending(f"{group}-{i}", 1, 1000, pod_group=group) for i in range(size)]


def queue_victims(p) -> list[str]:
    return sorted(a.pod.name for a in p.actions if a.kind == "reclaim" and a.reason == "queue")


@pytest.mark.parametrize(("idle_pods", "freed"), [
    pytest.param(3, [], id="three-of-four-freeable-frees-none"),
    pytest.param(4, ["low-0", "low-1", "low-2", "low-3"], id="four-freeable-frees-four"),
])
def test_a_waiting_gang_gets_gpus_only_when_all_of_it_can_be_placed(idle_pods, freed):
    # One 4-GPU node full of 1-GPU pods of low priority; a 4-pod gang of higher priority waits.
    held = [gpu_pod(f"low-{i}", priority=10) for i in range(4)]
    ev = {h.key: idle() if i < idle_pods else idle(peak=90.0) for i, h in enumerate(held)}
    gang = waiting_gang(4)
    p = plan(snapshot([*held, *gang], ev, nodes=[Node("n1", H100, 4)]), POLICY)
    assert queue_victims(p) == freed
    reserved = sorted(a.pod.name for a in p.actions if a.kind == "reserve")
    assert reserved == ([f"big-{i}" for i in range(4)] if freed else [])
    # Held back, it says why on its first pod (and in an Event): 3 of 4 could be placed.
    notes = [(a.pod.name, a.message) for a in p.actions if a.kind == "block"]
    assert notes == ([] if freed else [("big-0", f"GPUs not freed: {SHORT}")])


SHORT = ("3 of the 4 waiting pods of PodGroup ml/big could be placed (freeing 3 idle GPU(s)); "
         "the scheduler starts a gang only once the pods it needs fit (all of them, or its "
         "PodGroup's minCount), so gpusteward frees GPUs for it only then: none freed")


def test_a_waiting_gangs_note_is_said_once_and_only_where_idle_gpus_could_help():
    held = [gpu_pod(f"low-{i}", priority=10) for i in range(4)]
    ev = {h.key: idle() if i < 3 else idle(peak=90.0) for i, h in enumerate(held)}
    gang = waiting_gang(4)
    noted = msgspec.structs.replace(gang[0], annotations={QUEUE_BLOCKED: SHORT})
    p = plan(snapshot([*held, noted, *gang[1:]], ev, nodes=[Node("n1", H100, 4)]), POLICY)
    assert [a for a in p.actions if a.kind == "block"] == []
    busy = {h.key: idle(peak=90.0) for h in held}  # nothing idle: it waits like any pod
    p = plan(snapshot([*held, *gang], busy, nodes=[Node("n1", H100, 4)]), POLICY)
    assert [a for a in p.actions if a.kind == "block"] == []


def noted_plan(gang: list, evidence: dict, policy=POLICY, held_idle: int = 3):
    """n1 holds four low-priority pods (``held_idle`` of them idle); n2 exactly the gang's
    bound pods."""
    held = [gpu_pod(f"low-{i}", priority=10) for i in range(4)]
    ev = {h.key: evidence.get(h.name, idle() if i < held_idle else idle(peak=90.0))
          for i, h in enumerate(held)}
    bound = sum(1 for m in gang if m.node)
    return plan(snapshot([*held, *gang], ev, nodes=[Node("n1", H100, 4), Node("n2", H100, bound)]),
                policy)


def unblocked(p) -> list[str]:
    return [a.pod.name for a in p.actions if a.kind == "unblock"]


@pytest.mark.parametrize("case", ["idle-gpus-gone", "gang-placed", "another-pod-first",
                                  "queue-turned-off"])
def test_a_queue_note_that_no_longer_holds_goes(case):
    # The note stayed where it was written: it must not tell a placed gang, or a gang no idle
    # GPU would help any more, that GPUs are being held back for it.
    gang = waiting_gang(4)
    noted = msgspec.structs.replace(gang[0], annotations={QUEUE_BLOCKED: SHORT})
    members, evidence, policy = [noted, *gang[1:]], {}, POLICY
    if case == "idle-gpus-gone":
        evidence = {f"low-{i}": idle(peak=90.0) for i in range(4)}
    elif case == "gang-placed":
        members = [msgspec.structs.replace(m, node="n2", phase="Running") for m in members]
    elif case == "another-pod-first":  # big-0 left the queue; big-1 is first now
        members = [msgspec.structs.replace(noted, node="n2", phase="Running"), *gang[1:]]
    else:
        policy = parse_policy({"queue": {"enabled": False}})
    p = noted_plan(members, evidence, policy)
    assert unblocked(p) == ["big-0"]
    [a] = [a for a in p.actions if a.kind == "unblock"]
    assert a.message == f"queue note no longer holds: {SHORT}"


def test_the_report_shows_no_unblock_as_a_pods_decision():
    # A placed gang's stale note goes, but the report's action column says what the reclaimer
    # decides about the pod's GPUs, not that housekeeping.
    placed = [msgspec.structs.replace(m, node="n2", phase="Running") for m in waiting_gang(4)]
    placed[0] = msgspec.structs.replace(placed[0], annotations={QUEUE_BLOCKED: SHORT})
    held = [gpu_pod(f"low-{i}", priority=10) for i in range(4)]
    snap = snapshot([*held, *placed], {}, nodes=[Node("n1", H100, 4), Node("n2", H100, 4)])
    assert unblocked(plan(snap, POLICY)) == ["big-0"]
    assert decisions(snap, POLICY)["ml/big-0"].action != "unblock"


def test_a_queue_note_that_holds_stays_and_a_reservation_takes_it_off_itself():
    gang = waiting_gang(4)
    noted = msgspec.structs.replace(gang[0], annotations={QUEUE_BLOCKED: SHORT})
    assert unblocked(noted_plan([noted, *gang[1:]], {})) == []
    # All four idle now: the gang is freed for and reserved; the RESERVE write clears the note.
    p = noted_plan([noted, *gang[1:]], {}, held_idle=4)
    assert "big-0" in [a.pod.name for a in p.actions if a.kind == "reserve"]
    assert unblocked(p) == []


@pytest.mark.parametrize(("min_count", "running", "freed"), [
    pytest.param(3, 0, 3, id="min-count-3-of-4-frees-3"),
    pytest.param(3, 1, 2, id="one-running-already-frees-2"),
    pytest.param(4, 0, 0, id="min-count-4-with-3-idle-frees-none"),
    pytest.param(2, 2, 0, id="min-count-met-frees-none-for-the-rest"),
])
def test_a_waiting_gang_needs_only_its_pod_groups_min_count(min_count, running, freed):
    # PodGroup spec.schedulingPolicy.gang.minCount (k8s.io/api v0.36.3 scheduling/v1alpha2):
    # the scheduler places the group once that many of its pods fit at once, so the demand
    # is minCount less the pods already bound, not every waiting pod.
    held = [gpu_pod(f"low-{i}", priority=10) for i in range(4)]
    ev = {h.key: idle() if i < 3 else idle(peak=90.0) for i, h in enumerate(held)}
    bound = [gpu_pod(f"big-r{i}", node="n2", pod_group="big") for i in range(running)]
    snap = snapshot([*held, *bound, *waiting_gang(4)], ev,
                    nodes=[Node("n1", H100, 4), Node("n2", H100, running)])
    snap = msgspec.structs.replace(snap, min_counts={"PodGroup ml/big": min_count})
    p = plan(snap, POLICY)
    assert len(queue_victims(p)) == freed
    assert len([a for a in p.actions if a.kind == "reserve"]) == freed
    # Short of its minCount, it says how many it needs; met, it needs nothing and says nothing.
    notes = [a.message for a in p.actions if a.kind == "block"]
    need = min_count - running
    assert notes == ([f"GPUs not freed: 3 of the {need} waiting pods of PodGroup ml/big could "
                      "be placed (freeing 3 idle GPU(s)); the scheduler starts a gang only once "
                      "the pods it needs fit (all of them, or its PodGroup's minCount), so "
                      "gpusteward frees GPUs for it only then: none freed"]
                     if not freed and need > 0 else [])


def test_a_pod_groups_min_count_is_read_as_the_api_server_serves_it():
    # scheduling.k8s.io/v1alpha2 PodGroup, as k8s.io/api v0.36.3 scheduling/v1alpha2 types.go
    # defines it: a gang policy's minCount; the basic policy has none.
    gang = msgspec.json.decode(json.dumps({
        "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
        "metadata": {"name": "big", "namespace": "ml", "uid": "u1"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}},
        "status": {"conditions": []}}), type=WirePodGroup)
    basic = msgspec.json.decode(json.dumps({
        "metadata": {"name": "b", "namespace": "ml"},
        "spec": {"schedulingPolicy": {"basic": {}}}}), type=WirePodGroup)
    assert (gang.min_count, basic.min_count) == (3, None)


def test_a_gang_pod_that_fits_in_free_gpus_takes_them_and_the_rest_get_victims():
    held = [gpu_pod("low-0", priority=10), gpu_pod("low-1", priority=10)]
    gang = waiting_gang(3)  # n1: 2 GPUs held by idle pods, 1 free
    p = plan(snapshot([*held, *gang], nodes=[Node("n1", H100, 3)]), POLICY)
    assert queue_victims(p) == ["low-0", "low-1"]


def test_a_plain_pod_after_a_gang_that_cannot_be_helped_still_is():
    held = [gpu_pod(f"low-{i}", priority=10) for i in range(2)]
    p = plan(snapshot([*held, *waiting_gang(3), pending("one", 1, 500)],
                      nodes=[Node("n1", H100, 2)]), POLICY)
    assert queue_victims(p) == ["low-0"]  # the gang needs 3 and gets none; "one" needs 1


def test_a_limit_that_cannot_pass_all_of_a_gangs_victims_passes_none():
    held = [gpu_pod(f"low-{i}", priority=10) for i in range(4)]
    capped = parse_policy({"reclaim": {"limits": {"maxPerCycle": 3}}})
    p = plan(snapshot([*held, *waiting_gang(4)], nodes=[Node("n1", H100, 4)]), capped)
    assert queue_victims(p) == []
    assert [a for a in p.actions if a.kind == "reserve"] == []
    assert sorted((a.pod.name, why) for a, why in p.held_back) == [
        (f"low-{i}", "limit: 3 per cycle (a waiting gang needs 4)") for i in range(4)]
    roomy = parse_policy({"reclaim": {"limits": {"maxPerCycle": 4}}})
    p = plan(snapshot([*held, *waiting_gang(4)], nodes=[Node("n1", H100, 4)]), roomy)
    assert len(queue_victims(p)) == 4
