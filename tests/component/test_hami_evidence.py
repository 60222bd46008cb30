"""Reclaim evidence for pods on GPUs HAMi slices, from a real Prometheus holding 40 minutes of
dcgm-exporter's device series and HAMi's vGPU monitor's per-container series (15 s samples),
each as a Prometheus Operator ServiceMonitor stores it, in both honorLabels modes and under
both of HAMi's metric names (gpusteward.sandbox.hamimon cites the monitor's source).

dcgm-exporter maps no HAMi pod to its GPU (HAMi's kubelet device ids are ``<UUID>-<n>``,
Project-HAMi/HAMi pkg/device-plugin/nvidiadevice/nvinternal/rm/devices.go), so the device series
carry no pod; one test adds a mapping to show that a shared GPU's device series is believed
for nobody.
"""

from __future__ import annotations

import time

import pytest

from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.snapshot import SnapshotReader
from gpusteward.core import hami
from gpusteward.core.dcgm import PodRef
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.rules import judge, rule_for
from gpusteward.sandbox.hamimon import HAMI_MONITOR, ContainerSlice, render_history
from gpusteward.sandbox.scrape import DCGM_EXPORTER
from gpusteward.sandbox.simgpu import SimGpu, join_openmetrics, render_openmetrics_history
from tests.support.prometheus import servicemonitor
from tests.unit.test_reclaim_decide import gpu_pod

STEP = 15.0
POLICY = parse_policy({"telemetry": {"scrapeInterval": "15s"}})
NODE = "n1"
# GPU 0: "quiet" (idle) and "loud" (busy) share it, the device reads loud's work.
# GPU 1: "alone" holds it by itself, idle; the monitor has no series of it (no CUDA context
#        yet): judged by the device.
# GPU 2: "mute" and "neighbour" share it, both idle, but the monitor reports only neighbour;
#        dcgm-exporter (in the mapped variant) names "mute" on the device series.
DEVICE_UTIL = {0: 70.0, 1: 2.0, 2: 0.0}
OWN = {("quiet", 0): 1.0, ("loud", 0): 70.0, ("neighbour", 2): 0.0}
HOLDS = {"quiet": 0, "loud": 0, "alone": 1, "mute": 2, "neighbour": 2}


def device(index: int, mapped: bool) -> SimGpu:
    pod = PodRef("ml", "mute", "main") if mapped and index == 2 else None
    return SimGpu(NODE, index, "NVIDIA H100 80GB HBM3", util_percent=DEVICE_UTIL[index], pod=pod)


def history(now: float, honor: bool, legacy: bool, mapped: bool) -> str:
    times = [now - 40 * 60 + i * STEP for i in range(int(40 * 60 / STEP))]
    dcgm = render_openmetrics_history(
        [(t, [device(i, mapped) for i in DEVICE_UTIL]) for t in times],
        scrape=servicemonitor(honor))
    mine = [ContainerSlice(NODE, "ml", pod, "main", device(i, False).uuid, util)
            for (pod, i), util in OWN.items()]
    monitor = render_history([(t, mine) for t in times], legacy=legacy,
                             scrape=servicemonitor(honor, HAMI_MONITOR))
    return join_openmetrics(dcgm, monitor)


def sliced(name: str, cores: int = 30):
    uuid = device(HOLDS[name], False).uuid
    return gpu_pod(name, node=NODE, annotations={hami.ALLOCATED: f"{uuid},NVIDIA,8192,{cores}:;"})


PODS = tuple(sliced(name) for name in HOLDS)
# Every pod's node, the monitor's and the exporter's too, as SnapshotReader.read finds them.
POD_NODES = {**{p.name: NODE for p in PODS}, HAMI_MONITOR.pod(NODE): NODE,
             DCGM_EXPORTER.pod(NODE): NODE}


@pytest.fixture(scope="module")
def now() -> float:
    return time.time()


@pytest.fixture(scope="module", params=[
    pytest.param((False, False), id="honorLabels-false-v2.9-names"),
    pytest.param((True, False), id="honorLabels-true-v2.9-names"),
    pytest.param((False, True), id="honorLabels-false-legacy-names"),
])
def prometheus(request, module_prometheus_factory, now):  # read only
    honor, legacy = request.param
    return module_prometheus_factory(history_openmetrics=history(now, honor, legacy, False))


async def states(url: str, now: float) -> dict[str, str]:
    reader = SnapshotReader(None, PrometheusClient(url, POLICY.telemetry), POLICY)
    who = reader.attribution({NODE}, PODS, POD_NODES)
    evidence, ok, problem = await reader.evidence(PODS, now, who)
    assert ok, problem
    rule = rule_for(PODS[0], POLICY)
    return {p.name: judge(evidence[rule.window].get(p.key), rule, 1)[0] for p in PODS}


async def test_each_pod_is_judged_by_its_own_series_or_by_a_device_it_holds_alone(
        prometheus, now):
    assert await states(prometheus.url, now) == {
        "quiet": "idle",  # its own 1 %, though the device it shares reads 70 %
        "loud": "busy",
        "alone": "idle",  # the device's 2 %, the only pod there
        "mute": "unknown",  # no series of its own on a shared GPU
        "neighbour": "idle",
    }


async def test_a_shared_gpus_device_series_that_names_one_pod_is_believed_for_none(
        prometheus_factory, now):
    server = prometheus_factory(history_openmetrics=history(now, False, False, True))
    assert (await states(server.url, now))["mute"] == "unknown"
