"""Queue demand from Kueue (core/reclaim/kueue.py): Workloads waiting for their ClusterQueue's
quota, read from Kueue's objects, have idle admitted Workloads of lower priority deactivated.

Object shapes follow kueue v0.17.0 apis/kueue/v1beta2 (workload_types.go: WorkloadSpec.podSets,
queueName, priority, active; WorkloadStatus.conditions, admission.clusterQueue,
podSetAssignments[].resourceUsage; clusterqueue_types.go: ResourceQuota.nominalQuota,
ClusterQueueStatus.flavorsReservation[].resources[].total; localqueue_types.go:
LocalQueueSpec.clusterQueue), as the e2e test reads them from the real Kueue."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gpusteward.core.reclaim import kueue
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import Owner, Switch
from gpusteward.core.times import stamp
from tests.unit.test_reclaim_decide import NOW, POLICY, gpu_pod, idle, snapshot

GPU = ["nvidia.com/gpu"]


def condition(kind: str, status: str, at: float, reason: str = "Pending") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": "",
            "lastTransitionTime": stamp(at)}


def workload(name: str, *, priority: int = 0, gpus: int = 1, count: int = 1,
             queue: str = "team", admitted_to: str | None = None, active: bool | None = None,
             waited: float = 600, extra: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """A Workload as Kueue writes it for a Job: one podSet named main."""
    spec: dict[str, Any] = {"queueName": queue, "priority": priority, "podSets": [{
        "name": "main", "count": count, "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "x", "resources": {
                "requests": {"nvidia.com/gpu": str(gpus)},
                "limits": {"nvidia.com/gpu": str(gpus)}}}]}}}]}
    if active is not None:
        spec["active"] = active
    status: dict[str, Any] = {"conditions": [condition("QuotaReserved", "False", NOW - waited),
                                             *extra]}
    if admitted_to is not None:
        status = {"conditions": [condition("QuotaReserved", "True", NOW - 3600, "QuotaReserved"),
                                 condition("Admitted", "True", NOW - 3600, "Admitted"), *extra],
                  "admission": {"clusterQueue": admitted_to, "podSetAssignments": [{
                      "name": "main", "flavors": {"nvidia.com/gpu": "default"},
                      "resourceUsage": {"nvidia.com/gpu": str(gpus * count)},
                      "count": count}]}}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "creationTimestamp": stamp(NOW - 7200)},
            "spec": spec, "status": status}


def cluster_queue(name: str, nominal: int, reserved: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"resourceGroups": [{
        "coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "default", "resources": [
            {"name": "nvidia.com/gpu", "nominalQuota": nominal}]}]}]},
        "status": {"flavorsReservation": [{"name": "default", "resources": [
            {"name": "nvidia.com/gpu", "total": str(reserved), "borrowed": "0"}]}]}}


def local_queue(name: str, cq: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": {"clusterQueue": cq}}


def demand(workloads: list[dict[str, Any]], queues: dict[str, tuple[int, int]] | None = None,
           ) -> kueue.KueueDemand:
    queues = queues or {"gpus": (4, 4)}
    return kueue.demand(
        msgspec.convert(workloads, list[kueue.WireWorkload]),
        msgspec.convert([local_queue("team", "gpus"), local_queue("other", "other")],
                        list[kueue.WireLocalQueue]),
        msgspec.convert([cluster_queue(n, *q) for n, q in queues.items()],
                        list[kueue.WireClusterQueue]), GPU)


def test_waiting_workloads_their_demand_and_the_quota_held_are_read_from_kueue_objects():
    d = demand([workload("want", priority=1000, gpus=2, count=2),
                workload("held", admitted_to="gpus", gpus=4),
                workload("off", active=False),
                workload("done", extra=(condition("Finished", "True", NOW, "Succeeded"),)),
                workload("nowhere", queue="missing")])
    assert [(w.pod.key, w.pod.gpus, w.pod.priority, w.cluster_queue) for w in d.waiting] == [
        ("ml/Workload/want", 4, 1000, "gpus")]  # count x GPUs per pod; priority from spec
    assert d.waiting[0].pod.unschedulable_since == NOW - 600  # since QuotaReserved=False
    assert d.waiting[0].pod.labels == {"app": "want"}
    assert d.holding == {"ml/held": kueue.Holding("gpus", 4)}
    assert d.free == {"gpus": 0}


def test_quota_held_by_a_workload_being_evicted_counts_as_free():
    d = demand([workload("going", admitted_to="gpus", gpus=3,
                         extra=(condition("Evicted", "True", NOW, "Deactivated"),))],
               {"gpus": (4, 4)})
    assert d.free == {"gpus": 3} and d.holding["ml/going"].leaving


def test_an_unreadable_quota_leaves_its_queue_alone():
    cq = cluster_queue("gpus", 4, 4)
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "1.5"
    d = kueue.demand(msgspec.convert([workload("w", priority=9)], list[kueue.WireWorkload]),
                     msgspec.convert([local_queue("team", "gpus")], list[kueue.WireLocalQueue]),
                     [msgspec.convert(cq, kueue.WireClusterQueue)], GPU)
    assert d.free == {} and len(d.waiting) == 1


def workload_pod(name: str, wl: str, priority: int = 10, gpus: int = 1, node: str = "n1"):
    pod = gpu_pod(name, node=node, gpus=gpus, priority=priority,
                  labels={"kueue.x-k8s.io/queue-name": "team"})
    owner = Owner("Job", "ml", wl, (pod.uid,), group="batch", version="v1", how="deactivate",
                  via=Switch("Workload", "kueue.x-k8s.io", "v1beta2", wl))
    return pod, owner


def kueue_plan(workloads: list[dict[str, Any]], pods, queues=None, busy=()):
    ev = {p.key: idle(peak=90 if p.name in busy else 1, gpus=p.gpus) for p, _ in pods}
    snap = snapshot([p for p, _ in pods], ev, owners={p.uid: o for p, o in pods})
    snap = msgspec.structs.replace(snap, kueue=demand(workloads, queues))
    return [(a.pod.name, a.reason, a.how) for a in plan(snap, POLICY).actions
            if a.kind == "reclaim"]


def test_an_idle_lower_priority_workload_is_deactivated_for_a_waiting_one():
    actions = kueue_plan([workload("want", priority=1000, gpus=2),
                          workload("low", admitted_to="gpus", gpus=2, priority=10),
                          workload("high", admitted_to="gpus", gpus=2, priority=5000)],
                         [workload_pod("low-0", "low", 10, 2), workload_pod("high-0", "high",
                                                                            5000, 2)])
    assert actions == [("low-0", "queue", "deactivate")]  # never the higher-priority one


@pytest.mark.parametrize(
    ("workloads", "queues", "busy"),
    [
        pytest.param([workload("want", priority=1000, waited=10)], None, (),
                     id="not-waited-enough"),
        pytest.param([workload("want", priority=10)], None, (), id="equal-priority"),
        pytest.param([workload("want", priority=1000)], None, ("low-0",), id="victim-busy"),
        pytest.param([workload("want", priority=1000)], {"gpus": (4, 3)}, (),
                     id="quota-free-already"),
        pytest.param([workload("want", priority=1000, queue="other")],
                     {"gpus": (4, 4), "other": (1, 1)}, (), id="victim-in-another-queue"),
        pytest.param([workload("want", priority=1000, gpus=8)], None, (),
                     id="not-enough-even-after"),
        pytest.param([workload("want", priority=1000, active=False)], None, (),
                     id="waiting-one-deactivated"),
        pytest.param([workload("want", priority=1000),
                      workload("going", admitted_to="gpus", priority=1,
                               extra=(condition("Evicted", "True", NOW, "Deactivated"),))],
                     None, (), id="quota-already-on-its-way"),
    ],
)
def test_kueue_demand_reclaims_only_where_the_queue_rules_allow(workloads, queues, busy):
    pods = [workload_pod("low-0", "low", 10, 4)]
    held = [workload("low", admitted_to="gpus", gpus=4, priority=10)]
    assert kueue_plan(workloads + held, pods, queues, busy) == []


def test_the_fewest_workloads_are_deactivated_and_each_once():
    pods = [workload_pod("small-0", "small", 1, 1), workload_pod("big-0", "big", 5, 3),
            workload_pod("big-1", "big", 5, 3)]
    pods[2] = (pods[2][0], msgspec.structs.replace(pods[1][1], pods=("big-0", "big-1")))
    pods[1] = (pods[1][0], pods[2][1])
    actions = kueue_plan([workload("want", priority=1000, gpus=4),
                          workload("small", admitted_to="gpus", gpus=1, priority=1),
                          workload("big", admitted_to="gpus", gpus=3, count=2, priority=5)],
                         pods, {"gpus": (8, 7)})
    assert actions == [("big-0", "queue", "deactivate")]  # 6 GPUs of quota in one action
