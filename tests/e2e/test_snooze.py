"""Snooze against the sandbox's real API server and Prometheus: the annotation on a pod or its
Deployment holds reclaim off until it ends, is cut to the policy's cap, and says why when it is
ignored (docs/policy.md, "Snooze"). The sandbox policy: 15 s window, 4 s grace, 5 s minPodAge.
"""

from __future__ import annotations

import asyncio
import json
import time

import msgspec

from gpusteward.adapters.policyfile import load_policy
from gpusteward.core.reclaim.model import IDLE_SINCE, RECLAIM_AT, SNOOZE_UNTIL
from gpusteward.core.times import parse_time, stamp
from gpusteward.core.typedconfig import Duration
from tests.e2e.kube import (
    annotations,
    apply_priority_classes,
    cycle_for,
    cycle_until,
    events,
    gone,
    gpu_pod,
    reasons,
)
from tests.e2e.scenarios import due_pod


def _events_on(ns, kind: str, name: str) -> list[tuple[str, str]]:
    """(reason, message) of the Events about one object, oldest first (etcd's
    resourceVersion orders writes; the timestamps have only seconds)."""
    items = ns.api.get(f"/api/v1/namespaces/{ns.name}/events")["items"]
    items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["reason"], e.get("message", "")) for e in items
            if e["involvedObject"]["name"] == name and e["involvedObject"]["kind"] == kind]


async def test_a_snoozed_idle_pod_is_kept_until_the_snooze_ends_then_warned_afresh(
        sandbox, ns, reclaimer):
    records = f"e2e-{ns.name}-snoozes"
    manifest = due_pod("notebook", node="h100-0")
    manifest["metadata"]["annotations"][SNOOZE_UNTIL] = "25s"
    ns.create_pod(manifest)
    ns.running("notebook")
    await asyncio.sleep(6)  # past minPodAge: a young pod is protected anyway
    rec = await reclaimer("enforce", snoozes=records)
    await rec.cycle()
    first_sight = time.time()
    # The due marks are cleared, so the end is followed by a fresh warning and its grace.
    await cycle_until(rec, "marks cleared", lambda: RECLAIM_AT not in annotations(ns, "notebook"))
    # A restarted reclaimer (or another replica after a failover) reads the record: the 25 s
    # still count from the first sighting, and the snooze is announced once.
    rec = await reclaimer("enforce", snoozes=records)
    await cycle_for(rec, 12)
    assert not gone(ns, "notebook")
    [(_, message)] = [e for e in events(ns, "notebook") if e[0] == "GPUReclaimSnoozed"]
    until = parse_time(message.rsplit(" ", 1)[-1])
    assert until is not None and abs(until - (first_sight + 25)) <= 5
    stored = json.loads(ns.api.get(f"/api/v1/namespaces/kube-system/configmaps/{records}")
                        ["data"]["records"])
    assert [(r["value"], r["outcome"]) for r in stored] == [("25s", "snoozed")]
    await cycle_until(rec, "eviction after the snooze", lambda: gone(ns, "notebook"), timeout=90)
    assert time.time() >= until
    order = [r for r, _ in _events_on(ns, "Pod", "notebook") if r in (
        "GPUReclaimSnoozed", "GPUReclaimSnoozeEnded", "GPUIdleWarning", "GPUReclaimed")]
    assert order == ["GPUReclaimSnoozed", "GPUReclaimSnoozeEnded", "GPUIdleWarning",
                     "GPUReclaimed"]


async def test_a_snooze_past_the_cap_is_cut_to_the_cap_with_an_event(sandbox, ns, reclaimer):
    base = load_policy(sandbox.cfg.policy)
    capped = msgspec.structs.replace(base.reclaim.snooze, max_duration=Duration(10))
    policy = msgspec.structs.replace(
        base, reclaim=msgspec.structs.replace(base.reclaim, snooze=capped))
    manifest = due_pod("greedy", node="h100-1")
    manifest["metadata"]["annotations"][SNOOZE_UNTIL] = stamp(time.time() + 3600)
    ns.create_pod(manifest)
    ns.running("greedy")
    await asyncio.sleep(6)
    rec = await reclaimer("enforce", policy=policy)
    await cycle_until(rec, "the snooze announced", lambda: "GPUReclaimSnoozed" in
                      reasons(ns, "greedy"))
    [message] = [m for r, m in events(ns, "greedy") if r == "GPUReclaimSnoozed"]
    assert "cut to the policy's longest snooze of 10s" in message
    # Reclaimed within the cap plus mark, warning and grace, not after the hour asked for.
    await cycle_until(rec, "eviction after the cap", lambda: gone(ns, "greedy"), timeout=60)


async def test_a_malformed_snooze_says_why_and_leaves_the_value(sandbox, ns, reclaimer):
    manifest = due_pod("typo", node="a100-0")
    manifest["metadata"]["annotations"][SNOOZE_UNTIL] = "tomorrow"
    ns.create_pod(manifest)
    ns.running("typo")
    await asyncio.sleep(6)
    rec = await reclaimer("enforce")
    await cycle_until(rec, "the value answered", lambda: "GPUReclaimSnoozeIgnored" in
                      reasons(ns, "typo"))
    [message] = [m for r, m in events(ns, "typo") if r == "GPUReclaimSnoozeIgnored"]
    assert "'tomorrow' is neither an RFC 3339 time" in message
    assert annotations(ns, "typo")[SNOOZE_UNTIL] == "tomorrow"  # the owner's text stays
    await cycle_until(rec, "eviction as if unsnoozed", lambda: gone(ns, "typo"))


async def test_a_snooze_on_a_protected_pod_says_it_is_not_needed(sandbox, ns, reclaimer):
    apply_priority_classes(ns.api, {"gpu-critical": 2_000_000})
    ns.create_pod(gpu_pod("vip", 1, node="a100-1", util="0", priority_class="gpu-critical",
                          annotations={SNOOZE_UNTIL: "1h"}))
    ns.running("vip")
    await asyncio.sleep(6)
    rec = await reclaimer("enforce")
    await cycle_until(rec, "the snooze answered", lambda: "GPUReclaimSnoozeIgnored" in
                      reasons(ns, "vip"))
    [message] = [m for r, m in events(ns, "vip") if r == "GPUReclaimSnoozeIgnored"]
    assert "not needed" in message and "priority 2000000" in message
    assert IDLE_SINCE not in annotations(ns, "vip")


async def test_a_snooze_on_the_deployment_covers_its_pods(sandbox, ns, reclaimer):
    from tests.e2e.test_reclaim import deployment, running_pods

    path = deployment(ns, "nb", 1, "l4-0")
    ns.api.merge_patch(path, {"metadata": {"annotations": {SNOOZE_UNTIL: "1h"}}})
    await asyncio.sleep(1)
    rec = await reclaimer("enforce")
    await cycle_until(rec, "the snooze announced on the Deployment", lambda: any(
        r == "GPUReclaimSnoozed" for r, _ in _events_on(ns, "Deployment", "nb")))
    await cycle_for(rec, 30)  # minPodAge, window, mark, warning and grace, and then some
    assert ns.api.get(path)["spec"]["replicas"] == 1
    assert len(running_pods(ns, "nb")) == 1
    assert rec.metrics.pods.labels("snoozed")._value.get() == 1
