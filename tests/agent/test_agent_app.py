"""The agent in-process: real pynvml into the C library, a gRPC kubelet on a unix socket."""

from __future__ import annotations

import logging
import platform
from importlib.metadata import version
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpusteward.agent.app import create_app
from gpusteward.agent.cli import AgentSettings
from tests.agent.fakes import FakeGpu, FakeKubelet, FakeNvml, Holder, write_proc

NODE = "gpu-node-1"
A = "GPU-c89b14a3-ce7c-6725-8424-b55d37d9c332"
B = "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
UID_TRAIN = "11111111-2222-3333-4444-555555555555"
UID_NB = "66666666-7777-8888-9999-aaaaaaaaaaaa"


def settings(socket: Path, proc_root: Path = Path("/nonexistent")) -> AgentSettings:
    return AgentSettings(node=NODE, interval=3600, pod_resources_socket=str(socket),
                         proc_root=proc_root)


async def scrape(app_settings: AgentSettings) -> str:
    async with TestClient(TestServer(create_app(app_settings))) as client:
        response = await client.get("/metrics")
        assert response.status == 200
        return await response.text()


def lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


async def test_metrics_have_dcgm_names_labels_and_the_pod_from_the_kubelet(
    fake_nvml: FakeNvml, kubelet: FakeKubelet
) -> None:
    fake_nvml.write([FakeGpu(A, util_gpu=87), FakeGpu(B, pci_bus_id="00000000:17:00.0")])
    kubelet.holders = [Holder("ml", "train-0", "trainer", (A,))]

    text = await scrape(settings(kubelet.socket_path))

    assert lines(text, "DCGM_FI_DEV_GPU_UTIL") == [
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{A}",pci_bus_id="00000000:07:00.0",'
        f'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="{NODE}",'
        f'DCGM_FI_DRIVER_VERSION="550.90.07",container="trainer",namespace="ml",'
        f'pod="train-0"}} 87',
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="{B}",pci_bus_id="00000000:17:00.0",'
        f'device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="{NODE}",'
        f'DCGM_FI_DRIVER_VERSION="550.90.07"}} 0',
    ]
    assert kubelet.calls == 1
    assert f'gpusteward_agent_nvml_up{{Hostname="{NODE}"}} 1' in text
    (build,) = lines(text, "gpusteward_build_info")
    assert build == (f'gpusteward_build_info{{python_version="{platform.python_version()}",'
                     f'revision="unknown",version="{version("gpusteward")}"}} 1.0')


async def test_a_gpu_lost_mid_run_carries_an_error_label_and_the_other_goes_on(
    fake_nvml: FakeNvml, kubelet: FakeKubelet
) -> None:
    from gpusteward.agent.app import DEPS, EXPORTED, SETTINGS, collect_once

    fake_nvml.write([FakeGpu(A, util_gpu=10), FakeGpu(B, util_gpu=20)])
    app = create_app(settings(kubelet.socket_path))
    async with TestClient(TestServer(app)) as client:
        fake_nvml.write([FakeGpu(A, util_gpu=10),
                         FakeGpu(B, util_gpu=20, errors={"*": "GPU_IS_LOST"})])
        await collect_once(app[SETTINGS], app[DEPS], app[EXPORTED])
        text = await (await client.get("/metrics")).text()

    assert [line.rsplit(" ", 1)[1] for line in lines(text, "DCGM_FI_DEV_GPU_UTIL")] == ["10"]
    (lost,) = [x for x in lines(text, "DCGM_FI_DEV_XID_ERRORS") if f'UUID="{B}"' in x]
    assert lost.endswith('error="gpu_is_lost"} 79')
    assert 'error="gpu_is_lost"' not in "".join(x for x in text.splitlines() if A in x)


async def test_a_missing_kubelet_socket_gives_metrics_without_pods_and_a_warning(
    fake_nvml: FakeNvml, short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake_nvml.write([FakeGpu(A, util_gpu=42)])

    with caplog.at_level(logging.WARNING, logger="gpusteward.agent"):
        text = await scrape(settings(short_dir / "absent.sock"))

    assert lines(text, "DCGM_FI_DEV_GPU_UTIL")[0].endswith('"550.90.07"} 42')
    assert 'pod="' not in text
    assert 'gpusteward_agent_problem{problem="pod_resources_unavailable"} 1' in text
    assert "without pod labels" in caplog.text


async def test_serve_error_mode_exports_nvml_down_and_healthz_says_why(
    fake_nvml: FakeNvml, short_dir: Path
) -> None:
    fake_nvml.write([], init_error="LIBRARY_NOT_FOUND")

    async with TestClient(TestServer(create_app(settings(short_dir / "x.sock")))) as client:
        text = await (await client.get("/metrics")).text()
        health = await client.get("/healthz")
        health_text = await health.text()

    assert f'gpusteward_agent_nvml_up{{Hostname="{NODE}",error="library_not_found"}} 0' in text
    assert (health.status, health_text) == (200, "serving an error: NVML library_not_found\n")


async def test_a_time_sliced_gpu_is_split_per_pod_by_process(
    fake_nvml: FakeNvml, kubelet: FakeKubelet, proc_root: Path
) -> None:
    fake_nvml.write([FakeGpu(A, util_gpu=75, process_utilization=[
        {"pid": 101, "sm": 50}, {"pid": 202, "sm": 25}])])
    kubelet.holders = [Holder("ml", "train-0", "trainer", (f"{A}::0",)),
                       Holder("lab", "nb-1", "jupyter", (f"{A}::1",)),
                       Holder("lab", "idle-2", "main", (f"{A}::2",))]
    write_proc(proc_root, 101, f"0::/kubepods/burstable/pod{UID_TRAIN}/c\n", "train-0")
    write_proc(proc_root, 202, f"0::/kubepods/burstable/pod{UID_NB}/c\n", "nb-1")

    text = await scrape(settings(kubelet.socket_path, proc_root))

    per_pod = {x.split(',pod="')[1].split('"')[0]: x.rsplit(" ", 1)[1]
               for x in lines(text, "gpusteward_pod_gpu_util")}
    assert per_pod == {"train-0": "50", "nb-1": "25", "idle-2": "0"}
    assert 'pod="' not in lines(text, "DCGM_FI_DEV_GPU_UTIL")[0]
