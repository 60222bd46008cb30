"""Protection windows against the sandbox (docs/policy.md, "Protection windows"): the real
kube-scheduler's DefaultPreemption with the extender's preempt verb, the reclaimer through its
real adapters, kwok setting each pod's status.startTime as a kubelet does.

sandbox/policy.yaml: class `fresh` has minRuntime 45 s, class `rerun` reclaimCooldown 45 s; the
idle window is 15 s, the grace 4 s, minPodAge 5 s, so an idle pod is otherwise reclaimed some
25 s after it starts.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

from gpusteward.core.reclaim.model import COOLDOWN_UNTIL, IDLE_SINCE, VerdictState
from gpusteward.core.times import parse_time, stamp
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e.kube import (
    annotations,
    apply_priority_classes,
    cycle_until,
    gone,
    gpu_pod,
    reasons,
    wait_for_gpu_samples,
)
from tests.e2e.test_preemption import H100, PRIORITIES, extender_metric, preempted, two_full_nodes

MIN_RUNTIME = COOLDOWN = 45.0  # sandbox/policy.yaml classes fresh and rerun


def started(ns, name: str) -> float:
    at = parse_time(ns.pod(name)["status"].get("startTime"))
    assert at is not None, f"{name} has no status.startTime"
    return at


def reasons_for(decided, ns, name: str) -> tuple[VerdictState, str]:
    v = next(v for v in decided.verdicts if v.pod == f"{ns.name}/{name}")
    return v.state, "; ".join(v.reasons)


async def test_an_idle_pod_inside_its_minruntime_is_kept_then_taken_when_it_closes(
        sandbox, ns, reclaimer):
    ns.create_pod(gpu_pod("nb", 1, node="h100-0", util="0", cls="fresh"))
    ns.running("nb")
    wait_for_gpu_samples(sandbox.prometheus_url, ns.name, ["nb"])
    start = started(ns, "nb")
    rec = await reclaimer("enforce")
    # Past the time an idle pod of another class is reclaimed, nothing happens to it.
    while time.time() < start + MIN_RUNTIME - 5:
        decided = await rec.cycle()
        state, why = reasons_for(decided, ns, "nb")
        assert state == VerdictState.PROTECTED and "inside minRuntime" in why, why
        assert IDLE_SINCE not in annotations(ns, "nb") and not gone(ns, "nb")
        await asyncio.sleep(1)
    await cycle_until(rec, "the pod reclaimed", lambda: gone(ns, "nb"), timeout=60)
    # Right after the window: marked, warned, and evicted after the 4 s grace.
    assert start + MIN_RUNTIME <= time.time() <= start + MIN_RUNTIME + 25
    assert {"GPUIdle", "GPUIdleWarning", "GPUReclaimed"} <= set(reasons(ns, "nb"))


def test_the_preempt_verb_keeps_off_a_victim_inside_its_minruntime(sandbox, ns, scheduler_with):
    apply_priority_classes(sandbox.api(), PRIORITIES)
    scheduler_with(preemption=True, preempt_verb=True)
    # As test_preemption's: idle on h100-1 (now of class fresh), busy on h100-0. Left to the
    # verb alone, the idle one would be preempted.
    two_full_nodes(sandbox, ns, idle_kw={"labels": {"gpusteward.io/class": "fresh"}})
    start = started(ns, "idle")
    vetoed = 'gpusteward_extender_preemption_dropped_nodes_total{why="protected"}'
    before = extender_metric(sandbox, vetoed)
    ns.create_pod(gpu_pod("urgent", 8, cards=H100, priority_class="gpu-high"))
    assert ns.node_of("urgent", timeout=90) == "h100-0"
    assert time.time() < start + MIN_RUNTIME, "the scheduler asked after the window closed"
    assert preempted(ns, "busy") and not gone(ns, "idle")
    assert extender_metric(sandbox, vetoed) > before
    # Once the window has closed, the idle pod is a victim like any other.
    wait_for("the idle pod's minRuntime to end", lambda: time.time() > start + MIN_RUNTIME,
             timeout=MIN_RUNTIME)
    ns.create_pod(gpu_pod("urgent-2", 8, cards=H100, priority_class="gpu-high"))
    assert ns.node_of("urgent-2", timeout=90) == "h100-1"
    assert preempted(ns, "idle")


async def test_a_re_created_pod_is_not_reclaimed_again_inside_its_cooldown(
        sandbox, ns, reclaimer):
    """Nor picked by the extender's preempt verb, which reads the cooldown from the pod."""
    rec = await reclaimer("enforce")
    manifest = gpu_pod("rerun", 1, node="h100-0", util="0", cls="rerun")
    ns.create_pod(manifest)
    ns.running("rerun")
    await cycle_until(rec, "the pod reclaimed", lambda: gone(ns, "rerun"), timeout=75)
    # The reclaim as the ledger remembers it, by the workload's key
    reclaimed_at = max(a.at for a in rec.recent if a.owner == f"{ns.name}/Pod/rerun")
    wait_for("the evicted pod to go", lambda: not ns.api.get(
        f"/api/v1/namespaces/{ns.name}/pods")["items"], timeout=60)
    recreated(ns, manifest)  # its owner brings it back: the same workload, <ns>/Pod/rerun
    back = time.time()
    # Idle from its start, it would be due some 25 s later; inside the cooldown it is kept.
    vetoed = False
    while time.time() < reclaimed_at + COOLDOWN - 5:
        decided = await rec.cycle()
        state, why = reasons_for(decided, ns, "rerun")
        if time.time() > back + 8:  # past minPodAge: only the cooldown holds it
            assert state == VerdictState.PROTECTED and "inside reclaimCooldown" in why, why
        assert not gone(ns, "rerun")
        # the cooldown's end, noted on the pod, keeps the extender's preempt verb off it too
        # once its evidence refresh (every reclaim.interval) has read the pod
        vetoed = vetoed or preempt_keeps(sandbox, ns.pod("rerun")) == []
        await asyncio.sleep(1)
    assert annotations(ns, "rerun")[COOLDOWN_UNTIL] == stamp(reclaimed_at + COOLDOWN)
    assert vetoed, "the preempt verb kept offering the pod inside its cooldown"
    await cycle_until(rec, "the pod reclaimed again", lambda: gone(ns, "rerun"), timeout=60)
    assert time.time() >= reclaimed_at + COOLDOWN


def recreated(ns, manifest: dict, attempts: int = 3, timeout: float = 60) -> None:
    """Create the pod again under its old name and wait for it to run. kwok's stage controller
    deletes a pod by name alone (sigs.k8s.io/kwok v0.8.0 pkg/kwok/controllers/
    stage_controller.go deleteResource: grace 0, no UID precondition), so a delete it queued
    for the evicted pod can still land on the new one under load (seen once in CI: the new pod
    404 before it ran). A real kubelet deletes by UID; here the pod is made again at once."""
    name, made = manifest["metadata"]["name"], 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        phases = [p["status"].get("phase") for p in ns.pods() if p["metadata"]["name"] == name]
        if "Running" in phases:
            return
        if not phases and made < attempts:
            ns.create_pod(manifest)
            made += 1
        time.sleep(0.2)
    raise TimeoutError(f"pod {ns.name}/{name} never ran ({made} made)")


def preempt_keeps(sandbox, victim: dict) -> list[str]:
    """The nodes the sandbox's extender keeps of a one-candidate preempt call, the victim on
    its node (the scheduler's own request shape: tests/e2e/test_preemption.py)."""
    preemptor = gpu_pod("urgent", 1, cards=H100)
    preemptor["metadata"]["uid"] = "a-preemptor"
    node = victim["spec"]["nodeName"]
    body = json.dumps({"Pod": preemptor, "NodeNameToMetaVictims": {node: {
        "Pods": [{"UID": victim["metadata"]["uid"]}], "NumPDBViolations": 0}}}).encode()
    request = urllib.request.Request(f"{sandbox.extender_url}/preempt", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return list(json.loads(resp.read()).get("NodeNameToMetaVictims") or {})
