"""The report, the reclaimer's GPU gauge and the extender's node state count one snapshot with a
time-sliced and a MIG node alike: the report's physical GPUs are the extender's units (replicas,
MIG instances) times one unit's share of a card (core/sharing.py), node by node.

Node shapes are GFD's and the device plugin's (NVIDIA/k8s-device-plugin `internal/lm/resource.go`:
a `-SHARED` product with `nvidia.com/gpu.replicas`, allocatable GPUs x replicas;
`internal/lm/mig-strategy.go`: one `nvidia.com/mig-<profile>` resource per profile, mixed).
"""

from __future__ import annotations

import pytest

from gpusteward.core.reclaim.decide import plan
from gpusteward.core.report.aggregate import build_report
from gpusteward.core.report.model import ReportInput, Window
from gpusteward.core.sharing import FULL_GPU, unit_share
from gpusteward.reclaimer.metrics import ReclaimerMetrics
from tests.factories import A100, node, state
from tests.unit.test_reclaim_decide import NOW, POLICY, gpu_pod, snapshot

T4_SHARED = "Tesla-T4-SHARED"
SLICE = "nvidia.com/mig-1g.10gb"
NODES = {
    "t1": (node("t1", T4_SHARED, 8, labels={"nvidia.com/gpu.replicas": "4"}), FULL_GPU),
    "m1": (node("m1", A100, 7, resources={SLICE: 7}), SLICE),
}
PODS = [
    gpu_pod("replica", node="t1", gpus=1),
    gpu_pod("replicas", node="t1", gpus=2),
    gpu_pod("slices", node="m1", gpus=2, resources={SLICE: 2}),
    gpu_pod("slice", node="m1", gpus=1, resources={SLICE: 1}),
]


def _snapshot():
    return snapshot(PODS, nodes=[n for n, _ in NODES.values()])


def test_the_report_counts_the_extenders_units_in_physical_gpus():
    report = build_report(ReportInput(_snapshot(), Window(NOW - 600, NOW, 60.0)), POLICY,
                          by="node")
    rows = {r.name: r for r in report.groups}
    for name, (n, resource) in NODES.items():
        extender = state(n, pods=[p for p in PODS if p.node == name], gpu_readings=None)
        unit = unit_share(resource, n)
        assert unit < 1  # a replica or a slice: counting units would differ
        row = rows[name]
        assert (row.allocatable, row.allocated, row.free) == pytest.approx(
            (extender.node.gpus * unit, extender.allocated * unit, extender.free * unit)), name


def test_the_reclaimers_gauge_and_the_report_count_the_same_gpus_per_card():
    snap = _snapshot()
    report = build_report(ReportInput(snap, Window(NOW - 600, NOW, 60.0)), POLICY, by="card")
    metrics = ReclaimerMetrics()
    metrics.observe(snap, plan(snap, POLICY), 1.0)
    gauge = {s.labels["card"]: s.value for family in metrics.registry.collect()
             if family.name == "gpusteward_gpus" for s in family.samples
             if s.labels["state"] == "allocated"}
    assert gauge == pytest.approx({r.name: r.allocated for r in report.groups})
    assert set(gauge) == {T4_SHARED, A100}
