"""The real kube-scheduler, configured from deploy/scheduler/, calling the extender.

Default sandbox fleet: h100-0/1 (8 GPUs each), a100-0/1 (8), l4-0/1/2 (4), t4-0 (2 T4s time-sliced
4 ways, tainted), a100-mig-0 (2 A100s as 14 MIG 1g.10gb slices). The scenarios shared
with the NVML agent's tests live in ``scenarios``.
"""

from __future__ import annotations

import pytest

from tests.e2e import scenarios
from tests.e2e.kube import gpu_pod, promql
from tests.e2e.scenarios import L4S


@pytest.fixture(params=[True, False], ids=["nodeCacheCapable", "full-node-objects"])
def scheduler_mode(request, sandbox):
    if sandbox.cfg.node_cache_capable != request.param:
        sandbox.restart_scheduler(node_cache_capable=request.param)
    return request.param


def test_pods_land_only_on_cards_they_accept_in_preference_order(sandbox, ns, scheduler_mode):
    scenarios.pods_land_only_on_cards_they_accept_in_preference_order(sandbox, ns)


def test_spread_class_prefers_the_cooler_node(sandbox, ns, scheduler_mode):
    scenarios.spread_class_prefers_the_cooler_node(sandbox, ns)


def test_a_burst_does_not_all_land_on_the_node_that_looked_idlest(sandbox, ns):
    scenarios.a_burst_does_not_all_land_on_the_node_that_looked_idlest(sandbox, ns)


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
