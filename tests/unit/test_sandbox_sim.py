"""The sandbox's pure parts: utilization profiles, stable GPU indices, fleet files, and what the
GPU hosts tell the NVML agents."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpusteward.adapters.policyfile import load_policy
from gpusteward.core.dcgm import MigInstance, PodRef
from gpusteward.core.fleet import FleetStore
from gpusteward.core.kubewire import WireNode, to_node
from gpusteward.core.model import Node, Pod
from gpusteward.sandbox.fleet import (
    DEFAULT_FLEET,
    GPU_RESOURCES,
    XID_GPUS_LABEL,
    XID_LABEL,
    FleetError,
    load_fleet,
    node_objects,
)
from gpusteward.sandbox.gpuhosts import holders, nvml_gpu
from gpusteward.sandbox.podresources import Holder
from gpusteward.sandbox.scrape import simulator_path
from gpusteward.sandbox.simgpu import SimGpu
from gpusteward.sandbox.simulator import (
    VIRTUAL_GPUS_LABEL,
    ExporterXids,
    GpuAssigner,
    ProfileError,
    create_app,
    parse_profile,
    simulate,
    util_at,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("profile", "elapsed", "percent"),
    [
        pytest.param("85", 1e6, 85.0, id="constant"),
        pytest.param(None, 10, 0.0, id="no-annotation-is-idle"),
        pytest.param("90:5m,0:25m", 60, 90.0, id="first-step"),
        pytest.param("90:5m,0:25m", 400, 0.0, id="second-step"),
        pytest.param("90:5m,0:25m", 1800 + 10, 90.0, id="repeats"),
    ],
)
def test_utilization_profiles(profile, elapsed, percent):
    assert util_at(profile, elapsed) == percent


@pytest.mark.parametrize("bad", ["lots", "120", "50:soon", "50:0s"])
def test_bad_profiles_are_refused(bad):
    with pytest.raises(ProfileError):
        parse_profile(bad)


def pod(name: str, gpus: int, bound_at: float, **kw) -> Pod:
    return Pod(namespace="ml", name=name, uid=name, gpus=gpus, node="n", phase="Running",
               bound_at=bound_at, **kw)


def test_gpu_indices_are_stable_and_reused_after_a_pod_leaves():
    node = Node("n", "NVIDIA-L4", 4)
    assigner = GpuAssigner()
    first = assigner.assign(node, [pod("a", 2, 1.0), pod("b", 1, 2.0)])
    assert first == {"a": [0, 1], "b": [2]}
    again = assigner.assign(node, [pod("b", 1, 2.0), pod("c", 2, 3.0)])
    assert again == {"b": [2], "c": [0, 1]}


def test_simulated_gpus_carry_pod_labels_and_utilization():
    store = FleetStore()
    store.replace_all([Node("n", "NVIDIA-L4", 2, labels={"nvidia.com/gpu.memory": "23034"})],
                      [pod("a", 1, 0.0, annotations={"sandbox.gpusteward.io/gpu-util": "70"})])
    gpus = simulate(store, GpuAssigner(), now=100.0)
    assert [(g.index, g.util_percent, g.pod and g.pod.name) for g in gpus] == [
        (0, 70.0, "a"), (1, 0.0, None)]
    assert gpus[0].model_name == "NVIDIA L4"


def test_a_time_sliced_gpu_is_one_device_or_per_pod_copies():
    # GFD's time-slicing labels: nvidia.com/gpu.replicas, product -SHARED; allocatable GPUs x R.
    labels = {"nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.count": "1"}
    util = "sandbox.gpusteward.io/gpu-util"
    pods = [pod("busy", 1, 1.0, annotations={util: "80"}),
            pod("idle", 1, 2.0, annotations={util: "0"})]
    for virtual, expected in ((False, ()), (True, (("busy", "0", 80.0), ("idle", "1", 0.0)))):
        store = FleetStore()
        node_labels = {**labels, VIRTUAL_GPUS_LABEL: "true"} if virtual else labels
        store.replace_all([Node("n", "Tesla-T4-SHARED", 2, labels=node_labels)], pods)
        (gpu,) = simulate(store, GpuAssigner(), now=100.0)
        assert (gpu.index, gpu.util_percent, gpu.pod and gpu.pod.name) == (0, 80.0, "busy")
        assert tuple((s.pod.name, s.vgpu, s.util_percent) for s in gpu.shares) == expected


async def test_the_simulator_serves_each_nodes_exporter_on_its_own_path():
    store = FleetStore()
    store.replace_all([Node("a", "NVIDIA-L4", 1), Node("b", "NVIDIA-L4", 2)], [])
    async with TestClient(TestServer(create_app(store))) as client:
        for node, gpus in (("a", 1), ("b", 2)):
            text = await (await client.get(simulator_path(node))).text()
            util = [x for x in text.splitlines() if x.startswith("DCGM_FI_DEV_GPU_UTIL{")]
            assert len(util) == gpus and all(f'Hostname="{node}"' in x for x in util)
        everything = await (await client.get("/metrics")).text()
    assert everything.count("DCGM_FI_DEV_GPU_UTIL{") == 3


def test_the_default_fleet_is_mixed():
    nodes = node_objects(DEFAULT_FLEET)
    products = {n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in nodes}
    assert products == {"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4",
                        "Tesla-T4-SHARED"}
    assert nodes[0]["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_the_default_fleet_has_a_time_sliced_and_a_mig_mixed_pool():
    """GFD's labels for both (k8s-device-plugin internal/lm/resource_test.go: `-SHARED` and
    replicas; mig-strategy.go: mixed strategy keeps the parent's product, per-profile labels)."""
    by_name = {n["metadata"]["name"]: n for n in node_objects(DEFAULT_FLEET)}
    t4, mig = by_name["t4-0"], by_name["a100-mig-0"]
    assert t4["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert {k: t4["metadata"]["labels"][k] for k in ("nvidia.com/gpu.count",
                                                      "nvidia.com/gpu.replicas")} == \
        {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4"}
    labels = mig["metadata"]["labels"]
    assert mig["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "14"
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/mig.strategy"],
            labels["nvidia.com/mig-1g.10gb.product"]) == (
        "NVIDIA-A100-SXM4-80GB", "mixed", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb")


def test_the_sandbox_policy_counts_every_resource_the_fleet_offers():
    offered = {r for n in node_objects(DEFAULT_FLEET) for r in n["status"]["allocatable"]
               if r.startswith("nvidia.com/")}
    assert offered <= set(load_policy(ROOT / "sandbox" / "policy.yaml").resources)
    assert set(GPU_RESOURCES) == set(load_policy(ROOT / "sandbox" / "policy.yaml").resources)


def fleet_store(pool_name: str, pods: list[Pod]) -> FleetStore:
    (obj,) = [n for n in node_objects(DEFAULT_FLEET) if n["metadata"]["name"] == pool_name]
    store = FleetStore()
    store.replace_all([to_node(msgspec.convert(obj, WireNode), GPU_RESOURCES)], pods)
    return store


def test_a_time_sliced_gpu_is_one_series_shared_by_its_pods():
    """dcgm-exporter maps replica ids `<uuid>::<n>` to the GPU (internal/pkg/transformation/
    kubernetes.go): one series per physical GPU, whatever the number of pods on it."""
    pods = [msgspec.structs.replace(pod(f"r{i}", 1, float(i), annotations={
        "sandbox.gpusteward.io/gpu-util": "30"}), node="t4-0") for i in range(5)]
    gpus = simulate(fleet_store("t4-0", pods), GpuAssigner(), now=100.0)
    assert [(g.index, g.util_percent, g.pod and g.pod.name) for g in gpus] == [
        (0, 100.0, "r0"), (1, 30.0, "r4")]


def test_a_mig_node_reports_each_instance_and_a_lost_gpu_only_where_labelled():
    busy = msgspec.structs.replace(pod("m", 1, 0.0, annotations={
        "sandbox.gpusteward.io/gpu-util": "80"}), node="a100-mig-0")
    store = fleet_store("a100-mig-0", [busy])
    gpus = simulate(store, GpuAssigner(), now=100.0)
    assert len(gpus) == 14 and {g.index for g in gpus} == {0, 1}
    assert (gpus[0].mig, gpus[0].util_percent, gpus[0].pod and gpus[0].pod.name) == (
        MigInstance(1, "1g.10gb"), 80.0, "m")
    assert gpus[7].mig == MigInstance(1, "1g.10gb") and gpus[7].index == 1
    node = store.nodes["a100-mig-0"]
    lost = msgspec.structs.replace(node, labels={**node.labels, XID_LABEL: "79",
                                                 XID_GPUS_LABEL: "1"})
    store.upsert_node(lost)
    assert [g.xid for g in simulate(store, GpuAssigner(), now=100.0)] == [0] * 7 + [79] * 7


def test_fleet_files_are_validated_with_paths(tmp_path):
    good = tmp_path / "fleet.yaml"
    good.write_text("pools:\n- {name: h100, product: NVIDIA-H100-80GB-HBM3, count: 3, gpus: 8,"
                    " taints: [{key: gpu, effect: NoSchedule}]}\n")
    fleet = load_fleet(good)
    assert [n["metadata"]["name"] for n in node_objects(fleet)] == ["h100-0", "h100-1", "h100-2"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n- {name: H100, product: x, count: -1}\n")
    with pytest.raises(FleetError, match=r"pools\[0\]\.name.*\n.*pools\[0\]\.count"):
        load_fleet(bad)


def test_gpu_hosts_describe_the_simulators_gpus_to_nvml_and_the_kubelet():
    pod = PodRef("ml", "train", "main")
    gpus = [SimGpu("h100-0", i, "NVIDIA H100 80GB HBM3", util_percent=62.0, memory_mib=81559,
                   fb_used_mib=48935, temp_c=71, power_w=442.0, pod=pod if i < 2 else None)
            for i in range(3)]
    nvml = nvml_gpu(gpus[1])
    assert (nvml.uuid, nvml.name, nvml.pci_bus_id) == (gpus[1].uuid, gpus[1].model_name,
                                                       gpus[1].pci_bus_id)
    assert (nvml.util_gpu, nvml.temperature, nvml.power_mw) == (62, 71, 442_000)
    assert (nvml.memory_total, nvml.memory_used) == (81559 << 20, 48935 << 20)
    assert nvml.errors == {}
    assert holders(gpus) == [Holder("ml", "train", "main", (gpus[0].uuid, gpus[1].uuid))]


@pytest.mark.parametrize(("xid", "errors", "event"), [
    pytest.param(79, {"*": "GPU_IS_LOST"}, (0, 0), id="fell-off-the-bus-is-lost"),
    pytest.param(48, {}, (48, 7), id="other-xids-are-events"),
    pytest.param(0, {}, (0, 0), id="none"),
])
def test_xids_reach_nvml_as_a_lost_gpu_or_as_events(xid, errors, event):
    nvml = nvml_gpu(SimGpu("n", 0, "NVIDIA L4", xid=xid), xid_seq=7)
    assert nvml.errors == errors and (nvml.xid, nvml.xid_seq) == event


def test_exported_xids_stick_in_the_gauge_and_leave_the_count_after_its_window():
    xids = ExporterXids(window=10)

    def shown(xid: int, at: float) -> tuple[int, int]:
        (gpu,) = xids.apply([SimGpu("n", 0, "NVIDIA L4", xid=xid)], at)
        return gpu.xid, gpu.xid_count

    assert shown(0, 100) == (0, 0)
    assert shown(79, 101) == (79, 1)
    assert shown(0, 111) == (79, 1)  # the label went, the count lasts its window
    assert shown(0, 112) == (79, 0)  # the gauge keeps the last XID, as dcgm-exporter's does
    assert shown(48, 200) == (48, 1)


def test_the_xid_counter_counts_each_xid_a_gpu_starts_raising():
    # DCGM_EXP_XID_ERRORS_TOTAL: cumulative since the exporter started, per GPU and code; a
    # fault held across scrapes is one event (dcgm-exporter README, "Cumulative XID and clock
    # event counters").
    xids = ExporterXids(window=10)

    def total(xid: int, at: float) -> tuple[int, int]:
        (gpu,) = xids.apply([SimGpu("n", 0, "NVIDIA L4", xid=xid)], at)
        return gpu.xid, gpu.xid_total

    assert total(0, 100) == (0, 0)  # no series before the first XID
    assert total(79, 101) == (79, 1)
    assert total(79, 102) == (79, 1)  # still raising it: the same event
    assert total(0, 103) == (79, 1)
    assert total(79, 104) == (79, 2)
    assert total(48, 105) == (48, 1)  # another code, another series
