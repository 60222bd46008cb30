"""The pure step: NVML readings and kubelet assignments -> dcgm-exporter text (+ ours)."""

from __future__ import annotations

from gpusteward.agent.collect import collect, shared, unavailable_view
from gpusteward.agent.exposition import render
from gpusteward.core.nodereadings import (
    DeviceAssignment,
    GpuSample,
    NvmlSnapshot,
    PidOwner,
    PodRef,
    ProcessUtil,
)
from gpusteward.sandbox.simgpu import SimGpu, render_exposition

NODE = "gpu-node-1"
H100 = "NVIDIA H100 80GB HBM3"
MIB = 1 << 20
TRAINER = PodRef(namespace="ml", name="train-0", container="trainer")
NOTEBOOK = PodRef(namespace="lab", name="nb-1", container="jupyter")
UID_TRAINER = "11111111-2222-3333-4444-555555555555"
UID_NOTEBOOK = "66666666-7777-8888-9999-aaaaaaaaaaaa"


def sample(index: int = 0, **changes: object) -> GpuSample:
    fields: dict[str, object] = dict(
        index=index, uuid=f"GPU-{index}", name=H100, pci_bus_id="00000000:07:00.0",
        util_percent=87.0, memory_total_bytes=81559 * MIB, memory_used_bytes=40000 * MIB,
        temp_c=41, power_mw=250_500,
    )
    return GpuSample(**{**fields, **changes})  # type: ignore[arg-type]


def snapshot(*gpus: GpuSample) -> NvmlSnapshot:
    return NvmlSnapshot(driver_version="550.90.07", gpus=gpus)


def series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_a_whole_gpu_prints_exactly_what_dcgm_exporter_prints() -> None:
    view = collect(snapshot(sample()), NODE, [DeviceAssignment("GPU-0", TRAINER)])

    text = render(view)

    expected = render_exposition([SimGpu(NODE, 0, H100, util_percent=87, memory_mib=81559,
                                          fb_used_mib=40000, temp_c=41, power_w=250.5,
                                          pod=TRAINER)])
    dcgm_lines = [line for line in text.splitlines() if "DCGM_FI_" in line]
    sim_uuid, sim_bus = SimGpu(NODE, 0, H100).uuid, SimGpu(NODE, 0, H100).pci_bus_id
    assert dcgm_lines == expected.replace(sim_uuid, "GPU-0").replace(
        sim_bus, "00000000:07:00.0").splitlines()


def test_a_lost_gpu_carries_an_error_and_xid_79_while_the_others_go_on() -> None:
    view = collect(snapshot(sample(0, util_percent=55.0),
                            GpuSample(index=1, uuid="GPU-1", error="gpu_is_lost")), NODE)

    text = render(view)

    (xid_lost,) = [s for s in series(text, "DCGM_FI_DEV_XID_ERRORS") if 'gpu="1"' in s]
    assert xid_lost.endswith(',error="gpu_is_lost"} 79')
    assert [s for s in series(text, "DCGM_FI_DEV_GPU_UTIL")] == [
        s for s in series(text, "DCGM_FI_DEV_GPU_UTIL") if 'gpu="0"' in s
    ]
    assert len(series(text, "DCGM_FI_DEV_GPU_UTIL")) == 1
    assert series(text, "gpusteward_agent_gpu_error") == [
        'gpusteward_agent_gpu_error{gpu="1",UUID="GPU-1",device="nvidia1",'
        'Hostname="gpu-node-1",error="gpu_is_lost"} 1'
    ]


def test_an_unsupported_reading_is_left_out_not_printed_as_zero() -> None:
    text = render(collect(snapshot(sample(power_mw=None)), NODE))

    assert series(text, "DCGM_FI_DEV_POWER_USAGE") == []
    assert len(series(text, "DCGM_FI_DEV_GPU_UTIL")) == 1


def test_a_gpu_shared_by_two_pods_gets_per_pod_utilization_and_no_pod_on_the_device() -> None:
    gpu = sample(processes=(ProcessUtil(10, 30.0), ProcessUtil(11, 5.0), ProcessUtil(20, 40.0),
                            ProcessUtil(99, 10.0)))
    held = [DeviceAssignment("GPU-0", TRAINER, "0"), DeviceAssignment("GPU-0", NOTEBOOK, "1")]
    owners = {10: PidOwner(UID_TRAINER, "train-0"), 11: PidOwner(UID_TRAINER, "train-0"),
              20: PidOwner(UID_NOTEBOOK, "nb-1")}

    text = render(collect(snapshot(gpu), NODE, held, owners))

    assert all('pod="' not in s for s in series(text, "DCGM_FI_DEV_GPU_UTIL"))
    per_pod = series(text, "gpusteward_pod_gpu_util")
    assert [(s.split('pod="')[1].split('"')[0], s.rsplit(" ", 1)[1]) for s in per_pod] == [
        ("train-0", "35"), ("nb-1", "40")]
    assert f'pod_uid="{UID_TRAINER}"' in per_pod[0]


def test_a_replica_holder_without_processes_reads_zero() -> None:
    held = [DeviceAssignment("GPU-0", TRAINER, "0"), DeviceAssignment("GPU-0", NOTEBOOK, "1")]

    text = render(collect(snapshot(sample()), NODE, held, {}))

    assert [s.rsplit(" ", 1)[1] for s in series(text, "gpusteward_pod_gpu_util")] == ["0", "0"]


def test_an_mps_client_without_a_sample_of_its_own_leaves_its_pod_unknown() -> None:
    # Two pods on MPS replicas of one GPU: the trainer's client has no sample of its own (NVML
    # may sample MPS work under the server), so it gets no series: unknown, not idle. The
    # notebook, with no process at all, reads 0; the server (pid 5, in a pod that holds no
    # replica) is named by its pod UID alone, as any such process is.
    gpu = sample(processes=(ProcessUtil(5, 70.0), ProcessUtil(10, None, mps_client=True),
                            ProcessUtil(11, 20.0, mps_client=True)))
    held = [DeviceAssignment("GPU-0", TRAINER, "0"), DeviceAssignment("GPU-0", NOTEBOOK, "1")]
    owners = {5: PidOwner("mps-daemon-uid", "nvidia-device-plugin-mps-control-daemon-x"),
              10: PidOwner(UID_TRAINER, "train-0"), 11: PidOwner(UID_TRAINER, "train-0")}

    text = render(collect(snapshot(gpu), NODE, held, owners))

    named = [s for s in series(text, "gpusteward_pod_gpu_util") if 'pod="' in s]
    assert [(s.split('pod="')[1].split('"')[0], s.rsplit(" ", 1)[1]) for s in named] == [
        ("nb-1", "0")]
    assert UID_TRAINER not in text


def test_a_single_time_sliced_replica_keeps_the_pod_on_the_device_series() -> None:
    held = [DeviceAssignment("GPU-0", TRAINER, "3")]

    text = render(collect(snapshot(sample()), NODE, held))

    assert 'pod="train-0"' in series(text, "DCGM_FI_DEV_GPU_UTIL")[0]


def test_without_the_kubelet_the_problem_is_exported_and_no_pod_labels() -> None:
    view = collect(snapshot(sample()), NODE, problems=["pod_resources_unavailable"])

    text = render(view)

    assert 'gpusteward_agent_problem{problem="pod_resources_unavailable"} 1' in text
    assert 'pod="' not in text


def test_nvml_unavailable_is_an_error_metric() -> None:
    text = render(unavailable_view(NODE, "library_not_found"))

    assert 'gpusteward_agent_nvml_up{Hostname="gpu-node-1",error="library_not_found"} 0' in text
    assert series(text, "DCGM_FI_DEV_GPU_UTIL") == []


def test_the_api_servers_name_wins_over_a_hostname_that_is_not_the_pod_name() -> None:
    # The trainer sets spec.hostname; the API server's answer names it, HOSTNAME cannot.
    gpu = sample(processes=(ProcessUtil(10, 30.0), ProcessUtil(20, 40.0)))
    held = [DeviceAssignment("GPU-0", TRAINER, "0"), DeviceAssignment("GPU-0", NOTEBOOK, "1")]
    owners = {10: PidOwner(UID_TRAINER, "trainer-host", pod=("ml", "train-0")),
              20: PidOwner(UID_NOTEBOOK, "nb-1")}  # not resolved: HOSTNAME still joins

    utils = {u.pod_uid: u.pod for u in collect(snapshot(gpu), NODE, held, owners).gpus[0].pod_utils}

    assert utils == {UID_TRAINER: TRAINER, UID_NOTEBOOK: NOTEBOOK}
    unresolved = {10: PidOwner(UID_TRAINER, "trainer-host")}
    alone = collect(snapshot(gpu), NODE, held, unresolved).gpus[0].pod_utils[0]
    assert (alone.pod_uid, alone.pod) == (UID_TRAINER, None)  # a series by UID, no name


def test_only_gpus_several_pods_or_replicas_share_are_split() -> None:
    held = [DeviceAssignment("GPU-0", TRAINER), DeviceAssignment("GPU-1", TRAINER, "0"),
            DeviceAssignment("GPU-2", TRAINER), DeviceAssignment("GPU-2", NOTEBOOK)]
    assert shared(held) == {"GPU-1", "GPU-2"}
