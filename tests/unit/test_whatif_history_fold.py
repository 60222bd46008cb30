"""Folding range-query answers into a what-if history: what the record lacks is said, owners and
labels come back from kube-state-metrics' names (docs/metrics/workload/pod-metrics.md:
``label_<sanitized key>``; ``created_by``/``owner_*`` as ``<none>`` without an owner)."""

from __future__ import annotations

import pytest

from gpusteward.adapters.historyfold import Facts, NoHistory, Series, label_name
from gpusteward.core.policy import parse_policy
from gpusteward.core.whatif.history import Grid

POLICY = parse_policy({})
GRID = Grid(1_800_000_000.0, 60.0, 10)


def points(first: int, last: int, value: str = "1") -> list[list]:
    return [[GRID.time(i), value] for i in range(first, last + 1)]


def facts_with_pods() -> Facts:
    facts = Facts(GRID, POLICY.telemetry.node_labels)
    facts.add("info", [Series({"namespace": "ml", "pod": "web-5d8f-abcde", "uid": "u1",
                               "node": "n1", "priority_class": ""}, points(0, 9))])
    facts.add("phase", [Series({"uid": "u1", "phase": "Running"}, points(0, 9))])
    facts.add("gpus", [Series({"uid": "u1", "resource": "nvidia_com_gpu"}, points(9, 9, "2"))])
    facts.add("owner", [Series({"uid": "u1", "owner_kind": "ReplicaSet",
                                "owner_name": "web-5d8f"}, points(9, 9))])
    facts.add("labels", [Series({"uid": "u1", label_name("gpusteward.io/team"): "vision"},
                                points(9, 9))])
    return facts


def test_pods_without_gpu_telemetry_in_the_window_are_no_history_to_replay():
    with pytest.raises(NoHistory, match="no GPU telemetry"):
        facts_with_pods().history(POLICY)


def test_a_replicaset_pod_belongs_to_its_deployment_and_keeps_its_team():
    facts = facts_with_pods()
    gpu = {"UUID": "GPU-1", "Hostname": "n1", "gpu": "0", "exported_namespace": "ml",
           "exported_pod": "web-5d8f-abcde"}
    facts.add("peak", [Series(gpu, points(0, 9, "0"))])
    facts.add("count", [Series(gpu, points(0, 9, "2"))])
    history = facts.history(POLICY)
    (record,) = history.pods
    assert record.pod.gpus == 2 and record.pod.labels == {"gpusteward.io/team": "vision"}
    assert history.owners["u1"].key == "ml/Deployment/web"
    assert len(record.gpus) == 1 and list(record.gpus[0].samples) == [2.0] * 10
    assert any("annotations" in g for g in history.gaps)


def test_a_series_with_gaps_and_points_before_the_window_is_folded_step_by_step():
    # Prometheus' range answer leaves out the steps where a series had no sample (an exporter
    # outage): those steps stay unsampled; points before the grid are dropped.
    facts = Facts(GRID, POLICY.telemetry.node_labels)
    gpu = {"Hostname": "n1", "UUID": "GPU-1", "gpu": "0"}
    steps = [-1, 0, 1, 3, 4]
    facts.add("peak", [Series(gpu, [(GRID.time(i), f"{10 * i}") for i in steps])])
    facts.add("count", [Series(gpu, [(GRID.time(i), "2") for i in steps])])
    piece = facts.gpu_series[tuple(sorted(gpu.items()))]
    assert piece.first == 0
    assert list(piece.peaks) == [0.0, 10.0, -1.0, 30.0, 40.0]
    assert list(piece.samples) == [2.0, 2.0, 0.0, 2.0, 2.0]
    assert list(facts.telemetry) == [1, 1, 0, 1, 1, 0, 0, 0, 0, 0]
