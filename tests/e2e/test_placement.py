"""The real kube-scheduler, configured from deploy/scheduler/, calling the extender.

Default sandbox fleet: h100-0/1 (8 GPUs each), a100-0/1 (8), l4-0/1/2 (4), t4-0 (2 T4s time-sliced
4 ways, tainted), a100-mig-0 (2 A100s as 14 MIG 1g.10gb slices). The scenarios shared
with the NVML agent's tests live in ``scenarios``.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.e2e import scenarios
from tests.e2e.kube import gpu_pod, promql, wait_for_gpu_samples
from tests.e2e.scenarios import A100S, H100S, L4S


@pytest.fixture(params=[True, False], ids=["nodeCacheCapable", "full-node-objects"])
def scheduler_mode(request, sandbox):
    if sandbox.cfg.node_cache_capable != request.param:
        sandbox.restart_scheduler(node_cache_capable=request.param)
    return request.param


def test_pods_land_only_on_cards_they_accept_in_preference_order(sandbox, ns, scheduler_mode):
    # 4-GPU pods preferring A100 over H100: A100s hold 4 of them, the rest spill to H100s.
    for i in range(6):
        ns.create_pod(gpu_pod(f"p{i}", 4, cards="NVIDIA-A100*,NVIDIA-H100*", cls="batch"))
        ns.node_of(f"p{i}")  # one at a time, so the order is the preference order
    nodes = [ns.pod(f"p{i}")["spec"]["nodeName"] for i in range(6)]
    assert set(nodes[:4]) <= A100S, nodes
    assert set(nodes[4:]) <= H100S, nodes
    # An L4-only pod never lands on the big cards, even though they have room.
    ns.create_pod(gpu_pod("small", 1, cards="NVIDIA-L4"))
    assert ns.node_of("small") in L4S


def test_spread_class_prefers_the_cooler_node(sandbox, ns, scheduler_mode):
    scenarios.spread_class_prefers_the_cooler_node(sandbox, ns)


def test_a_burst_does_not_all_land_on_the_node_that_looked_idlest(sandbox, ns):
    # Both H100s hold 4 busy GPUs; h100-0's read 0 %, h100-1's 40 %: h100-0 looks idlest.
    ns.create_pod(gpu_pod("load-0", 4, node="h100-0", util="0"))
    ns.create_pod(gpu_pod("load-1", 4, node="h100-1", util="40"))
    ns.running("load-0")
    ns.running("load-1")
    wait_for_gpu_samples(sandbox.prometheus_url, ns.name, ["load-0", "load-1"])
    for i in range(4):  # all at once
        ns.create_pod(gpu_pod(f"burst-{i}", 1, cards="NVIDIA-H100*", cls="interactive"))
    placed = Counter(ns.node_of(f"burst-{i}") for i in range(4))
    assert set(placed) <= H100S
    assert placed["h100-0"] < 4, placed


def test_pods_still_schedule_while_the_extender_is_down_and_scoring_resumes(sandbox, ns):
    sandbox.stop_component("extender")
    try:
        # ignorable: true: the scheduler skips the unreachable extender, nothing filters cards.
        ns.create_pod(gpu_pod("while-down", 1, cards="NVIDIA-L4"))
        ns.node_of("while-down")
    finally:
        sandbox.start_extender()
    for i in range(3):
        ns.create_pod(gpu_pod(f"after-{i}", 1, cards="NVIDIA-L4"))
        assert ns.node_of(f"after-{i}") in L4S


def test_an_unhealthy_node_receives_no_new_gpu_pods(sandbox, ns):
    scenarios.an_unhealthy_node_receives_no_new_gpu_pods(sandbox, ns)
    # The node has healed (the scenario waits for it) while the simulator's XID gauge, like
    # dcgm-exporter's, still shows XID 79: the extender went by the windowed XID count.
    gauge = promql(sandbox.prometheus_url, 'max(DCGM_FI_DEV_XID_ERRORS{Hostname="h100-1"})')
    assert [r["value"][1] for r in gauge] == ["79"]
    assert scenarios.filter_passes(sandbox, "h100-1")
