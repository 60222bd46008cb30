"""Evidence must reach the present (issue 26), against the sandbox's real Prometheus: one node's
exporter stops answering near the end of an idle pod's window while every other node keeps
answering. The fleet is fresh, and that pod's window still has most of its samples, so its
coverage passes; only its GPU's own newest sample says the last part of the window is missing.
It is unknown and never reclaimed, and its warning is not carried into a reclaim; a due pod on
a node whose exporter answers is reclaimed in the same cycles (the control).

A failed scrape makes Prometheus write staleness markers for the target's series (Prometheus
docs, "Staleness"), so an instant query no longer returns them while range functions over the
window still count the samples before.
"""

from __future__ import annotations

import msgspec

from gpusteward.adapters.policyfile import load_policy
from gpusteward.sandbox.simulator import EXPORTER_LABEL
from tests.e2e.kube import cycle_until, gone, promql
from tests.e2e.scenarios import due_pod
from tests.e2e.test_faults import until


def sampled(box, ns: str, pod: str, within: str = "") -> list:
    """The pod's utilization series now, or (``within``) its sample count over that range."""
    return promql(box.prometheus_url, " or ".join(
        (f'count_over_time(DCGM_FI_DEV_GPU_UTIL{{{p}namespace="{ns}",{p}pod="{pod}"}}[{within}])'
         if within else f'DCGM_FI_DEV_GPU_UTIL{{{p}namespace="{ns}",{p}pod="{pod}"}}')
        for p in ("exported_", "")))


async def test_a_pod_whose_exporter_stopped_is_unknown_while_its_coverage_still_passes(
        sandbox, ns, reclaimer):
    base = load_policy(sandbox.cfg.policy)
    # A low minCoverage keeps the stopped node's window "covered" for most of it (15 s window,
    # 1 s scrapes: 0.2 holds until 12 s after the exporter stops), so coverage cannot be what
    # holds the pod back.
    idle = msgspec.structs.replace(base.reclaim.idle, min_coverage=0.2)
    policy = msgspec.structs.replace(base, reclaim=msgspec.structs.replace(base.reclaim,
                                                                          idle=idle))
    window = float(idle.window)
    ns.create_pod(due_pod("stopped", node="l4-1"))
    ns.create_pod(due_pod("control", node="l4-2"))
    for name in ("stopped", "control"):
        ns.running(name)
    rec = await reclaimer("enforce", policy=policy)
    await until("a full window of samples for both pods", lambda: all(
        (got := sampled(sandbox, ns.name, name, f"{int(window)}s"))
        and float(got[0]["value"][1]) >= window - 2 for name in ("stopped", "control")),
        timeout=90)
    node = "/api/v1/nodes/l4-1"
    ns.api.merge_patch(node, {"metadata": {"labels": {EXPORTER_LABEL: "down"}}})
    try:
        await until("the stopped node's series marked stale",
                    lambda: not sampled(sandbox, ns.name, "stopped"), timeout=30)
        plan = await rec.cycle()
        seen = next(v for v in plan.verdicts if v.pod == f"{ns.name}/stopped")
        assert seen.state == "unknown", seen
        assert any("does not reach the present" in r for r in seen.reasons), seen.reasons
        assert seen.evidence is not None and seen.evidence.coverage >= idle.min_coverage
        await cycle_until(rec, "the control reclaimed", lambda: gone(ns, "control"), timeout=20)
        assert not gone(ns, "stopped")
    finally:
        ns.api.merge_patch(node, {"metadata": {"labels": {EXPORTER_LABEL: None}}})
