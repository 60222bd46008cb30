"""Reclaim evidence from a real Prometheus holding 40 minutes of DCGM history (15 s samples),
stored as a Prometheus Operator ServiceMonitor scrape stores it, in both honorLabels modes."""

from __future__ import annotations

import time

import msgspec
import pytest

from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.snapshot import SnapshotReader
from gpusteward.core.dcgm import PodRef
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.rules import judge, rule_for
from gpusteward.sandbox.scrape import DCGM_EXPORTER
from gpusteward.sandbox.simgpu import SimGpu, render_openmetrics_history
from tests.support.prometheus import servicemonitor
from tests.unit.test_reclaim_decide import gpu_pod

STEP = 15.0
POLICY = parse_policy({"telemetry": {"scrapeInterval": "15s"}})


def gpus_at(now: float, t: float, i: int) -> list[SimGpu]:
    def gpu(node: str, idx: int, pod: str, util: float) -> SimGpu:
        return SimGpu(node, idx, "NVIDIA H100 80GB HBM3", util_percent=util,
                      pod=PodRef("ml", pod, "main"))

    out = [gpu("n1", 0, "idle", 1), gpu("n1", 1, "idle", 2),  # a 2-GPU pod, idle on both
           gpu("n1", 2, "busy", 80),
           gpu("n1", 3, "brief", 90 if now - 600 <= t < now - 540 else 0),
           gpu("n2", 0, "half", 0), gpu("n2", 1, "half", 95)]  # one GPU busy: the pod is busy
    if i % 4 == 0:
        out.append(gpu("n2", 2, "sparse", 0))  # a quarter of the expected samples
    # Exporters that stopped answering near the window's end, the rest of the fleet still
    # scraped: 5.5 min ago (past Prometheus' 5 min lookback, so no current sample at all) and
    # 2 min ago. Their windows keep 82 % and 93 % coverage, above minCoverage 0.8.
    if t <= now - 330:
        out.append(gpu("n3", 0, "stopped-early", 0))
    if t <= now - 120:
        out.append(gpu("n3", 1, "stopped-late", 0))
    return out


def history(now: float, end: float, honor: bool = False) -> str:
    frames, t, i = [], now - 40 * 60, 0
    while t <= end:
        frames.append((t, gpus_at(now, t, i)))
        t += STEP
        i += 1
    return render_openmetrics_history(frames, scrape=servicemonitor(honor))


def reader(url: str) -> SnapshotReader:
    return SnapshotReader(None, PrometheusClient(url, POLICY.telemetry), POLICY)


def on_node(pod: str, gpus: int = 1):
    node = ("n2" if pod in ("half", "sparse") else "n3" if pod.startswith("stopped") else "n1")
    return gpu_pod(pod, gpus=gpus, node=node)


@pytest.fixture(scope="module")
def now() -> float:
    return time.time()


@pytest.fixture(scope="module", params=[False, True],
                ids=["honorLabels-false", "honorLabels-true"])
def prometheus(request, module_prometheus_factory, now):  # read only
    return module_prometheus_factory(history_openmetrics=history(now, now - 5, request.param))


@pytest.mark.parametrize(
    ("pod", "gpus", "state"),
    [
        pytest.param("idle", 2, "idle", id="idle-on-every-gpu"),
        pytest.param("busy", 1, "busy", id="busy"),
        pytest.param("brief", 1, "busy", id="briefly-busy-inside-the-window-is-not-idle"),
        pytest.param("half", 2, "busy", id="one-busy-gpu-makes-the-pod-busy"),
        pytest.param("sparse", 1, "unknown", id="low-coverage-is-unknown"),
        pytest.param("missing", 1, "unknown", id="missing-series-is-unknown"),
        # Evidence must reach the present, whatever the coverage (issue 26).
        pytest.param("stopped-early", 1, "unknown", id="exporter-stopped-past-the-lookback"),
        pytest.param("stopped-late", 1, "unknown", id="exporter-stopped-2-minutes-ago"),
    ],
)
async def test_evidence_over_the_window(prometheus, now, pod, gpus, state):
    pods = (on_node(pod, gpus),)
    evidence, ok, problem = await reader(prometheus.url).evidence(pods, now)
    assert ok, problem
    rule = rule_for(pods[0], POLICY)
    assert judge(evidence[rule.window].get(f"ml/{pod}"), rule, gpus)[0] == state


async def test_a_stopped_exporters_pod_keeps_its_coverage_and_is_held_back_by_its_age(
        prometheus, now):
    evidence, _, _ = await reader(prometheus.url).evidence(
        (on_node("stopped-early"), on_node("stopped-late"), on_node("busy")), now)
    early, late = evidence[1800.0]["ml/stopped-early"], evidence[1800.0]["ml/stopped-late"]
    assert early.age == float("inf")  # no sample within the lookback
    assert 119 <= late.age <= 120 + STEP  # its last sample, on the 15 s grid
    assert evidence[1800.0]["ml/busy"].age <= 30
    # judged by a rule their coverage passes (the module's minutes run on since `now`)
    lenient = msgspec.structs.replace(rule_for(on_node("stopped-late"), POLICY), min_coverage=0.5)
    for ev in (early, late):
        assert ev.coverage > 0.6
        state, why = judge(ev, lenient, 1)
        assert state == "unknown" and "does not reach the present" in why


async def test_peak_and_coverage_are_measured(prometheus, now):
    pods = (on_node("idle", 2), on_node("sparse"))
    evidence, _, _ = await reader(prometheus.url).evidence(pods, now)
    ev = evidence[1800.0]["ml/idle"]
    assert ev.peak_percent == 2.0 and ev.gpus_seen == 2
    assert 0.95 <= ev.coverage <= 1.0
    assert evidence[1800.0]["ml/sparse"].coverage == pytest.approx(0.25, abs=0.03)


async def test_only_pods_holding_gpus_on_the_node_get_evidence(prometheus, now):
    # The exporter's own pod (every series' `pod` under honorLabels: false, the free GPUs' under
    # true) holds no GPU; a pod the API server places on another node is not the holder either.
    exporter = gpu_pod(DCGM_EXPORTER.pod("n1"), ns=DCGM_EXPORTER.namespace, gpus=0)
    moved = gpu_pod("busy", node="n2")
    evidence, ok, _ = await reader(prometheus.url).evidence(
        (on_node("idle", 2), exporter, moved), now)
    assert ok
    assert set(evidence[1800.0]) == {"ml/idle"}


async def test_queries_per_cycle_do_not_grow_with_the_pods(prometheus, now):
    r = reader(prometheus.url)
    await r.evidence((gpu_pod("idle"),), now)
    few = r.prometheus.queries_run
    await r.evidence(tuple(gpu_pod(f"p{i}") for i in range(500)), now)
    # fleet freshness + each GPU's newest sample + peak + count, one window; the first cycle
    # also asks whether windows are left-closed (2.x), lists the metric names present (every
    # minute) and checks units (adapters/unitaudit.py, every 10)
    assert (few, r.prometheus.queries_run - few) == (7, 4)


@pytest.mark.parametrize(
    ("ended_ago", "problem"),
    [
        pytest.param(180, "newest GPU sample is", id="samples-older-than-staleAfter"),
        pytest.param(600, "no utilization series (DCGM_FI_DEV_GPU_UTIL or",
                     id="series-gone-from-lookback"),
    ],
)
async def test_stale_telemetry_halts_the_cycle(prometheus_factory, now, ended_ago, problem):
    prom = prometheus_factory(history_openmetrics=history(now, now - ended_ago))
    _, ok, why = await reader(prom.url).evidence((gpu_pod("idle"),), now)
    assert not ok and problem in why


async def test_unreachable_prometheus_halts_the_cycle(unused_tcp_port, now):
    _, ok, problem = await reader(f"http://127.0.0.1:{unused_tcp_port}").evidence(
        (gpu_pod("idle"),), now)
    assert not ok and "unreachable" in problem
