"""A mixed fleet mid-upgrade of dcgm-exporter (issue 26), against the sandbox's real Prometheus,
API server and scheduler: node l4-1's exporter goes from 4.8 to 4.9 (DCGM 4.7 names, ratio
utilization, ``hostname``) while its pods run; l4-2's stays on 4.8.

Right after the switch an idle pod's window holds a few seconds under the new name and the rest
under the legacy one: it is idle only if both are read, in their own units, and joined. A busy
pod straddling the switch stays busy, and the extender's refresh reads both halves of the fleet
in one unit. Sources: DCGM's dcgm_fields.h (DCGM_FI_DEV_GPU_UTIL_RATIO, id 1613, 0-1),
dcgm-exporter 4.9's release notes (the DCGM 4.7 names).
"""

from __future__ import annotations

import json
import urllib.request

from gpusteward.adapters.policyfile import load_policy
from gpusteward.adapters.telemetry import PrometheusSource
from gpusteward.sandbox.simulator import GENERATION_LABEL
from tests.e2e.kube import cycle_until, gone, gpu_pod, promql, set_util
from tests.e2e.scenarios import due_pod
from tests.e2e.test_faults import until

LEGACY, NEW = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO"
# The interactive class is placed by live load alone (sandbox/policy.yaml): its scores rank
# the three L4 nodes by what each reads, whichever exporter generation it runs.
PROBE = gpu_pod("probe-interactive", 1, cards="NVIDIA-L4", cls="interactive")
L4S = ["l4-0", "l4-1", "l4-2"]


def scores(box) -> dict[str, int]:
    req = urllib.request.Request(f"{box.extender_url}/prioritize", method="POST",
                                 data=json.dumps({"Pod": PROBE, "NodeNames": L4S}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return {h["Host"]: h["Score"] for h in json.load(resp)}


def samples(box, ns: str, pod: str, metric: str, within: str) -> float:
    """The pod's samples under one metric name over the range (0 when none)."""
    found = promql(box.prometheus_url, " or ".join(
        f'count_over_time({metric}{{{p}namespace="{ns}",{p}pod="{pod}"}}[{within}])'
        for p in ("exported_", "")))
    return float(found[0]["value"][1]) if found else 0.0


async def test_pods_straddling_the_exporter_upgrade_are_judged_on_both_names(
        sandbox, ns, reclaimer):
    policy = load_policy(sandbox.cfg.policy)
    idle = policy.reclaim.idle
    window = f"{int(idle.window)}s"
    ns.create_pod(due_pod("idle-up", node="l4-1"))
    ns.create_pod(due_pod("busy-up", node="l4-1"))
    set_util(ns, ["busy-up"], "85")
    # legacy nodes: l4-0 hot, l4-2 cool; the upgraded l4-1 in between (one GPU at 85 %)
    ns.create_pod(gpu_pod("hot-old", 2, node="l4-0", util="95"))
    ns.create_pod(gpu_pod("cool-old", 1, node="l4-2", util="5"))
    for name in ("idle-up", "busy-up", "hot-old", "cool-old"):
        ns.running(name)
    rec = await reclaimer("enforce")
    await until("a full legacy window for both pods", lambda: all(
        samples(sandbox, ns.name, p, LEGACY, window) >= float(idle.window) - 2
        for p in ("idle-up", "busy-up")), timeout=90)
    node = "/api/v1/nodes/l4-1"
    ns.api.merge_patch(node, {"metadata": {"labels": {GENERATION_LABEL: "4.9"}}})
    try:
        await until("the new names scraped", lambda: all(
            samples(sandbox, ns.name, p, NEW, "3s") > 0 for p in ("idle-up", "busy-up")),
            timeout=30)
        plan = await rec.cycle()
        newer = samples(sandbox, ns.name, "idle-up", NEW, window)
        # the new name alone is far from covering the window: the verdict needs both
        assert newer < float(idle.min_coverage) * float(idle.window), newer
        verdicts = {v.pod: v for v in plan.verdicts}
        up, busy = verdicts[f"{ns.name}/idle-up"], verdicts[f"{ns.name}/busy-up"]
        assert up.state == "idle", up
        assert up.evidence is not None and up.evidence.coverage >= idle.min_coverage
        assert busy.state == "busy" and busy.evidence is not None, busy
        assert busy.evidence.peak_percent >= 80  # 0.85 read as a ratio, not 0.85 %
        await cycle_until(rec, "the idle pod reclaimed", lambda: gone(ns, "idle-up"), timeout=20)
        assert not gone(ns, "busy-up")

        # The extender's refresh: l4-1 read under the new names, l4-2 under the old, one unit.
        source = PrometheusSource.at(sandbox.prometheus_url, policy.telemetry, policy.health)
        nodes = (await source.fetch()).nodes
        busy_gpu = [r for r in nodes["l4-1"] if r.pod == f"{ns.name}/busy-up"]
        assert busy_gpu and 0.8 <= busy_gpu[0].util <= 0.9, nodes["l4-1"]
        assert nodes["l4-2"] and all(r.util is not None and r.util <= 1 for r in nodes["l4-2"])
        assert source.last_dropped == {}

        # Placement on both halves: the extender ranks the upgraded node by its real load,
        # 85 % read as a ratio (read as 0.85 % it would rank first), and the legacy ones too.
        await until("the extender ranks l4-2 > l4-1 > l4-0", lambda: (
            (got := scores(sandbox))["l4-2"] > got["l4-1"] > got["l4-0"]), timeout=30)
    finally:
        ns.api.merge_patch(node, {"metadata": {"labels": {GENERATION_LABEL: None}}})
