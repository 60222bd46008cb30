"""Shared and partitioned GPUs: card names with GFD's suffixes, physical GPUs behind time-sliced
and MIG resources, and load and health per physical GPU on a time-sliced node.

Label values are GFD's (NVIDIA/k8s-device-plugin `internal/lm/resource_test.go`,
`TestGPUResourceLabeler` / `TestMigResourceLabeler`): `MOCKMODEL-SHARED` with replicas 2, no
suffix when renamed (`nvidia.com/gpu.shared`), `MOCKMODEL-MIG-1g.300gb` (single strategy) and
`MOCKMODEL-MIG-1g.300gb-SHARED`; mixed-strategy resources `nvidia.com/mig-<profile>`
(`internal/lm/mig-strategy.go`, `newMigStrategyMixedLabeler`); and the README's
`A100-SXM4-40GB-MIG-1g.5gb` (`docs/gpu-feature-discovery/README.md`).
"""

from __future__ import annotations

import msgspec
import pytest

from gpusteward.core.cards import TierTable, mig_profile, physical_card, preference_rank
from gpusteward.core.kubewire import WireNode, WirePod, to_node, to_pod
from gpusteward.core.model import GpuReading
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.scoring import Demand, filter_node, health_term
from gpusteward.core.sharing import node_physical_gpus, physical, unit_share
from gpusteward.reclaimer.metrics import ReclaimerMetrics
from tests.factories import A100, NOW, node, pod, readings, state
from tests.unit.test_reclaim_decide import POLICY, gpu_pod, snapshot

T4_SHARED = "Tesla-T4-SHARED"
SLICE = "nvidia.com/mig-1g.10gb"
REPLICAS_4 = {"nvidia.com/gpu.replicas": "4"}
MIXED = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb",
         "nvidia.com/mig-3g.40gb")


@pytest.mark.parametrize(
    ("product", "card", "profile"),
    [
        pytest.param("MOCKMODEL-SHARED", "MOCKMODEL", None, id="gfd-shared"),
        pytest.param("MOCKMODEL-MIG-1g.300gb", "MOCKMODEL", "1g.300gb", id="gfd-mig-single"),
        pytest.param("MOCKMODEL-MIG-1g.300gb-SHARED", "MOCKMODEL", "1g.300gb",
                     id="gfd-mig-single-shared"),
        pytest.param("A100-SXM4-40GB-MIG-1g.5gb", "A100-SXM4-40GB", "1g.5gb",
                     id="gfd-readme-old-driver-name"),
        pytest.param("NVIDIA-A100-SXM4-80GB-MIG-INVALID", "NVIDIA-A100-SXM4-80GB", "INVALID",
                     id="gfd-invalid-mig-strategy"),
        pytest.param(A100, A100, None, id="plain-card"),
    ],
)
def test_gfd_suffixes_name_the_physical_card(product, card, profile):
    assert (physical_card(product), mig_profile(product)) == (card, profile)


@pytest.mark.parametrize(
    ("product", "patterns", "rank"),
    [
        pytest.param(T4_SHARED, ("Tesla-T4",), 0, id="plain-name-accepts-shared-node"),
        pytest.param(T4_SHARED, ("Tesla-T4-SHARED",), 0, id="suffix-asked-explicitly"),
        pytest.param("Tesla-T4", ("Tesla-T4-SHARED",), None, id="suffix-excludes-whole-gpus"),
        pytest.param("NVIDIA-L4-SHARED", ("NVIDIA-H100*", "NVIDIA-L4"), 1, id="exact-tier-name"),
        pytest.param("NVIDIA-A100-SXM4-80GB-SHARED", ("NVIDIA-A10",), None,
                     id="A10-never-matches-a-shared-A100"),
        pytest.param("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", ("NVIDIA-A10",), None,
                     id="A10-never-matches-a-MIG-A100"),
        pytest.param("NVIDIA-A10-SHARED", ("NVIDIA-A10",), 0, id="A10-matches-shared-A10"),
        pytest.param("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", (A100,), 0, id="mig-single-card"),
        pytest.param("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", ("*-MIG-1g.10gb",), 0,
                     id="mig-profile-asked-explicitly"),
        pytest.param("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", ("*-MIG-1g.10gb",), None,
                     id="other-profile-not-accepted"),
    ],
)
def test_card_patterns_match_the_physical_card_or_the_whole_label(product, patterns, rank):
    assert preference_rank(product, patterns) == rank


def test_a_pod_asking_for_a_plain_card_passes_the_filter_of_its_shared_node():
    shared = node(product=T4_SHARED, gpus=8, labels=REPLICAS_4)
    verdict = filter_node(state(shared, gpu_readings=readings("n1", [0.0, 0.0])),
                          Demand(1, ("Tesla-T4",), "training"))
    assert verdict.ok


def test_policy_tiers_name_cards_without_suffixes():
    tiers = TierTable([("economy", ["NVIDIA-L4", "Tesla-T4"]), ("standard", ["NVIDIA-A10"])])
    assert [tiers.tier_of(p) for p in ("NVIDIA-L4-SHARED", T4_SHARED, "NVIDIA-A10-SHARED",
                                       "NVIDIA-A100-SXM4-80GB-SHARED")] == \
        ["economy", "economy", "standard", None]


@pytest.mark.parametrize(
    ("resource", "product", "labels", "share"),
    [
        pytest.param("nvidia.com/gpu", A100, {}, 1.0, id="whole-gpu"),
        pytest.param("nvidia.com/gpu", "Tesla-T4-SHARED", REPLICAS_4, 0.25, id="time-sliced"),
        pytest.param("nvidia.com/gpu.shared", "Tesla-T4", REPLICAS_4, 0.25, id="renamed-shared"),
        pytest.param("nvidia.com/gpu", A100, {"nvidia.com/gpu.replicas": "0"}, 1.0,
                     id="gfd-replicas-0-on-mig-enabled-gpus"),
        pytest.param("nvidia.com/mig-1g.10gb", A100, {}, 1 / 7, id="mixed-1g-of-7"),
        pytest.param("nvidia.com/mig-3g.40gb", A100, {}, 3 / 7, id="mixed-3g-of-7"),
        pytest.param("nvidia.com/mig-1g.6gb", "NVIDIA-A30", {}, 1 / 4, id="A30-has-4-slices"),
        pytest.param("nvidia.com/mig-1c.3g.40gb", A100, {}, 1 / 7, id="compute-instance"),
        pytest.param("nvidia.com/gpu", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", {}, 1 / 7,
                     id="single-strategy"),
        pytest.param("nvidia.com/gpu", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED",
                     {"nvidia.com/gpu.replicas": "2"}, 1 / 14, id="single-strategy-shared"),
    ],
)
def test_one_unit_of_a_resource_in_physical_gpus(resource, product, labels, share):
    assert unit_share(resource, node(product=product, labels=labels)) == pytest.approx(share)


def wire_node(allocatable: dict[str, str], labels: dict[str, str]) -> WireNode:
    obj = {"metadata": {"name": "n1", "labels": labels}, "status": {"allocatable": allocatable}}
    return msgspec.convert(obj, WireNode)


def test_a_mixed_mig_node_counts_its_slices_and_their_physical_gpus():
    """Two A100s under the mixed strategy: one as 7 x 1g.10gb, one as 2 x 3g.40gb (GFD
    publishes `nvidia.com/mig.strategy: mixed` and the parent card's product)."""
    n = to_node(wire_node({"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"},
                          {"nvidia.com/gpu.product": A100, "nvidia.com/mig.strategy": "mixed",
                           "nvidia.com/gpu.replicas": "0"}), MIXED)
    assert n.gpus == 9
    assert node_physical_gpus(n) == pytest.approx(1 + 6 / 7)


def test_a_renamed_time_sliced_node_counts_gpu_shared():
    n = to_node(wire_node({"nvidia.com/gpu.shared": "8"},
                          {"nvidia.com/gpu.product": "Tesla-T4", **REPLICAS_4}), MIXED)
    assert (n.gpus, node_physical_gpus(n)) == (8, 2.0)


def test_a_mig_pod_request_is_priced_by_its_slices():
    spec = {"containers": [{"resources": {"limits": {"nvidia.com/mig-1g.10gb": "2"}}}]}
    p = to_pod(msgspec.convert({"spec": spec}, WirePod), MIXED)
    assert (p.gpus, dict(p.resources)) == (2, {"nvidia.com/mig-1g.10gb": 2})
    assert physical(p.resources, p.gpus, node(product=A100)) == pytest.approx(2 / 7)


def t4_node(**kw):
    """2 physical T4s time-sliced 4 ways: allocatable 8 replicas, one series per GPU."""
    return node(product=T4_SHARED, gpus=8, labels=REPLICAS_4, **kw)


def test_two_saturated_time_sliced_gpus_read_saturated():
    s = state(t4_node(), gpu_readings=readings("n1", [1.0, 1.0]))
    assert s.util == pytest.approx(1.0)


def test_a_young_pod_on_a_time_sliced_node_counts_its_replica_share():
    young = pod("y", bound_at=NOW - 1)
    s = state(t4_node(), pods=[young], gpu_readings=readings("n1", [0.0, 0.0], at=NOW - 5))
    assert s.util == pytest.approx(0.25 / 2)


def test_a_lost_time_sliced_gpu_takes_all_its_replicas_out_of_free_capacity():
    s = state(t4_node(), gpu_readings=readings("n1", [0.0, 0.0], xid={1: 79}))
    assert (s.free, s.healthy_free) == (8, 4)
    assert filter_node(s, Demand(4, (), "training")).ok
    verdict = filter_node(s, Demand(5, (), "training"))
    assert (verdict.ok, verdict.resolvable) == (False, True)
    assert "gpu 1: XID 79" in verdict.reason
    assert health_term(s) == pytest.approx(0.5)


def test_a_lost_time_sliced_gpu_held_by_a_pod_takes_its_other_replicas():
    held = readings("n1", [0.0, 0.0], xid={0: 79}, pods={0: "ml/p"})
    s = state(t4_node(), pods=[pod("p", bound_at=NOW - 600)], gpu_readings=held)
    assert (s.free, s.healthy_free) == (7, 4)


def test_mig_instances_are_one_reading_each():
    """A mixed-strategy node: one reading per instance, as dcgm-exporter reports them."""
    mig = tuple(GpuReading(node="n1", gpu=f"0/mig{i}", util=u, sampled_at=NOW - 5)
                for i, u in enumerate([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]))
    s = state(node(product=A100, gpus=7, resources={"nvidia.com/mig-1g.10gb": 7}),
              gpu_readings=mig)
    assert s.util == pytest.approx(1 / 7)


def test_the_reclaimers_gpu_gauge_counts_physical_gpus_like_the_report():
    nodes = [node("m1", A100, 7, resources={"nvidia.com/mig-1g.10gb": 7}),
             node("t1", T4_SHARED, 8, labels=REPLICAS_4)]
    pods = [gpu_pod("slice", node="m1", gpus=2, resources={"nvidia.com/mig-1g.10gb": 2}),
            gpu_pod("replica", node="t1", gpus=1)]
    snap = snapshot(pods, nodes=nodes)
    metrics = ReclaimerMetrics()
    metrics.observe(snap, plan(snap, POLICY), 1.0)
    held = {s.labels["card"]: s.value for family in metrics.registry.collect()
            if family.name == "gpusteward_gpus" for s in family.samples
            if s.labels["state"] == "allocated"}
    assert held == pytest.approx({A100: 2 / 7, T4_SHARED: 0.25})


@pytest.mark.parametrize(
    ("resources", "node_resources", "reason"),
    [
        pytest.param({SLICE: 1}, {"nvidia.com/gpu": 8}, f"pod needs 1 {SLICE}, node has 0",
                     id="mig-pod-on-a-whole-gpu-node"),
        pytest.param({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 0, SLICE: 14},
                     "pod needs 1 nvidia.com/gpu, node has 0", id="whole-gpu-pod-on-a-mig-node"),
        pytest.param({SLICE: 2}, {SLICE: 14}, "", id="mig-pod-on-its-mig-node"),
    ],
)
def test_the_filter_checks_each_gpu_resource_the_node_offers(resources, node_resources, reason):
    """GFD's mixed strategy: allocatable per MIG profile, `nvidia.com/gpu` 0 (mig-strategy.go)."""
    n = node(product=A100, gpus=sum(node_resources.values()), resources=node_resources)
    demand = Demand(sum(resources.values()), (), "training", tuple(sorted(resources.items())))
    verdict = filter_node(state(n, gpu_readings=None), demand)
    assert (verdict.ok, verdict.reason) == (not reason, reason)
    if reason:
        assert not verdict.resolvable


@pytest.mark.parametrize(
    ("containers", "init", "wanted"),
    [
        pytest.param([{"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "1"}], [], {"nvidia.com/gpu": 3},
                     id="containers-add-up"),
        pytest.param([{"nvidia.com/gpu": "1"}], [{"nvidia.com/gpu": "4"}], {"nvidia.com/gpu": 4},
                     id="a-larger-init-container-wins"),
        pytest.param([{SLICE: "2"}], [{"nvidia.com/gpu": "1"}], {SLICE: 2},
                     id="a-smaller-init-container-does-not"),
        pytest.param([{"cpu": "1"}], [], {}, id="no-gpu"),
    ],
)
def test_the_effective_request_per_resource(containers, init, wanted):
    """The kubelet's effective request (the larger of the containers' sum and any one init
    container: k8s.io/component-helpers resource/helpers.go `PodRequests`)."""
    spec = {"containers": [{"resources": {"limits": c}} for c in containers],
            "initContainers": [{"resources": {"limits": c}} for c in init]}
    p = to_pod(msgspec.convert({"spec": spec}, WirePod), MIXED)
    assert (dict(p.resources), p.gpus) == (wanted, sum(wanted.values()))
