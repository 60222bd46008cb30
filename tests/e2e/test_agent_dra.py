"""The NVML agent on a DRA node, end to end: a sandbox whose only GPU node's GPUs are served by
NVIDIA's DRA driver (a ResourceSlice, gpusteward.sandbox.dra), with one real agent per node.
Its fake kubelet lists a claim's GPUs as the kubelet's PodResources API does, by driver, pool
and device name (``dynamic_resources``); the agent reads their UUIDs from the node's
ResourceSlice through the API server and labels their series with the pod, as dcgm-exporter's
DRA mapping does, so the agents export the simulator's series, pod labels and all.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.fleet import Fleet, Pool
from tests.e2e.kube import Namespace, gpu_pod
from tests.e2e.test_agent_telemetry import Series, _eventually_equal, _get, dcgm_series
from tests.e2e.test_dra import claim_pod, claim_template
from tests.support.sandbox import fresh_namespace, started

FLEET = Fleet(pools=[Pool(name="h200-dra", product="NVIDIA-H200", count=1, gpus=4,
                          memory_mi_b=143771, dra=True)])


@pytest.fixture(scope="module")
def dra_agent_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from started(tmp_path_factory, "dra-agent-sandbox", fleet=FLEET, telemetry="agent",
                       honor_labels=True)


@pytest.fixture
def dra_ns(dra_agent_sandbox: Sandbox) -> Iterator[Namespace]:
    yield from fresh_namespace(dra_agent_sandbox.api())


def test_the_agent_names_the_pods_of_gpus_dra_claims_hold(dra_agent_sandbox, dra_ns):
    box = dra_agent_sandbox
    claim_template(dra_ns, "two-gpus", 2)
    dra_ns.create_pod(claim_pod("trainer", "two-gpus", node="h200-dra-0", util="70"))
    dra_ns.create_pod(gpu_pod("server", 1, node="h200-dra-0", util="30"))  # DeviceClass-served
    for name in ("trainer", "server"):
        dra_ns.running(name)

    def simulator() -> Series:
        return dcgm_series(_get(f"{box.simulator_url}/metrics"))

    def agents() -> Series:
        return dcgm_series(_get(f"{box.agent_urls()['h200-dra-0']}/metrics"))

    series = _eventually_equal("agent's DCGM series == simulator's", agents, simulator,
                               timeout=60)
    util = sorted((dict(labels).get("pod", ""), value) for (name, labels), value in series.items()
                  if name == "DCGM_FI_DEV_GPU_UTIL")
    assert util == [("", 0.0), ("server", 30.0), ("trainer", 70.0), ("trainer", 70.0)]
