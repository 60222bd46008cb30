"""A real Prometheus scrapes the agent and a dcgm-exporter stand-in; PrometheusSource reads both.

The same GPUs, described once to the NVML test library and once to the DCGM simulator, must come
out of ``PrometheusSource.fetch()`` as the same readings: the agent is a drop-in for the
extender and the reclaimer.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gpusteward.adapters.telemetry import PrometheusSource
from gpusteward.agent.app import create_app
from gpusteward.agent.cli import AgentSettings
from gpusteward.core.dcgm import PodRef
from gpusteward.core.model import Telemetry
from gpusteward.core.policy import parse_policy
from gpusteward.sandbox.simgpu import SimGpu
from tests.agent.fakes import FakeGpu, FakeKubelet, FakeNvml, Holder
from tests.support.fixtures import DcgmEndpoint, PrometheusFactory

A = "GPU-c89b14a3-ce7c-6725-8424-b55d37d9c332"
B = "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
H100 = "NVIDIA H100 80GB HBM3"
MIB = 1 << 20


async def fetch_both(source: PrometheusSource, nodes: set[str]) -> Telemetry:
    deadline = time.monotonic() + 40
    while True:
        telemetry = await source.fetch()
        if all(len(telemetry.nodes.get(n, ())) == 2 for n in nodes):
            return telemetry
        assert time.monotonic() < deadline, f"not scraped yet: {telemetry.nodes}"
        await asyncio.sleep(0.5)


async def test_prometheus_reads_the_agent_exactly_as_it_reads_dcgm_exporter(
    fake_nvml: FakeNvml,
    kubelet: FakeKubelet,
    dcgm_endpoint: DcgmEndpoint,
    prometheus_factory: PrometheusFactory,
) -> None:
    fake_nvml.write([
        FakeGpu(A, util_gpu=87, memory_used=40000 * MIB, temperature=61),
        FakeGpu(B, util_gpu=3, memory_used=512 * MIB, temperature=33),
    ])
    kubelet.holders = [Holder("ml", "train-0", "trainer", (A,))]
    dcgm_endpoint.gpus = [
        SimGpu("dcgm-node", 0, H100, util_percent=87, fb_used_mib=40000, temp_c=61,
               pod=PodRef("ml", "train-0", "trainer")),
        SimGpu("dcgm-node", 1, H100, util_percent=3, fb_used_mib=512, temp_c=33),
    ]
    settings = AgentSettings(node="agent-node", interval=1.0,
                             pod_resources_socket=str(kubelet.socket_path))
    async with TestServer(create_app(settings), host="127.0.0.1") as agent:
        prometheus = prometheus_factory(
            scrape_targets=[f"127.0.0.1:{agent.port}", dcgm_endpoint.target])
        policy = parse_policy({})
        source = PrometheusSource.at(prometheus.url, policy.telemetry, policy.health, attempts=1)
        telemetry = await fetch_both(source, {"agent-node", "dcgm-node"})

    def comparable(node: str) -> list[tuple[object, ...]]:
        return [(r.gpu, r.util, r.temp_c, r.fb_used_mib, r.xid, r.pod)
                for r in sorted(telemetry.nodes[node], key=lambda r: r.gpu)]

    assert comparable("agent-node") == comparable("dcgm-node")
    assert comparable("agent-node")[0][-1] == "ml/train-0"


async def test_a_lost_gpu_reaches_the_readings_as_xid_79(
    fake_nvml: FakeNvml, kubelet: FakeKubelet, prometheus_factory: PrometheusFactory
) -> None:
    # The agent leaves a lost GPU's utilization out (a 0 would read as idle); its only series
    # is the XID. The reading must survive without a utilization sample, or health never sees it.
    fake_nvml.write([FakeGpu(A, util_gpu=40), FakeGpu(B, errors={"*": "GPU_IS_LOST"})])
    settings = AgentSettings(node="agent-node", interval=1.0,
                             pod_resources_socket=str(kubelet.socket_path))
    async with TestServer(create_app(settings), host="127.0.0.1") as agent:
        prometheus = prometheus_factory(scrape_targets=[f"127.0.0.1:{agent.port}"])
        policy = parse_policy({})
        source = PrometheusSource.at(prometheus.url, policy.telemetry, policy.health, attempts=1)
        telemetry = await fetch_both(source, {"agent-node"})
    readings = {r.gpu: r for r in telemetry.nodes["agent-node"]}
    assert (readings["0"].util, readings["0"].xid) == (0.4, 0)
    assert (readings["1"].util, readings["1"].xid) == (None, 79)
    assert time.time() - 30 < readings["1"].sampled_at <= time.time()


@pytest.mark.parametrize("prometheus_major", ["3"], ids=["prometheus-3"])
async def test_prometheus_3_scrapes_the_agent(
    fake_nvml: FakeNvml, kubelet: FakeKubelet, prometheus_factory: PrometheusFactory
) -> None:
    # Prometheus 3 fails a scrape without a valid exposition Content-Type, where 2.x fell back
    # to text (Prometheus 3.0 migration guide, "Scrape protocols"): the target must be up and
    # its series stored.
    fake_nvml.write([FakeGpu(A, util_gpu=87)])
    settings = AgentSettings(node="agent-node", interval=1.0,
                             pod_resources_socket=str(kubelet.socket_path))
    async with TestServer(create_app(settings), host="127.0.0.1") as agent:
        target = f"127.0.0.1:{agent.port}"
        async with aiohttp.ClientSession() as http, http.get(f"http://{target}/metrics") as r:
            assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        prometheus = prometheus_factory(scrape_targets=[target])
        up, stored = f'up{{instance="{target}"}}', (
            f'count({{instance="{target}", __name__!~"up|scrape_.*"}})')
        deadline = time.monotonic() + 40
        while True:
            ups = (await asyncio.to_thread(prometheus.api, "query", query=up))["result"]
            counts = (await asyncio.to_thread(prometheus.api, "query", query=stored))["result"]
            if ups and counts:
                break
            assert time.monotonic() < deadline, f"not scraped yet:\n{prometheus.log_tail()}"
            await asyncio.sleep(0.5)
    assert ups[0]["value"][1] == "1", prometheus.log_tail()
    assert float(counts[0]["value"][1]) >= 1
