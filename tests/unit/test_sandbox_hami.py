"""The sandbox's stand-in for HAMi: its node register, a container's request, the device fit and
the Filter's answer, each as HAMi's source writes them (github:Project-HAMi/HAMi v2.10.0:
pkg/device/devices.go MarshalNodeDevices and EncodePodSingleDevice, pkg/device/nvidia/device.go
GenerateResourceRequests and Fit, pkg/device/common/common.go GenReason)."""

from __future__ import annotations

import json

import pytest

from gpusteward.core import hami
from gpusteward.core.hami import Ask as Request
from gpusteward.sandbox.fleet import HamiSpec, Pool, node_object
from gpusteward.sandbox.hami import NODE, NodeDevices, encode, requests, uuid
from gpusteward.sandbox.hamisched import choose

POOL = Pool(name="h100-hami", product="NVIDIA-H100-80GB-HBM3", gpus=2, memory_mi_b=81559,
            hami=HamiSpec(split=4))
NODE_OBJ = node_object(POOL, "h100-hami-0")


def pod(name: str = "p", **limits: str) -> dict:
    return {"metadata": {"name": name, "namespace": "ml", "annotations": {}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}},
                                    {"name": "sidecar"}]}}


def placed(name: str, allocated: str) -> dict:
    return {"metadata": {"name": name, "annotations": {NODE: "h100-hami-0",
                                                       hami.ALLOCATED: allocated}},
            "status": {"phase": "Running"}}


def test_the_node_is_registered_as_marshal_node_devices_writes_it():
    meta = NODE_OBJ["metadata"]
    raw = json.loads(meta["annotations"][hami.NODE_REGISTER])
    # Go's field order; index 0 omitted (omitempty), as numa 0 on both
    assert list(raw[0]) == ["id", "count", "devmem", "devcore", "type", "mode", "health"]
    assert raw[1]["index"] == 1 and raw[0]["type"] == "NVIDIA H100 80GB HBM3"
    assert NODE_OBJ["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert "nvidia.com/gpu.product" not in meta["labels"] and meta["labels"]["gpu"] == "on"
    assert [d.id for d in hami.node_devices(meta["annotations"][hami.NODE_REGISTER])] == [
        uuid("h100-hami-0", 0), uuid("h100-hami-0", 1)]


@pytest.mark.parametrize(
    ("limits", "wanted"),
    [
        pytest.param({"nvidia.com/gpu": "1"}, Request(1, 0, 100, 0), id="neither-whole-memory"),
        pytest.param({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4096",
                      "nvidia.com/gpucores": "30"}, Request(2, 4096, 101, 30), id="mem-and-cores"),
        pytest.param({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"},
                     Request(1, 0, 100, 0), id="percentage-clamped"),
    ],
)
def test_a_containers_request(limits, wanted):
    assert requests(pod(**limits)) == [wanted, Request(0, 0, 100, 0)]


def test_the_filter_writes_one_node_and_the_devices_as_hami_encodes_them():
    asking = pod(**{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192",
                    "nvidia.com/gpucores": "30"})
    node, devices = choose(asking, ["h100-hami-0"], {"h100-hami-0": NODE_OBJ}, [])
    assert node == "h100-hami-0"
    assert devices == f"{uuid('h100-hami-0', 0)},NVIDIA,8192,30:;;"  # one entry per container


def test_a_node_hami_did_not_register_fails_with_its_reason():
    bare = {"metadata": {"name": "h100-0", "annotations": {}}}
    assert choose(pod(**{"nvidia.com/gpu": "1"}), ["h100-0"], {"h100-0": bare}, []) == {
        "h100-0": "node unregistered"}


def test_full_cores_exclusivity_and_slots_are_honoured():
    gpu0, gpu1 = uuid("h100-hami-0", 0), uuid("h100-hami-0", 1)
    busy = [placed("a", f"{gpu0},NVIDIA,8192,80:;"), placed("b", f"{gpu1},NVIDIA,8192,10:;")]
    devices = NodeDevices.of(NODE_OBJ, busy)
    # 30 % fits only on GPU 1; a whole card (cores 100) on neither: both are in use
    assert devices.place([Request(1, 1024, 101, 30)], "spread") == [
        [hami.Slice(gpu1, "NVIDIA", 1024, 30)]]
    assert NodeDevices.of(NODE_OBJ, busy).place([Request(1, 1024, 101, 100)], "spread") is None
    reasons = choose(pod(**{"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}),
                     ["h100-hami-0"], {"h100-hami-0": NODE_OBJ}, busy)
    # Fit checks memory before cores: a whole-card ask (no gpumem) fails on memory first
    assert reasons == {"h100-hami-0": "2/2 CardInsufficientMemory"}
    full = [placed(f"s{i}", f"{gpu0},NVIDIA,1024,1:;") for i in range(4)]
    assert NodeDevices.of(NODE_OBJ, full).place([Request(2, 1024, 101, 1)], "spread") is None


def test_binpack_stacks_slices_where_spread_separates_them():
    gpu0 = uuid("h100-hami-0", 0)
    one = [placed("a", f"{gpu0},NVIDIA,8192,30:;")]
    ask = [Request(1, 1024, 101, 10)]
    [[packed]] = NodeDevices.of(NODE_OBJ, one).place(ask, "binpack")
    [[spread]] = NodeDevices.of(NODE_OBJ, one).place(ask, "spread")
    assert packed.uuid == gpu0 != spread.uuid


def test_encode_ends_every_device_and_every_container():
    s = hami.Slice("GPU-a", "NVIDIA", 500, 3)
    assert encode([[s, s], []]) == "GPU-a,NVIDIA,500,3:GPU-a,NVIDIA,500,3:;;"
