"""Scenarios that must hold whichever source feeds GPU telemetry: the DCGM simulator
(test_placement, test_reclaim) or one NVML agent per node (test_agent_telemetry).

Default sandbox fleet: h100-0/1 (8 GPUs each), a100-0/1 (8), l4-0/1/2 (4), t4-0 (2 T4s time-sliced
4 ways, tainted), a100-mig-0 (2 A100s as 14 MIG 1g.10gb slices).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from gpusteward.core.reclaim.decide import stamp
from gpusteward.core.reclaim.model import IDLE_SINCE, RECLAIM_AT
from gpusteward.reclaimer.loop import Reclaimer
from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.fleet import XID_LABEL
from gpusteward.sandbox.kubehttp import wait_for
from gpusteward.sandbox.simulator import UTIL_ANNOTATION
from tests.e2e.kube import (
    Namespace,
    annotations,
    cycle_until,
    events,
    gone,
    gpu_pod,
    reasons,
    wait_for_gpu_samples,
)

H100S, A100S, L4S = {"h100-0", "h100-1"}, {"a100-0", "a100-1"}, {"l4-0", "l4-1", "l4-2"}


def spread_class_prefers_the_cooler_node(box: Sandbox, ns: Namespace) -> None:
    for node, util in (("l4-0", "95"), ("l4-1", "5"), ("l4-2", "60")):
        ns.create_pod(gpu_pod(f"load-{node}", 2, node=node, util=util))
    for node in ("l4-0", "l4-1", "l4-2"):
        ns.running(f"load-{node}")
    wait_for_gpu_samples(box.prometheus_url, ns.name, [f"load-{n}" for n in sorted(L4S)])
    ns.create_pod(gpu_pod("serve", 1, cards="NVIDIA-L4", cls="inference"))
    assert ns.node_of("serve") == "l4-1"


def filter_passes(box: Sandbox, node: str) -> bool:
    """Whether the extender's filter keeps ``node`` for an 8-GPU pod."""
    body = json.dumps({"Pod": gpu_pod("probe", 8), "NodeNames": [node]}).encode()
    req = urllib.request.Request(f"{box.extender_url}/filter", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return bool(json.load(resp)["NodeNames"] == [node])


@contextmanager
def broken(box: Sandbox, node: str, xid: int = 79) -> Iterator[str]:
    """Every GPU of ``node`` reports ``xid`` (79: fell off the bus) until the block ends."""
    api, path = box.api(), f"/api/v1/nodes/{node}"
    api.merge_patch(path, {"metadata": {"labels": {XID_LABEL: str(xid)}}})
    try:
        yield node
    finally:
        api.merge_patch(path, {"metadata": {"labels": {XID_LABEL: None}}})
        # The XID stays "recent" for the policy's xidWindow; wait until the extender forgets it.
        wait_for(f"{node} healthy again", lambda: filter_passes(box, node), timeout=90)


def an_unhealthy_node_receives_no_new_gpu_pods(box: Sandbox, ns: Namespace,
                                                xid: int = 79) -> None:
    with broken(box, "h100-1", xid) as node:
        wait_for("the extender to see the XID", lambda: not filter_passes(box, node),
                 timeout=30)
        for i in range(4):
            ns.create_pod(gpu_pod(f"p{i}", 2, cards="NVIDIA-H100*"))
        assert {ns.node_of(f"p{i}") for i in range(4)} == {"h100-0"}


async def an_idle_pod_is_warned_then_evicted(ns: Namespace, rec: Reclaimer,
                                             node: str = "h100-0") -> None:
    ns.create_pod(gpu_pod("idle", 1, node=node, util="0"))
    ns.running("idle")
    await cycle_until(rec, "idle mark", lambda: IDLE_SINCE in annotations(ns, "idle"))
    await cycle_until(rec, "warning", lambda: RECLAIM_AT in annotations(ns, "idle"))
    assert not gone(ns, "idle")
    await cycle_until(rec, "eviction", lambda: gone(ns, "idle"))
    assert {"GPUIdle", "GPUIdleWarning", "GPUReclaimed"} <= set(reasons(ns, "idle"))


def due_pod(name: str, **kw) -> dict:
    """An idle pod already marked and warned, its deadline passed: the next idle cycle acts."""
    marks = {IDLE_SINCE: stamp(time.time() - 60), RECLAIM_AT: stamp(time.time() - 1)}
    return gpu_pod(name, 1, util="0", annotations=marks, **kw)


async def a_busy_pod_is_left_alone_and_its_marks_cleared(ns: Namespace, rec: Reclaimer,
                                                         node: str = "h100-0") -> None:
    ns.create_pod(due_pod("busy", node=node))
    ns.api.merge_patch(ns.path("pods", "busy"), {"metadata": {"annotations": {
        UTIL_ANNOTATION: "80"}}})
    ns.running("busy")
    # A pod younger than minPodAge is protected, and protection clears marks too: wait it out,
    # so that what clears them here is the pod's activity.
    await asyncio.sleep(float(rec.policy.reclaim.min_pod_age) + 1)
    await cycle_until(rec, "marks cleared", lambda: IDLE_SINCE not in annotations(ns, "busy"))
    assert not gone(ns, "busy")
    cleared = [message for reason, message in events(ns, "busy") if reason == "GPUActive"]
    assert any("peak 80%" in m for m in cleared), cleared
