"""The agent on a DRA node: the kubelet's PodResources lists a claim's GPU by driver, pool and
device name (podresources v1 ``DynamicResource``/``ClaimResource``, kubelet feature
KubeletPodResourcesDynamicResources), and the node's ResourceSlice gives its UUID (NVIDIA's DRA
driver publishes a ``uuid`` attribute per device, k8s-dra-driver-gpu ``deviceinfo.go``)."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from gpusteward.adapters.dradevices import DeviceKey, DraDevices
from gpusteward.agent.app import AgentDeps, create_app
from tests.agent.fakes import FakeGpu, FakeKubelet, FakeNvml, Holder
from tests.agent.test_agent_app import NODE, A, B, lines, settings

DRIVER = "gpu.nvidia.com"


class Slices:
    """This node's ResourceSlice as the lister reads it; counts the LISTs."""

    def __init__(self, uuids: dict[DeviceKey, str]) -> None:
        self.uuids, self.calls = uuids, 0

    async def __call__(self) -> dict[DeviceKey, str]:
        self.calls += 1
        return dict(self.uuids)


async def scrape_with(kubelet: FakeKubelet, slices: Slices) -> str:
    deps = AgentDeps(dra=DraDevices(slices))
    async with TestClient(TestServer(create_app(settings(kubelet.socket_path), deps))) as c:
        response = await c.get("/metrics")
        return await response.text()


async def test_a_gpu_held_through_a_dra_claim_carries_its_pod(fake_nvml: FakeNvml,
                                                              kubelet: FakeKubelet) -> None:
    fake_nvml.write([FakeGpu(A, util_gpu=87), FakeGpu(B)])
    kubelet.holders = [Holder("ml", "train-0", "trainer", (), claim=(
        "train-0-gpu-x7k2p", ((DRIVER, NODE, "gpu-1"),)))]
    slices = Slices({(DRIVER, NODE, "gpu-0"): A, (DRIVER, NODE, "gpu-1"): B})

    text = await scrape_with(kubelet, slices)

    by_uuid = {uuid: line for line in lines(text, "DCGM_FI_DEV_GPU_UTIL")
               for uuid in (A, B) if f'UUID="{uuid}"' in line}
    assert by_uuid[B].endswith('container="trainer",namespace="ml",pod="train-0"} 0')
    assert "pod=" not in by_uuid[A]
    assert slices.calls == 1


async def test_a_device_the_slices_do_not_name_is_exported_without_a_pod(
        fake_nvml: FakeNvml, kubelet: FakeKubelet) -> None:
    fake_nvml.write([FakeGpu(A)])
    kubelet.holders = [Holder("ml", "train-0", "trainer", (), claim=(
        "c", (("other.example.com", NODE, "dev-0"),)))]

    text = await scrape_with(kubelet, Slices({}))

    assert all("pod=" not in line for line in lines(text, "DCGM_FI_DEV_GPU_UTIL"))
