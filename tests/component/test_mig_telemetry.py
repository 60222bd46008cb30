"""An all-MIG fleet in a real Prometheus: the extender's load, the reclaimer's freshness probe and
evidence, and the report's utilization all read MIG instances from GR_ENGINE_ACTIVE.

The history is what dcgm-exporter prints for MIG instances (core/dcgm.py, after
`gpuMetricsFormat` in dcgm-exporter's `internal/pkg/rendermetrics/render_metrics.go` and the MIG
line quoted in NVIDIA/dcgm-exporter#272): the parent's `gpu`/`UUID`, then `GPU_I_PROFILE` and
`GPU_I_ID`; `DCGM_FI_DEV_GPU_UTIL` absent (NVIDIA/dcgm-exporter#50, #430) or printed as 0
(NVIDIA/dcgm-exporter#216). Both variants run every case.
"""

from __future__ import annotations

import time

import pytest

from gpusteward.adapters.snapshot import SnapshotReader
from gpusteward.adapters.telemetry import PrometheusSource
from gpusteward.core.attribution import Attribution
from gpusteward.core.dcgm import MigInstance, PodRef
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.rules import judge, rule_for
from gpusteward.report.usage import series, utilization_query
from gpusteward.sandbox.simgpu import SimGpu, render_openmetrics_history
from tests.unit.test_reclaim_decide import gpu_pod

STEP = 15.0
POLICY = parse_policy({"telemetry": {"scrapeInterval": "15s"}})
A100_NAME = "NVIDIA A100-SXM4-80GB"


def instances(gpu_util: str) -> list[SimGpu]:
    """GPU 0 of node m1 as 7 x 1g.10gb: instance 7 busy, instance 8 idle, the rest free."""
    busy = {7: ("busy", 85.0), 8: ("idle", 1.0)}
    out = []
    for gi in range(7, 14):
        pod, util = busy.get(gi, (None, 0.0))
        out.append(SimGpu("m1", 0, A100_NAME, util_percent=util,
                          mig=MigInstance(gi, "1g.10gb", gpu_util),
                          pod=PodRef("ml", pod, "main") if pod else None))
    return out


def history(now: float, mig_gpu_util: str) -> str:
    frames, t = [], now - 40 * 60
    while t <= now - 5:
        frames.append((t, instances(mig_gpu_util)))
        t += STEP
    return render_openmetrics_history(frames, extra_labels={"job": "dcgm", "instance": "d:9400"})


@pytest.fixture(scope="module")
def now() -> float:
    return time.time()


@pytest.fixture(params=["absent", "zero"])
def prometheus(request, prometheus_factory, now):
    return prometheus_factory(history_openmetrics=history(now, request.param))


def source(url: str) -> PrometheusSource:
    return PrometheusSource.at(url, POLICY.telemetry, POLICY.health)


async def test_the_extender_reads_each_instance_from_engine_activity(prometheus):
    telemetry = await source(prometheus.url).fetch()
    readings = {r.gpu: r for r in telemetry.for_node("m1")}
    assert set(readings) == {f"0/mig{gi}" for gi in range(7, 14)}
    assert readings["0/mig7"].util == pytest.approx(0.85)
    assert readings["0/mig7"].pod == "ml/busy"
    assert readings["0/mig8"].util == pytest.approx(0.01)


@pytest.mark.parametrize(("pod", "state"), [("busy", "busy"), ("idle", "idle")])
async def test_the_reclaimer_judges_mig_pods_by_engine_activity(prometheus, now, pod, state):
    pods = (gpu_pod(pod, node="m1", gpus=1),)
    reader = SnapshotReader(None, source(prometheus.url).client, POLICY)
    evidence, ok, problem = await reader.evidence(pods, now)
    assert ok, problem  # the freshness probe finds the MIG series
    rule = rule_for(pods[0], POLICY)
    assert judge(evidence[rule.window].get(f"ml/{pod}"), rule, 1)[0] == state


async def test_the_report_reads_instances_from_engine_activity(prometheus, now):
    result = await source(prometheus.url).client.query_range(
        utilization_query(60.0, STEP), now - 600, now - 60, 60.0)
    who = Attribution.of(["Hostname"], "auto", ["m1"],
                         [gpu_pod("busy", node="m1"), gpu_pod("idle", node="m1")])
    by_pod = {s.pod: s for s in series(result, who)}
    assert set(by_pod) == {"ml/busy", "ml/idle"}
    assert {v for _, v in by_pod["ml/busy"].points} == {85.0}
    assert by_pod["ml/busy"].gpu.endswith("/mig7")
