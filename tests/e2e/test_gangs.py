"""Gangs on the Workload API of the pinned Kubernetes release (1.36: GenericWorkload and
GangScheduling, scheduling.k8s.io/v1alpha2), in a sandbox of their own: its kube-scheduler
runs the GangScheduling plugin beside gpusteward's extender, and places a PodGroup's pods all
or nothing; gpusteward reclaims a gang whole or not at all (issue 29).

Shapes: PodGroup as k8s.io/api v0.36.3 scheduling/v1alpha2 types.go defines it
(spec.schedulingPolicy.gang.minCount); each pod linked by spec.schedulingGroup.podGroupName
(core/v1 PodSchedulingGroup), as the Job controller links the pods it creates for a Workload.

The same rules on an owner-defined gang, a JobSet run by the real JobSet controller
(sigs.k8s.io/jobset v0.8.2, its CRDs and webhooks from the same module): its pods carry
jobset.sigs.k8s.io/jobset-name (api/jobset/v1alpha2 JobSetNameKey) and no PodGroup, so the
scheduler places them one by one; gpusteward still judges, stops and frees for them as one.
"""

from __future__ import annotations

import itertools
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from gpusteward.adapters.policyfile import load_policy
from gpusteward.core.model import RESERVED
from gpusteward.core.reclaim.model import (
    IDLE_SINCE,
    QUEUE_BLOCKED,
    RECLAIM_AT,
    RECLAIM_BLOCKED,
    RECLAIM_REASON,
)
from gpusteward.core.typedconfig import Duration
from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e import kube
from tests.e2e.kube import Namespace, gpu_pod
from tests.support.sandbox import fresh_namespace, started

PODGROUPS = "/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
TIMEOUT = 150.0  # mark, warn (4 s grace) and act over a 15 s window, on a loaded machine


@pytest.fixture(scope="module")
def gang_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    # The scheduler's own preemption off: what frees GPUs for a waiting gang here is
    # gpusteward's queue enforcement alone.
    yield from started(tmp_path_factory, "gangs", workload_api=True, preemption=False,
                       with_controllers=("jobset",))


@pytest.fixture
def gang_ns(gang_box: Sandbox) -> Iterator[Namespace]:
    yield from fresh_namespace(gang_box.api(), "gang", owners=(JOBSETS,))


def gang(ns: Namespace, name: str, utils: list[str]) -> list[str]:
    """A PodGroup of len(utils) one-GPU pods, gang-scheduled (minCount: all of them), each
    labelled gang=<name>."""
    ns.api.create(PODGROUPS.format(ns=ns.name), {
        "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": len(utils)}}}})
    pods = []
    for i, util in enumerate(utils):
        pod = gpu_pod(f"{name}-{i}", 1, util=util, labels={"gang": name})
        pod["spec"]["schedulingGroup"] = {"podGroupName": name}
        ns.create_pod(pod)
        pods.append(pod["metadata"]["name"])
    for p in pods:
        ns.running(p, timeout=90)
    return pods


def budget(ns: Namespace, name: str, selector: dict, min_available: int) -> None:
    """A PodDisruptionBudget; the real disruption controller fills in its status."""
    ns.api.create(f"/apis/policy/v1/namespaces/{ns.name}/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
        "spec": {"minAvailable": min_available, "selector": selector}})


async def test_an_eight_pod_gang_with_one_idle_rank_is_never_evicted_an_idle_gang_is_whole(
        gang_box: Sandbox, gang_ns: Namespace, reclaimer) -> None:
    ranks = gang(gang_ns, "train", ["95"] * 3 + ["0"] + ["95"] * 4)
    idle_gang = gang(gang_ns, "idle", ["0", "0"])
    # Wholly idle too, but a budget over its pods allows one eviction of the two: the
    # Eviction API would pass the first pod and refuse the second.
    guarded = gang(gang_ns, "guarded", ["0", "0"])
    budget(gang_ns, "guarded", {"matchExpressions": [
        {"key": "gang", "operator": "In", "values": ["guarded"]}]}, 1)
    gang_ns.create_pod(gpu_pod("solo", 1, util="0"))
    gang_ns.running("solo")
    # The API server kept the link: the alpha field is served with the gate on.
    assert gang_ns.pod("train-3")["spec"]["schedulingGroup"] == {"podGroupName": "train"}
    kube.wait_for_gpu_samples(gang_box.prometheus_url, gang_ns.name,
                              [*ranks, *idle_gang, *guarded, "solo"], settle=0)
    rec = await reclaimer("enforce", box=gang_box)
    # The plain idle pod and the idle gang are evicted at their deadline, the gang all at
    # once; the idle rank reaches its deadline too, and is blocked instead, saying why; the
    # guarded gang is held by its budget, whole.
    def settled() -> bool:
        return all(kube.gone(gang_ns, p) for p in ("solo", *idle_gang)) and (
            RECLAIM_BLOCKED in kube.annotations(gang_ns, "train-3")) and (
            "GPUReclaimBlocked" in kube.reasons(gang_ns, guarded[0]))

    await kube.cycle_until(rec, "evictions of the plain pod and the idle gang, the blocks",
                           settled, timeout=TIMEOUT)
    assert not any(kube.gone(gang_ns, p) for p in (*ranks, *guarded))
    blocked = kube.annotations(gang_ns, "train-3")[RECLAIM_BLOCKED]
    assert f"1 of the 8 running pods of PodGroup {gang_ns.name}/train are due (train-3)" in (
        blocked), blocked
    assert "GPUReclaimBlocked" in kube.reasons(gang_ns, "train-3")
    assert RECLAIM_AT in kube.annotations(gang_ns, "train-3")  # warned like any idle pod
    # The busy ranks were never even marked.
    assert not any(RECLAIM_AT in kube.annotations(gang_ns, p) for p in ranks if p != "train-3")
    # One decision for the idle gang: one GPUReclaimed Event, on its first pod, naming both.
    said = [m for r, m in kube.events(gang_ns, "idle-0") if r == "GPUReclaimed"]
    assert said == [f"reclaiming 2 idle GPU(s) by eviction of all 2 pods of PodGroup "
                    f"{gang_ns.name}/idle"], said
    assert "GPUReclaimed" not in kube.reasons(gang_ns, "idle-1")
    # The guarded gang: neither pod's reason was written, so neither was asked to go.
    assert not any(RECLAIM_REASON in kube.annotations(gang_ns, p) for p in guarded)


def test_a_gang_short_of_its_min_count_is_not_placed(gang_ns: Namespace) -> None:
    # The GangScheduling plugin holds a group's pods until minCount of them exist, then places
    # them together: two pods of a gang of three stay unbound.
    gang_ns.api.create(PODGROUPS.format(ns=gang_ns.name), {
        "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
        "metadata": {"name": "short"}, "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}})
    for i in range(2):
        pod = gpu_pod(f"short-{i}", 1, util="0")
        pod["spec"]["schedulingGroup"] = {"podGroupName": "short"}
        gang_ns.create_pod(pod)
    time.sleep(5)  # a plain pod binds within a second here
    assert [gang_ns.pod(f"short-{i}")["spec"].get("nodeName") for i in range(2)] == [None, None]
    pod = gpu_pod("short-2", 1, util="0")
    pod["spec"]["schedulingGroup"] = {"podGroupName": "short"}
    gang_ns.create_pod(pod)
    for i in range(3):
        gang_ns.running(f"short-{i}", timeout=90)


PRIORITIES = {"gang-low": 100, "gang-high": 10000}
L4 = ("l4-0", "l4-1", "l4-2")  # the sandbox's 3 L4 nodes, 4 GPUs each


def long_grace(box: Sandbox):
    """The sandbox's policy with an hour's grace: idle pods are warned, not evicted, in these
    tests; only queue enforcement (no grace) frees GPUs."""
    base = load_policy(box.cfg.policy)
    idle = msgspec.structs.replace(base.reclaim.idle, grace=Duration(3600))
    return msgspec.structs.replace(base, reclaim=msgspec.structs.replace(base.reclaim, idle=idle))


def l4s_held(box: Sandbox, ns: Namespace) -> list[str]:
    """Every L4 GPU held by a low-priority pod, the first three idle, the rest busy."""
    kube.apply_priority_classes(box.api(), PRIORITIES)
    held = [f"low-{n}-{k}" for n in L4 for k in range(4)]
    for i, name in enumerate(held):
        ns.create_pod(gpu_pod(name, 1, node=L4[i // 4], util="0" if i < 3 else "90",
                              priority_class="gang-low"))
    for name in held:
        ns.running(name)
    kube.wait_for_gpu_samples(box.prometheus_url, ns.name, held, settle=0)
    return held


async def freed_only_for_all(box: Sandbox, ns: Namespace, reclaimer, held: list[str],
                             ranks: Callable[[], list[str]], gang: str) -> None:
    """A waiting gang of four L4 pods (``ranks()``; ``gang``: its name, as in its note), the
    L4s held as l4s_held leaves them: with three idle GPUs nothing is freed (it would help
    none of the gang) and its first pod says so; with none idle the note goes (it no longer
    holds); once four are idle all four are freed and the gang runs on them."""
    wait_for("the gang to be unschedulable", lambda: len(ranks()) == 4 and all(
        unschedulable(ns, r) for r in ranks()), timeout=60)
    rec = await reclaimer("enforce", box=box, policy=long_grace(box))
    # Judged idle (marked), which the queue's candidates must be too.
    await kube.cycle_until(rec, "the three idle pods judged idle", lambda: all(
        IDLE_SINCE in kube.annotations(ns, p) for p in held[:3]), timeout=TIMEOUT)
    await kube.cycle_for(rec, 6)
    assert not any(kube.gone(ns, p) for p in held)
    assert not any(RESERVED in kube.annotations(ns, r) for r in ranks())
    (noted,) = [r for r in ranks() if QUEUE_BLOCKED in kube.annotations(ns, r)]
    why = kube.annotations(ns, noted)[QUEUE_BLOCKED]
    assert why.startswith(f"3 of the 4 waiting pods of {gang} could be placed (freeing 3 idle "
                          "GPU(s))"), why
    # Written when the note changes, not at each cycle that finds the gang short. Under load
    # the three are judged idle a cycle or two apart, so a first note may say 1 or 2 of the 4.
    blocked = [m for r, m in kube.events(ns, noted) if r == "GPUReclaimBlocked"]
    assert blocked and blocked[-1] == f"GPUs not freed: {why}", blocked
    assert all(a != b for a, b in itertools.pairwise(blocked)), blocked
    assert all(re.fullmatch(rf"GPUs not freed: ([123]) of the 4 waiting pods of {re.escape(gang)} "
                            rf"could be placed \(freeing \1 idle GPU\(s\)\).*", m)
               for m in blocked), blocked
    # The three go busy: no idle GPU would help the gang now, so the note no longer holds.
    kube.set_util(ns, held[:3], "90")
    await kube.cycle_until(rec, "the stale note taken off", lambda: QUEUE_BLOCKED not in
                           kube.annotations(ns, noted), timeout=TIMEOUT)
    # The three turn busy a scrape apart, so a cycle between may rewrite the note for the one
    # or two still idle; the Event names the note as it last stood.
    (cleared,) = [m for r, m in kube.events(ns, noted) if r == "GPUQueueNoteCleared"]
    assert re.fullmatch(rf"queue note no longer holds: ([123]) of the 4 waiting pods of "
                        rf"{re.escape(gang)} could be placed \(freeing \1 idle GPU\(s\)\).*",
                        cleared), cleared
    kube.set_util(ns, held[:4], "0")
    await kube.cycle_until(rec, "four idle pods freed for the gang", lambda: all(
        kube.gone(ns, p) for p in held[:4]), timeout=TIMEOUT)
    for r in ranks():
        ns.running(r, timeout=90)
    assert QUEUE_BLOCKED not in kube.annotations(ns, noted)  # and freeing wrote none back
    assert {ns.pod(r)["spec"]["nodeName"] for r in ranks()} <= set(L4)
    assert not any(kube.gone(ns, p) for p in held[4:])  # the busy ones stay


def waiting_group(ns: Namespace, name: str, size: int, min_count: int) -> list[str]:
    """A PodGroup of ``size`` high-priority one-GPU L4 pods, gang-scheduled at ``min_count``."""
    ns.api.create(PODGROUPS.format(ns=ns.name), {
        "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}})
    ranks = [f"{name}-{i}" for i in range(size)]
    for rank in ranks:
        pod = gpu_pod(rank, 1, cards="NVIDIA-L4", priority_class="gang-high")
        pod["spec"]["schedulingGroup"] = {"podGroupName": name}
        ns.create_pod(pod)
    return ranks


async def test_a_waiting_gang_gets_gpus_only_when_all_of_it_can_be_placed(
        gang_box: Sandbox, gang_ns: Namespace, reclaimer) -> None:
    held = l4s_held(gang_box, gang_ns)
    ranks = waiting_group(gang_ns, "waiting", 4, min_count=4)
    await freed_only_for_all(gang_box, gang_ns, reclaimer, held, lambda: ranks,
                             f"PodGroup {gang_ns.name}/waiting")


async def test_a_waiting_gang_needs_its_min_count_placed_not_every_pod(
        gang_box: Sandbox, gang_ns: Namespace, reclaimer) -> None:
    # minCount 3 of 4 pods: GangScheduling places the group once 3 fit at once, so 3 idle
    # GPUs are enough; the reclaimer reads the minCount from the PodGroup (a LIST it makes
    # only when a waiting pod names one).
    held = l4s_held(gang_box, gang_ns)
    ranks = waiting_group(gang_ns, "fewer", 4, min_count=3)
    wait_for("the gang to be unschedulable", lambda: all(
        unschedulable(gang_ns, r) for r in ranks), timeout=60)
    rec = await reclaimer("enforce", box=gang_box, policy=long_grace(gang_box))
    await kube.cycle_until(rec, "three idle pods freed for the gang's minCount", lambda: all(
        kube.gone(gang_ns, p) for p in held[:3]), timeout=TIMEOUT)
    wait_for("three of its pods running", lambda: sum(
        gang_ns.pod(r)["status"].get("phase") == "Running" for r in ranks) == 3, timeout=90)
    assert not any(kube.gone(gang_ns, p) for p in held[3:])  # the busy ones stay
    assert not any(QUEUE_BLOCKED in kube.annotations(gang_ns, r) for r in ranks)


def jobset(ns: Namespace, name: str, replicas: int, util: str, **pod: Any) -> Callable[
        [], list[str]]:
    """A JobSet of one replicated job: ``replicas`` Jobs of one 1-GPU pod each (jobset_types.go
    ReplicatedJob: name, replicas, a batch/v1 JobTemplateSpec; the JobSet webhook defaults the
    rest). Returns: its pods' names now, as the controller named them, by name."""
    shape = gpu_pod("x", 1, util=util, **pod)
    ns.api.create(JOBSETS.format(ns=ns.name), {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
        "spec": {"replicatedJobs": [{"name": "rank", "replicas": replicas, "template": {
            "spec": {"template": {"metadata": {"annotations": shape["metadata"]["annotations"]},
                                  "spec": shape["spec"]}}}}]}})
    return lambda: sorted(p["metadata"]["name"] for p in ns.pods() if (
        p["metadata"].get("labels") or {}).get(JOBSET_NAME) == name
        and "deletionTimestamp" not in p["metadata"])


def suspended(ns: Namespace, name: str) -> bool:
    return bool(ns.api.get(f"{JOBSETS.format(ns=ns.name)}/{name}")["spec"].get("suspend"))


async def test_a_jobset_with_one_idle_rank_is_kept_a_wholly_idle_one_suspended_whole(
        gang_box: Sandbox, gang_ns: Namespace, reclaimer) -> None:
    ns = gang_ns
    train, idle = jobset(ns, "train", 8, "95"), jobset(ns, "idle", 2, "0")
    wait_for("both JobSets' pods", lambda: len(train()) == 8 and len(idle()) == 2, timeout=120)
    for p in (*train(), *idle()):
        ns.running(p, timeout=90)
    stuck, *busy = train()
    kube.set_util(ns, [stuck], "0")
    kube.wait_for_gpu_samples(gang_box.prometheus_url, ns.name, [*train(), *idle()], settle=0)
    rec = await reclaimer("enforce", box=gang_box)
    # The idle JobSet is stopped through its switch, all of it; its controller deletes the pods.
    await kube.cycle_until(rec, "the idle JobSet suspended and the stuck rank warned", lambda: (
        suspended(ns, "idle") and RECLAIM_AT in kube.annotations(ns, stuck)), timeout=TIMEOUT)
    await kube.cycle_for(rec, 8)  # well past the 4 s grace of the stuck rank
    assert not suspended(ns, "train")
    assert train() == sorted([stuck, *busy]) and not any(kube.gone(ns, p) for p in train())
    assert not any(RECLAIM_AT in kube.annotations(ns, p) for p in busy)
    wait_for("the idle JobSet's pods deleted", lambda: not idle(), timeout=120)


async def test_a_waiting_jobset_gets_gpus_only_when_all_of_it_can_be_placed(
        gang_box: Sandbox, gang_ns: Namespace, reclaimer) -> None:
    # No PodGroup: the scheduler would place its pods one by one on whatever is freed, but a
    # JobSet only runs whole, so gpusteward frees for all of it or for none.
    held = l4s_held(gang_box, gang_ns)
    ranks = jobset(gang_ns, "waiting", 4, "80", cards="NVIDIA-L4", priority_class="gang-high")
    await freed_only_for_all(gang_box, gang_ns, reclaimer, held, ranks,
                             f"JobSet {gang_ns.name}/waiting")


def unschedulable(ns: Namespace, name: str) -> bool:
    return any(c.get("reason") == "Unschedulable"
               for c in ns.pod(name)["status"].get("conditions") or [])


@pytest.fixture
def scheduler_preempting(gang_box: Sandbox) -> Iterator[None]:
    """The gang sandbox's scheduler with DefaultPreemption on, put back as the module's other
    tests want it (off) after."""
    gang_box.restart_scheduler(preemption=True, preempt_verb=True)
    yield
    gang_box.restart_scheduler(preemption=False)


def full_l4s(ns: Namespace) -> None:
    """Every L4 GPU held by a busy low-priority pod."""
    held = [f"low-{n}-{k}" for n in L4 for k in range(4)]
    for i, name in enumerate(held):
        ns.create_pod(gpu_pod(name, 1, node=L4[i // 4], util="90", priority_class="gang-low"))
    for name in held:
        ns.running(name)


def preempt_calls(box: Sandbox) -> float:
    prefix = 'gpusteward_extender_requests_total{code="200",verb="preempt"}'
    with urllib.request.urlopen(f"{box.extender_url}/metrics", timeout=5) as resp:
        return sum(float(line.rsplit(" ", 1)[1]) for line in resp.read().decode().splitlines()
                   if line.startswith(prefix))


def test_a_gangs_pods_preempted_for_one_by_one_ask_the_extenders_preempt_verb(
        gang_box: Sandbox, gang_ns: Namespace, scheduler_preempting: None) -> None:
    # docs/operations.md, "Gangs and the scheduler's preemption": in a pod group's cycle each
    # pod is still scheduled by schedulingAlgorithm (schedule_one_podgroup.go
    # podGroupPodSchedulingAlgorithm), whose PostFilter is DefaultPreemption, which asks every
    # extender that supports preemption (framework/preemption/preemption.go, ProcessPreemption).
    kube.apply_priority_classes(gang_box.api(), PRIORITIES)
    full_l4s(gang_ns)
    before = preempt_calls(gang_box)
    gang_ns.api.create(PODGROUPS.format(ns=gang_ns.name), {
        "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
        "metadata": {"name": "urgent"}, "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}})
    for i in range(2):
        pod = gpu_pod(f"urgent-{i}", 1, cards="NVIDIA-L4", priority_class="gang-high")
        pod["spec"]["schedulingGroup"] = {"podGroupName": "urgent"}
        gang_ns.create_pod(pod)
    for i in range(2):  # the scheduler preempts two low pods, then places the gang
        gang_ns.running(f"urgent-{i}", timeout=120)
    assert preempt_calls(gang_box) > before
