"""NvmlReader through the real nvidia-ml-py binding into the C test library (nothing patched).

Distinct values in every field check pynvml's ctypes signatures and struct layouts against the
nvml.h layouts the C library is compiled with; injected NVML error codes check the error tree.
"""

from __future__ import annotations

import asyncio

import pytest

from gpusteward.adapters.nvml import NvmlReader, NvmlUnavailable
from gpusteward.core.nodereadings import ProcessUtil
from tests.agent.fakes import GIB, FakeGpu, FakeNvml

A = "GPU-c89b14a3-ce7c-6725-8424-b55d37d9c332"
B = "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"


async def read_once(reader: NvmlReader):  # type: ignore[no-untyped-def]
    await reader.start()
    try:
        return await reader.read()
    finally:
        await reader.close()


async def test_every_reading_arrives_in_its_own_field(fake_nvml: FakeNvml) -> None:
    fake_nvml.write([FakeGpu(
        A, name="NVIDIA A100-SXM4-80GB", pci_bus_id="00000000:8A:00.0", util_gpu=87,
        util_memory=31, memory_total=80 * GIB, memory_used=12345 * (1 << 20), temperature=41,
        power_mw=250_123,
        processes=[{"pid": 4242, "used_memory": 3 * GIB}, {"pid": 4243, "used_memory": GIB}],
        process_utilization=[{"pid": 4242, "sm": 37, "mem": 11,
                              "timestamp": 1_700_000_000_000_001}],
    )], driver_version="570.124.06")

    snap = await read_once(NvmlReader())

    (gpu,) = snap.gpus
    assert snap.driver_version == "570.124.06"
    assert (gpu.uuid, gpu.name, gpu.pci_bus_id) == (A, "NVIDIA A100-SXM4-80GB", "00000000:8A:00.0")
    assert (gpu.util_percent, gpu.temp_c, gpu.power_mw) == (87.0, 41, 250_123)
    assert (gpu.memory_total_bytes, gpu.memory_used_bytes) == (80 * GIB, 12345 * (1 << 20))
    assert gpu.processes == (ProcessUtil(4242, 37.0, 3 * GIB), ProcessUtil(4243, 0.0, GIB))
    assert gpu.error is None


async def test_an_idle_gpu_raises_not_found_in_nvml_and_reads_as_no_samples(
    fake_nvml: FakeNvml,
) -> None:
    fake_nvml.write([FakeGpu(A, processes=[{"pid": 7, "used_memory": GIB}])])

    (gpu,) = (await read_once(NvmlReader())).gpus

    assert gpu.processes == (ProcessUtil(7, 0.0, GIB),)


async def test_samples_already_seen_are_not_read_twice(fake_nvml: FakeNvml) -> None:
    ts = 1_700_000_000_000_000
    fake_nvml.write([FakeGpu(A, process_utilization=[{"pid": 9, "sm": 50, "timestamp": ts}])])
    reader = NvmlReader()
    await reader.start()
    try:
        first, second = await reader.read(), await reader.read()
    finally:
        await reader.close()

    assert first.gpus[0].processes == (ProcessUtil(9, 50.0, None),)
    assert second.gpus[0].processes == ()


async def test_a_lost_gpu_is_reported_with_its_error_and_the_others_are_read(
    fake_nvml: FakeNvml,
) -> None:
    fake_nvml.write([FakeGpu(A, util_gpu=60), FakeGpu(B, util_gpu=70)])
    reader = NvmlReader()
    await reader.start()
    try:
        before = await reader.read()
        fake_nvml.write([FakeGpu(A, util_gpu=60),
                         FakeGpu(B, util_gpu=70, errors={"*": "GPU_IS_LOST"})])
        after = await reader.read()
    finally:
        await reader.close()

    assert [g.error for g in before.gpus] == [None, None]
    assert (after.gpus[0].util_percent, after.gpus[0].error) == (60.0, None)
    assert (after.gpus[1].uuid, after.gpus[1].error) == (B, "gpu_is_lost")


async def test_a_library_mismatch_drops_the_process_list_and_names_the_problem(
    fake_nvml: FakeNvml,
) -> None:
    fake_nvml.write([FakeGpu(A, util_gpu=5, processes=[{"pid": 1, "used_memory": GIB}],
                             errors={"nvmlDeviceGetComputeRunningProcesses_v3":
                                     "FUNCTION_NOT_FOUND"})])

    snap = await read_once(NvmlReader())

    assert snap.problems == ("library_mismatch",)
    assert (snap.gpus[0].util_percent, snap.gpus[0].processes) == (5.0, ())


async def test_mps_clients_are_read_apart_and_unknown_without_a_sample_of_their_own(
    fake_nvml: FakeNvml,
) -> None:
    # Under MPS the server (pid 100, the device plugin's mps-control-daemon) is the compute
    # process; the clients come from nvmlDeviceGetMPSComputeRunningProcesses (process mode
    # MPSCompute in nvml.h). A client sampled under its own PID reads its sample; one without
    # (no sample, or sampled under the server's) is unknown, not 0.
    fake_nvml.write([FakeGpu(
        A, processes=[{"pid": 100, "used_memory": GIB}],
        mps_processes=[{"pid": 200, "used_memory": 2 * GIB}, {"pid": 201, "used_memory": GIB}],
        process_utilization=[{"pid": 100, "sm": 60}, {"pid": 200, "sm": 30}],
    )])

    (gpu,) = (await read_once(NvmlReader())).gpus

    assert gpu.processes == (ProcessUtil(100, 60.0, GIB),
                             ProcessUtil(200, 30.0, 2 * GIB, mps_client=True),
                             ProcessUtil(201, None, GIB, mps_client=True))


async def test_a_library_without_the_mps_query_keeps_the_compute_processes(
    fake_nvml: FakeNvml,
) -> None:
    fake_nvml.write([FakeGpu(A, processes=[{"pid": 1, "used_memory": GIB}],
                             errors={"nvmlDeviceGetMPSComputeRunningProcesses_v3":
                                     "FUNCTION_NOT_FOUND"})])

    snap = await read_once(NvmlReader())

    assert snap.problems == ("library_mismatch",)
    assert snap.gpus[0].processes == (ProcessUtil(1, 0.0, GIB),)


@pytest.mark.parametrize(
    ("init_error", "reason"),
    [
        pytest.param("DRIVER_NOT_LOADED", "driver_not_loaded", id="no-kernel-driver"),
        pytest.param("LIBRARY_NOT_FOUND", "library_not_found", id="library-not-found"),
        pytest.param("LIB_RM_VERSION_MISMATCH", "lib_rm_version_mismatch", id="rm-mismatch"),
    ],
)
async def test_nvml_that_cannot_start_is_unavailable(
    fake_nvml: FakeNvml, init_error: str, reason: str
) -> None:
    fake_nvml.write([FakeGpu(A)], init_error=init_error)

    with pytest.raises(NvmlUnavailable) as caught:
        await NvmlReader().start()

    assert caught.value.reason == reason


async def test_an_unsupported_reading_is_none(fake_nvml: FakeNvml) -> None:
    fake_nvml.write([FakeGpu(A, errors={"nvmlDeviceGetPowerUsage": "NOT_SUPPORTED",
                                        "nvmlDeviceGetUtilizationRates": "NOT_SUPPORTED"})])

    (gpu,) = (await read_once(NvmlReader())).gpus

    assert (gpu.power_mw, gpu.util_percent, gpu.error) == (None, None, None)


async def wait_for_xid(reader: NvmlReader, index: int, want: int, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (xid := (await reader.read()).gpus[index].xid) != want:
        assert asyncio.get_running_loop().time() < deadline, f"XID {xid}, expected {want}"
        await asyncio.sleep(0.1)


async def test_an_xid_event_reads_for_the_hold_time_then_clears(fake_nvml: FakeNvml) -> None:
    # XID 31 happened before the agent started: not an event to it, as with real NVML.
    fake_nvml.write([FakeGpu(A, xid=31, xid_seq=1), FakeGpu(B)])
    reader = NvmlReader(xid_hold=1.0)
    await reader.start()
    try:
        assert [g.xid for g in (await reader.read()).gpus] == [0, 0]
        fake_nvml.write([FakeGpu(A, xid=31, xid_seq=1), FakeGpu(B, xid=48, xid_seq=1)])
        await wait_for_xid(reader, 1, 48)  # the event thread saw it through nvmlEventSetWait_v2
        assert (await reader.read()).gpus[0].xid == 0
        await wait_for_xid(reader, 1, 0)  # one second later it has cleared
        fake_nvml.write([FakeGpu(A, xid=31, xid_seq=1), FakeGpu(B, xid=94, xid_seq=2)])
        await wait_for_xid(reader, 1, 94)
    finally:
        await reader.close()


async def test_a_gpu_without_xid_events_says_so_and_still_reads(fake_nvml: FakeNvml) -> None:
    fake_nvml.write([FakeGpu(A, util_gpu=12,
                             errors={"nvmlDeviceRegisterEvents": "NOT_SUPPORTED"})])

    snap = await read_once(NvmlReader())

    assert snap.gpus[0].util_percent == 12.0 and snap.gpus[0].error is None
    assert "xid_events_unsupported" in snap.problems
