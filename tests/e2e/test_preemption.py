"""The real kube-scheduler's DefaultPreemption, steered by the extender's preempt verb.

Two candidate nodes, h100-0 and h100-1 (8 GPUs each, the only H100s of the default fleet), each
full with one lower-priority 8-GPU pod; a higher-priority 8-GPU pod that accepts only H100s
must preempt one of them. Left to itself the scheduler preempts, among equal candidates, the
victim that started last (pickOneNodeForPreemption in
pkg/scheduler/framework/preemption/preemption.go); the verb makes it take the idle one.
The DCGM simulator reads each pod's utilization from its sandbox.gpusteward.io/gpu-util
annotation; the sandbox policy judges idleness over 15 s.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest

from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e.kube import (
    apply_priority_classes,
    cycle_until,
    events,
    gone,
    gpu_pod,
    reasons,
    wait_for_gpu_samples,
)

PRIORITIES = {"gpu-low": 100, "gpu-high": 10000}
H100 = "NVIDIA-H100*"
IDLE_WINDOW = 15.0  # sandbox/policy.yaml reclaim.idle.window


@pytest.fixture(scope="module", autouse=True)
def priority_classes(sandbox):
    apply_priority_classes(sandbox.api(), PRIORITIES)


def victim(name: str, node: str, util: str, **kw) -> dict:
    return gpu_pod(name, 8, node=node, util=util, priority_class="gpu-low", **kw)


def two_full_nodes(box, ns, *, idle: str = "h100-1", busy: str = "h100-0", **kw) -> None:
    """The idle victim starts first, the busy one a second later: the scheduler's own order
    (latest start time) would preempt the busy one."""
    ns.create_pod(victim("idle", idle, "0", **kw.get("idle_kw", {})))
    ns.running("idle")
    time.sleep(1.1)  # status.startTime has second resolution
    ns.create_pod(victim("busy", busy, "90", **kw.get("busy_kw", {})))
    ns.running("busy")
    wait_for_gpu_samples(box.prometheus_url, ns.name, ["idle", "busy"])
    time.sleep(IDLE_WINDOW)  # enough samples for the idle rule's coverage


def preempted(ns, name: str) -> bool:
    return "Preempted" in reasons(ns, name)


def extender_metric(box, line_prefix: str) -> float:
    with urllib.request.urlopen(f"{box.extender_url}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(line_prefix):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("node_cache_capable", [True, False],
                         ids=["meta-victims", "full-victims"])
def test_the_scheduler_preempts_the_idle_pod(sandbox, ns, scheduler_with, node_cache_capable):
    scheduler_with(preemption=True, preempt_verb=True, node_cache_capable=node_cache_capable)
    two_full_nodes(sandbox, ns)
    ns.create_pod(gpu_pod("urgent", 8, cards=H100, priority_class="gpu-high"))
    assert ns.node_of("urgent", timeout=90) == "h100-1"
    assert preempted(ns, "idle") and not preempted(ns, "busy") and not gone(ns, "busy")


def test_without_the_verb_the_scheduler_preempts_by_its_own_order(sandbox, ns, scheduler_with):
    scheduler_with(preemption=True, preempt_verb=False, node_cache_capable=True)
    try:
        two_full_nodes(sandbox, ns)
        ns.create_pod(gpu_pod("urgent", 8, cards=H100, priority_class="gpu-high"))
        # The same setup as above; the busy pod started last, so it is the one taken.
        assert ns.node_of("urgent", timeout=90) == "h100-0"
        assert preempted(ns, "busy") and not gone(ns, "idle")
    finally:
        scheduler_with(preempt_verb=True)


def test_busy_training_pods_are_shielded_and_the_experiment_waits(sandbox, ns, scheduler_with):
    scheduler_with(preemption=True, preempt_verb=True)
    training = {"labels": {"gpusteward.io/class": "training"}}
    for name, node in (("train-0", "h100-0"), ("train-1", "h100-1")):
        ns.create_pod(victim(name, node, "90", **training))
        ns.running(name)
    wait_for_gpu_samples(sandbox.prometheus_url, ns.name, ["train-0", "train-1"])
    shielded = 'gpusteward_extender_preemption_answers_total{kept="none"}'
    before = extender_metric(sandbox, shielded)
    ns.create_pod(gpu_pod("exp", 8, cards=H100, cls="experiment", priority_class="gpu-high"))
    wait_for("the extender to shield the training pods",
             lambda: extender_metric(sandbox, shielded) > before, timeout=60)
    time.sleep(10)  # the scheduler retries; nothing changes
    assert not gone(ns, "train-0") and not gone(ns, "train-1")
    assert not ns.pod("exp")["spec"].get("nodeName")
    assert not ns.pod("exp")["status"].get("nominatedNodeName")
    # A batch pod of the same priority is not shielded from: the scheduler preempts for it.
    ns.create_pod(gpu_pod("batch", 8, cards=H100, cls="batch", priority_class="gpu-high"))
    assert ns.node_of("batch", timeout=90) in {"h100-0", "h100-1"}


def test_a_pdb_counts_before_idleness_as_the_scheduler_counts_it(sandbox, ns, api,
                                                                  scheduler_with):
    scheduler_with(preemption=True, preempt_verb=True, node_cache_capable=True)
    api.create(f"/apis/policy/v1/namespaces/{ns.name}/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "guard"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    two_full_nodes(sandbox, ns, idle_kw={"labels": {"app": "guarded"}})
    wait_for("the disruption controller to count the guarded pod", lambda: api.get(
        f"/apis/policy/v1/namespaces/{ns.name}/poddisruptionbudgets/guard")
        .get("status", {}).get("currentHealthy") == 1, timeout=60)
    ns.create_pod(gpu_pod("urgent", 8, cards=H100, priority_class="gpu-high"))
    # Preempting the idle pod would break its PDB; the busy one breaks none: the scheduler's
    # first criterion stands, so the busy pod goes.
    assert ns.node_of("urgent", timeout=90) == "h100-0"
    assert not gone(ns, "idle") and preempted(ns, "busy")


async def test_the_reclaimer_and_preemption_never_both_act(sandbox, ns, reclaimer,
                                                           scheduler_with):
    scheduler_with(preemption=True, preempt_verb=True, node_cache_capable=True)
    two_full_nodes(sandbox, ns)
    rec = await reclaimer("enforce")
    await rec.cycle()  # marks the idle pod; queue enforcement has no waiting pod yet
    ns.create_pod(gpu_pod("urgent", 8, cards=H100, priority_class="gpu-high"))
    deadline = time.monotonic() + 90
    while not ns.pod("urgent")["spec"].get("nodeName") and time.monotonic() < deadline:
        await rec.cycle()  # enforce mode, queue enabled: it would act if it thought it should
    assert ns.pod("urgent")["spec"]["nodeName"] == "h100-1"
    assert preempted(ns, "idle")
    assert "GPUReclaimed" not in reasons(ns, "idle"), events(ns, "idle")
    queue = [s for m in rec.metrics.actions.collect() for s in m.samples
             if s.name.endswith("_total") and s.labels["reason"] == "queue"]
    assert queue == []


async def test_a_pod_nominated_by_the_scheduler_triggers_no_queue_enforcement(
        sandbox, ns, reclaimer, scheduler_with):
    # The window this guards: the scheduler has nominated a node for the pod and is freeing it
    # (with async preemption the victims' deletion follows the nomination), while queue
    # enforcement could free a second node for the same pod. The nomination is written here as
    # the scheduler writes it (status.nominatedNodeName, schedule_one.go updatePod), with
    # DefaultPreemption off so that nothing else touches the pod.
    scheduler_with(preemption=False)
    try:
        two_full_nodes(sandbox, ns, busy="h100-0", idle="h100-1")
        ns.create_pod(gpu_pod("urgent", 8, cards=H100, priority_class="gpu-high"))
        wait_for("the scheduler to find no room", lambda: any(
            c.get("reason") == "Unschedulable"
            for c in ns.pod("urgent")["status"].get("conditions", [])))
        status = ns.path("pods", "urgent") + "/status"
        ns.api.merge_patch(status, {"status": {"nominatedNodeName": "h100-0"}})
        rec = await reclaimer("enforce")
        await asyncio.sleep(3)  # past queue.minWait (2 s): each cycle would claim the idle pod
        # Three cycles: mark and warn the idle pod, well before its 4 s grace makes it due.
        for _ in range(3):
            await rec.cycle()
            await asyncio.sleep(0.5)
        assert not gone(ns, "idle") and not gone(ns, "busy")
        ns.api.merge_patch(status, {"status": {"nominatedNodeName": None}})
        await cycle_until(rec, "queue enforcement once the nomination is gone",
                          lambda: gone(ns, "idle"))
        assert any(r == "GPUReclaimed" and "for pending" in m for r, m in events(ns, "idle"))
    finally:
        scheduler_with(preemption=True)
