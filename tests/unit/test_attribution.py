"""Who holds a GPU and which node a series is from (gpusteward/core/attribution.py), from the
label sets Prometheus stores for dcgm-exporter under a Prometheus Operator ServiceMonitor.

Shapes: dcgm-exporter adds ``container``/``namespace``/``pod`` only to GPUs mapped to a pod
(``DCGMX: internal/pkg/transformation/kubernetes.go``); the Operator's relabelings give every
target ``namespace``/``service``/``pod``/``container``/``endpoint``/``job``; Prometheus renames
a clashing series label to ``exported_<name>`` unless ``honor_labels`` (scrape/scrape.go
``mutateSampleLabels``; checked live in tests/component/test_prometheus_harness.py); the
dcgm-exporter chart's ServiceMonitor defaults to ``honorLabels: false`` (chart 4.8.2
``values.yaml``); an exporter without ``NODE_NAME`` writes its pod's name in ``Hostname``
(NVIDIA/gpu-operator#472, stored with a scrape ``node`` label).
"""

from __future__ import annotations

import json
import random

import pytest

from gpusteward.adapters.kube import Watcher, _event_decoder
from gpusteward.adapters.snapshot import per_pod
from gpusteward.adapters.telemetry import PrometheusSource
from gpusteward.core.attribution import Attribution, claimed_pod, held_only, honor_mode, node_of
from gpusteward.core.fleet import FleetStore
from gpusteward.core.model import GpuReading
from gpusteward.core.nodestate import build_node_state
from gpusteward.core.policy import Health, parse_policy
from tests.factories import H100, node, pod
from tests.support.prometheus import stored_labels

EXPORTER = "nvidia-dcgm-exporter-57pvc"
TARGET = {"namespace": "gpu-operator", "service": "nvidia-dcgm-exporter", "pod": EXPORTER,
          "container": "nvidia-dcgm-exporter", "endpoint": "gpu-metrics",
          "job": "nvidia-dcgm-exporter", "instance": "10.244.1.9:9400"}
HELD = [("gpu", "0"), ("Hostname", "n1"), ("container", "main"), ("namespace", "ml"),
        ("pod", "train-0")]
FREE = [("gpu", "1"), ("Hostname", "n1")]


def stored(exposed, honor: bool) -> dict[str, str]:
    return dict(stored_labels(exposed, TARGET, honor))


@pytest.mark.parametrize(("labels", "mode", "claim"), [
    pytest.param(stored(HELD, False), "auto", "ml/train-0", id="false-held-workload-wins"),
    pytest.param(stored(FREE, False), "auto", f"gpu-operator/{EXPORTER}",
                 id="false-free-names-the-exporter"),
    pytest.param(stored(HELD, True), "auto", "ml/train-0", id="true-held"),
    pytest.param(stored(FREE, True), "auto", f"gpu-operator/{EXPORTER}",
                 id="true-free-names-the-exporter"),
    pytest.param(dict(HELD), "auto", "ml/train-0", id="plain-scrape"),
    pytest.param(stored(FREE, False), "false", None, id="forced-false-pod-is-the-target"),
    pytest.param(dict(HELD), "false", None, id="forced-false-ignores-a-plain-pod"),
    pytest.param({**stored(HELD, True), "exported_pod": "x"}, "true", "ml/train-0",
                 id="forced-true-ignores-exported"),
])
def test_the_claimed_pod(labels, mode, claim):
    assert claimed_pod(labels, mode) == claim


@pytest.mark.parametrize("honor", [False, True])
def test_only_a_pod_holding_gpus_on_that_node_holds_the_gpu(honor):
    who = Attribution.of(["Hostname"], "auto", ["n1", "n2"],
                         [pod("train-0", node="n1"), pod("exp", node="n1", gpus=0),
                          pod("other", node="n2")])
    assert who.pod(stored(HELD, honor)) == "ml/train-0"
    assert who.pod(stored(FREE, honor)) is None  # the exporter's pod is no holder
    moved = {**stored(HELD, honor), "Hostname": "n2"}  # the API server has it on n1
    assert who.pod(moved) is None


@pytest.mark.parametrize(("value", "mode"), [(True, "true"), (False, "false"),
                                             ("auto", "auto")])
def test_honor_mode_reads_yaml_booleans(value, mode):
    assert honor_mode(value) == mode
    assert parse_policy({"telemetry": {"honorLabels": value}}).telemetry.honor_labels == value


def test_honor_mode_rejects_anything_else():
    with pytest.raises(ValueError, match="auto, true or false"):
        honor_mode("yes")


@pytest.mark.parametrize(("labels", "known", "pod_nodes", "expected"), [
    pytest.param({"Hostname": "n1"}, None, None, "n1", id="no-fleet-first-present"),
    pytest.param({"Hostname": EXPORTER, "node": "n2"}, {"n1", "n2"}, {}, "n2",
                 id="older-exporter-scrape-node-label"),
    pytest.param({"Hostname": EXPORTER}, {"n1", "n2"}, {EXPORTER: "n1"}, "n1",
                 id="older-exporter-its-pods-node"),
    pytest.param({"Hostname": "x", "pod": EXPORTER}, {"n1"}, {EXPORTER: "n1"}, "n1",
                 id="the-targets-pod-node"),
    pytest.param({"Hostname": "gone"}, {"n1"}, {}, "gone", id="unknown-stays-unknown"),
    pytest.param({"hostname": "n1", "Hostname": EXPORTER}, {"n1"}, {}, "n1",
                 id="first-label-naming-a-node"),
])
def test_node_of(labels, known, pod_nodes, expected):
    assert node_of(labels, ["Hostname", "hostname"], known, pod_nodes) == expected


def test_a_lost_free_gpu_named_for_the_exporter_still_takes_a_free_slot():
    # honorLabels: true, GPU 1 fell off the bus and no pod holds it: Prometheus filled in the
    # exporter's own pod. It must count as free and unhealthy, not held.
    now = 1000.0
    readings = (GpuReading("n1", "0", util=0.5, sampled_at=now, pod="ml/train-0"),
                GpuReading("n1", "1", util=0.0, xid=79, sampled_at=now,
                           pod=f"gpu-operator/{EXPORTER}"))
    state = build_node_state(node("n1", H100, gpus=2), None, [pod("train-0", node="n1")],
                             readings, Health(), now, 60.0)
    assert (state.free, state.unhealthy_free, state.healthy_free) == (1, 1, 0)
    assert held_only(readings, {"ml/train-0"})[1].pod is None


def _series(labels: dict[str, str], value: float) -> dict:
    return {"metric": labels, "value": [0, str(value)]}


DEVICE = {"UUID": "GPU-1", "gpu": "0", "Hostname": "n1"}
# Two pods time-sharing one GPU: the device reads 80 %, dcgm-exporter's per-pod copies
# (--kubernetes-virtual-gpus, labelled vgpu) and the agent's per-pod series say who used it.
SHARED = [
    _series(DEVICE, 80),
    _series({**DEVICE, "namespace": "ml", "pod": "busy", "vgpu": "0"}, 80),
    _series({**DEVICE, "namespace": "ml", "pod": "idle", "vgpu": "1"}, 0),
]


@pytest.mark.parametrize("seed", range(6))
def test_per_pod_evidence_comes_from_per_pod_series_whatever_their_order(seed):
    peaks = random.Random(seed).sample(SHARED, len(SHARED))
    counts = [_series(s["metric"], 30) for s in peaks]
    who = Attribution.of(["Hostname"], "auto", ["n1"],
                         [pod("busy", node="n1"), pod("idle", node="n1")])
    evidence = per_pod(1800.0, peaks, counts, 30.0, who)
    assert {k: e.peak_percent for k, e in evidence.items()} == {"ml/busy": 80, "ml/idle": 0}
    assert all(e.coverage == 1.0 for e in evidence.values())


@pytest.mark.parametrize("seed", range(6))
def test_node_load_comes_from_the_device_series_whatever_the_order(seed):
    policy = parse_policy({})
    source = PrometheusSource.at("http://127.0.0.1:9", policy.telemetry, policy.health,
                              clock=lambda: 100.0)
    copies = [_series({**s["metric"], "Hostname": "n1"}, float(s["value"][1]) / 100)
              for s in SHARED]
    copies[0] = _series(DEVICE, 0.8)  # the device
    stamps = [_series(s["metric"], 99.0) for s in copies]
    order = random.Random(seed)
    telemetry = source.assemble({"util": order.sample(copies, 3),
                                 "util_at": order.sample(stamps, 3)})
    (reading,) = telemetry.for_node("n1")
    assert reading.util == pytest.approx(0.8)
    assert reading.pod == "ml/busy"  # held (by both): one of its pods, the same every time


def _event(kind: str, name: str, node: str | None, gpus: int = 0) -> bytes:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    pod = {"metadata": {"name": name, "namespace": "gpu-operator", "uid": f"uid-{name}",
                        "resourceVersion": "1"},
           "spec": {"nodeName": node, "containers": [{"resources": {"limits": limits}}]},
           "status": {"phase": "Running"}}
    return json.dumps({"type": kind, "object": pod}).encode()


def test_the_pod_watch_keeps_the_node_of_pods_that_hold_no_gpu():
    # The extender's fleet only indexes GPU pods; an exporter's pod is remembered by name alone.
    store = FleetStore()
    watcher = Watcher(None, store, "pods", ["nvidia.com/gpu"])
    for line in (_event("ADDED", EXPORTER, "n1"), _event("ADDED", "train-0", "n1", gpus=1),
                 _event("ADDED", "pending", None)):
        watcher._apply(_event_decoder.decode(line))
    assert store.pod_nodes() == {EXPORTER: "n1"}
    watcher._apply(_event_decoder.decode(_event("DELETED", EXPORTER, "n1")))
    assert store.pod_nodes() == {}
