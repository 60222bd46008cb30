"""DRA GPUs joined into Nodes and Pods (core/dra.py), from upstream-shaped objects.

Shapes: ResourceSlice devices as NVIDIA/k8s-dra-driver-gpu `cmd/gpu-kubelet-plugin/deviceinfo.go`
publishes them (GpuInfo/MigDeviceInfo.GetDevice), resource.k8s.io/v1 ResourceClaim and
DeviceClass types (k8s.io/api `resource/v1/types.go`); the claims below are what the v1.36
scheduler and resourceclaim controller wrote in the sandbox (tests/e2e/test_dra.py): a template
claim controlled by its pod, and the scheduler's claim for a DRA-served extended resource,
annotated `resource.kubernetes.io/extended-resource-claim: "true"`.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gpusteward.core.attribution import Attribution
from gpusteward.core.dra import gfd_product
from gpusteward.core.drafleet import DraFleet
from gpusteward.core.drawire import (
    WireClaim,
    WireClass,
    WireSlice,
    slice_devices,
    to_claim,
    to_class,
)
from gpusteward.core.fleet import FleetStore
from gpusteward.core.health import pod_faults
from gpusteward.core.kubewire import WirePod, to_pod
from gpusteward.core.model import Node, Pod
from gpusteward.core.nodestate import NodeState
from gpusteward.core.policy import parse_policy
from gpusteward.core.scoring import Demand, filter_node
from gpusteward.core.sharing import node_physical_gpus
from gpusteward.extender.view import PlacementView

DRIVER = "gpu.nvidia.com"


def s(v: str) -> dict[str, str]:
    return {"string": v}


def gpu(index: int, product: str = "NVIDIA H100 80GB HBM3") -> dict[str, Any]:
    return {"name": f"gpu-{index}", "attributes": {
        "type": s("gpu"), "uuid": s(f"GPU-{index:08d}-0000-0000-0000-000000000000"),
        "productName": s(product), "brand": s("Nvidia"), "architecture": s("Hopper"),
        "cudaComputeCapability": {"version": "9.0.0"}, "driverVersion": {"version": "580.95.5"},
        "pcieBusID": s(f"0000:{index:02x}:00.0")},
        "capacity": {"memory": {"value": "81559Mi"}}}


def mig(parent: int, start: int, profile: str = "1g.10gb") -> dict[str, Any]:
    return {"name": f"gpu-{parent}-mig-19-{start}-1", "attributes": {
        "type": s("mig"), "uuid": s(f"MIG-{parent}-{start}"),
        "parentUUID": s(f"GPU-{parent:08d}-0000-0000-0000-000000000000"),
        "profile": s(profile), "productName": s("NVIDIA A100-SXM4-80GB")},
        "capacity": {"memory": {"value": "10Gi"}}}


def slice_of(node: str, devices: list[dict[str, Any]], driver: str = DRIVER) -> WireSlice:
    return msgspec.convert({
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}}, WireSlice)


def gpu_class(extended: str | None = None) -> WireClass:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": (
        "device.driver == 'gpu.nvidia.com' && "
        "device.attributes['gpu.nvidia.com'].type == 'gpu'")}}]}
    if extended:
        spec["extendedResourceName"] = extended
    return msgspec.convert({"metadata": {"name": "gpu.nvidia.com"}, "spec": spec}, WireClass)


def claim(name: str, pod_uid: str, count: int = 1, devices: list[tuple[str, str]] = (),
          extended: bool = False, cls: str = "gpu.nvidia.com") -> WireClaim:
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount",
                               "count": count}
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml",
                     "annotations": ({"resource.kubernetes.io/extended-resource-claim": "true"}
                                     if extended else {}),
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p",
                                          "uid": pod_uid, "controller": True,
                                          "blockOwnerDeletion": True}]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
    if devices:
        obj["status"] = {
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": pool, "device": dev}
                for pool, dev in devices]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": pod_uid}]}
    return msgspec.convert(obj, WireClaim)


@pytest.mark.parametrize(("nvml", "gfd"), [
    pytest.param("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", id="spaces-become-dashes"),
    pytest.param("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", id="dashes-stay"),
    pytest.param("Tesla T4", "Tesla-T4", id="tesla"),
    pytest.param("NVIDIA  L4 ", "NVIDIA-L4", id="runs-of-spaces"),
    pytest.param("NVIDIA RTX A6000 (rev 2)", "NVIDIA-RTX-A6000-rev-2", id="no-label-chars"),
])
def test_product_names_are_spelled_as_gfd_labels_them(nvml, gfd):
    assert gfd_product(nvml) == gfd


def test_slice_devices_decode_gpus_and_mig_devices_of_the_driver_only():
    devices = slice_devices(slice_of("n1", [gpu(0), mig(1, 0),
                                            {"name": "vfio-0", "attributes": {
                                                "type": s("vfio")}}]), DRIVER)
    assert [(d.name, d.uuid, d.product, d.profile, d.resource) for d in devices] == [
        ("gpu-0", "GPU-00000000-0000-0000-0000-000000000000", "NVIDIA-H100-80GB-HBM3", None,
         "nvidia.com/gpu"),
        ("gpu-1-mig-19-0-1", "MIG-1-0", "NVIDIA-A100-SXM4-80GB", "1g.10gb",
         "nvidia.com/mig-1g.10gb")]
    assert slice_devices(slice_of("n1", [gpu(0)], driver="other.example.com"), DRIVER) == ()


def test_claims_record_pods_requests_and_allocation():
    c = to_claim(claim("c", "uid-1", 2, [("n1", "gpu-0"), ("n1", "gpu-1")]), DRIVER)
    assert (c.key, c.pods, c.asked, c.devices, c.extended) == (
        "ml/c", ("uid-1",), (("gpu.nvidia.com", 2),),
        ((DRIVER, "n1", "gpu-0"), (DRIVER, "n1", "gpu-1")), False)
    assert to_class(gpu_class("nvidia.com/gpu"), DRIVER).gpu
    assert not to_class(gpu_class(), "other.example.com").gpu


def joined(driver: str = DRIVER) -> tuple[FleetStore, DraFleet]:
    store = FleetStore()
    dra = DraFleet(store, driver)
    dra.replace_classes([to_class(gpu_class("nvidia.com/gpu"), DRIVER)])
    dra.replace_slices({"dra-0": slice_devices(slice_of("dra-0", [gpu(i) for i in range(4)]),
                                               DRIVER)})
    dra.replace_all([Node("dra-0", None, 0), Node("dp-0", "NVIDIA-L4", 2,
                                                  resources={"nvidia.com/gpu": 2})], [])
    return store, dra


def test_a_dra_node_has_its_devices_and_their_product_a_device_plugin_node_is_unchanged():
    store, _ = joined()
    assert (store.nodes["dra-0"].gpus, store.nodes["dra-0"].product) == (
        4, "NVIDIA-H100-80GB-HBM3")
    assert store.nodes["dp-0"] == Node("dp-0", "NVIDIA-L4", 2, resources={"nvidia.com/gpu": 2})


def test_a_mixed_node_has_device_plugin_and_dra_gpus_and_mig_devices_priced_by_slices():
    store, dra = joined()
    dra.set_slice("dp-0-gpu.nvidia.com", slice_devices(slice_of("dp-0", [mig(0, 0)]), DRIVER))
    node = store.nodes["dp-0"]
    assert (node.gpus, dict(node.resources)) == (
        3, {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 1})
    assert node_physical_gpus(node) == pytest.approx(2 + 1 / 7)
    dra.set_slice("dp-0-gpu.nvidia.com", None)
    assert store.nodes["dp-0"].gpus == 2


def test_a_template_claim_pod_holds_what_its_claim_asks_then_what_was_allocated():
    store, dra = joined()
    dra.upsert_pod(Pod("ml", "p", "uid-1", 0, claims=("gpu",)))
    assert "uid-1" not in store.pods  # no claim yet: no GPUs known
    dra.set_claim("ml/c", to_claim(claim("c", "uid-1", 3), DRIVER))
    assert store.pods["uid-1"].gpus == 3  # pending: what the claim asks
    dra.set_claim("ml/c", to_claim(claim("c", "uid-1", 3, [("dra-0", f"gpu-{i}")
                                                            for i in range(3)]), DRIVER))
    assert [d.name for d in dra.devices_of("uid-1")] == ["gpu-0", "gpu-1", "gpu-2"]
    dra.set_claim("ml/c", None)
    assert "uid-1" not in store.pods


def test_a_claim_of_a_class_that_is_not_the_drivers_holds_no_gpus():
    store, dra = joined()
    dra.upsert_pod(Pod("ml", "p", "uid-1", 0, claims=("nic",)))
    dra.set_claim("ml/c", to_claim(claim("c", "uid-1", 2, cls="dranet.net"), DRIVER))
    assert "uid-1" not in store.pods


def test_an_extended_resource_served_by_a_device_class_counts_once():
    store, dra = joined()
    asked = Pod("ml", "p", "uid-1", 1, resources={"nvidia.com/gpu": 1})
    dra.upsert_pod(asked)
    assert store.pods["uid-1"].gpus == 1  # pending: its request
    dra.set_claim("ml/p-extended-resources-x", to_claim(
        claim("p-extended-resources-x", "uid-1", 1, [("dra-0", "gpu-2")], extended=True),
        DRIVER))
    assert (store.pods["uid-1"].gpus, dict(store.pods["uid-1"].resources)) == (
        1, {"nvidia.com/gpu": 1})
    assert [d.uuid for d in dra.devices_of("uid-1")] == [
        "GPU-00000002-0000-0000-0000-000000000000"]


def test_extended_requests_and_template_claims_add_up():
    store, dra = joined()
    dra.upsert_pod(Pod("ml", "p", "uid-1", 2, resources={"nvidia.com/gpu": 2}, claims=("x",)))
    dra.set_claim("ml/c", to_claim(claim("c", "uid-1", 1, [("dra-0", "gpu-0")]), DRIVER))
    assert store.pods["uid-1"].gpus == 3


def test_a_relist_replaces_the_picture_of_its_kind():
    store, dra = joined()
    dra.upsert_pod(Pod("ml", "p", "uid-1", 0, claims=("gpu",)))
    dra.replace_claims([to_claim(claim("c", "uid-1", 2), DRIVER)])
    assert store.pods["uid-1"].gpus == 2
    dra.replace_claims([])
    dra.replace_slices({})
    assert "uid-1" not in store.pods
    assert store.nodes["dra-0"].gpus == 0


def test_a_pod_names_its_claims_so_the_watcher_keeps_it_for_the_join():
    wire = msgspec.convert({"metadata": {"name": "p", "namespace": "ml", "uid": "u"}, "spec": {
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "two-gpus"}],
        "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}]}},
        WirePod)
    pod = to_pod(wire, ["nvidia.com/gpu"])
    assert (pod.gpus, pod.claims) == (0, ("gpu",))


def test_a_gpu_without_pod_labels_is_attributed_by_its_dra_uuid():
    holder = Pod("ml", "p", "uid-1", 1, node="dra-0")
    who = Attribution.of(["Hostname"], "auto", ["dra-0"], [holder],
                         by_uuid={"GPU-1": "ml/p", "GPU-9": "ml/gone"})
    assert who.pod({"Hostname": "dra-0", "gpu": "1", "UUID": "GPU-1"}) == "ml/p"
    # A pod label still wins; a UUID naming a pod that holds nothing there names nobody.
    assert who.pod({"Hostname": "dra-0", "UUID": "GPU-1", "exported_pod": "p",
                    "exported_namespace": "ml"}) == "ml/p"
    assert who.pod({"Hostname": "dra-0", "UUID": "GPU-9"}) is None
    assert who.pod({"Hostname": "dra-0", "UUID": "GPU-2"}) is None


def test_a_slice_event_updates_only_what_it_touches():
    store, dra = joined()
    dra.upsert_pod(Pod("ml", "p", "uid-1", 0, claims=("gpu",), node="dra-0"))
    dra.set_claim("ml/c", to_claim(claim("c", "uid-1", 1, [("dra-0", "gpu-3")]), DRIVER))
    dra.set_slice("dp-0-gpu.nvidia.com", slice_devices(slice_of("dp-0", [gpu(0)]), DRIVER))
    assert [d.name for d in dra.devices_of("uid-1")] == ["gpu-3"]
    # The driver republishes dra-0 without gpu-3 (lost): the claim's device is no longer known,
    # the pod still holds one GPU, the node has three.
    dra.set_slice("dra-0", slice_devices(
        slice_of("dra-0", [gpu(i) for i in range(3)]), DRIVER))
    assert (dra.devices_of("uid-1"), store.pods["uid-1"].gpus, store.nodes["dra-0"].gpus) == (
        [], 1, 3)


def test_the_extender_waits_for_a_pods_template_claims_then_asks_what_they_ask():
    store, dra = joined()
    view = PlacementView(parse_policy({}), store, dra=dra)
    wire = msgspec.convert({"metadata": {"name": "p", "namespace": "ml", "uid": "uid-1"},
                            "spec": {"resourceClaims": [{"name": "gpu",
                                                         "resourceClaimTemplateName": "t"}],
                                     "containers": [{"name": "main"}]}}, WirePod)
    dra.upsert_pod(to_pod(wire, ["nvidia.com/gpu"]))
    state = NodeState(store.nodes["dra-0"], None, 0, None, None)
    waiting = view.demand_of(wire)
    assert waiting.claims_unseen
    assert filter_node(state, waiting).reason == (
        "its ResourceClaims are not in gpusteward's watch yet")
    dra.set_claim("ml/p-gpu-x", to_claim(claim("p-gpu-x", "uid-1", 2), DRIVER))
    demand = view.demand_of(wire)
    assert (demand.claims_unseen, demand.gpus, demand.resources) == (
        False, 2, (("nvidia.com/gpu", 2),))
    assert filter_node(state, demand).ok


# --- device taints (KEP-5055): NVIDIA's DRA driver with its NVMLDeviceHealthCheck gate writes
# `gpu.nvidia.com/xid=<code>` with a timeAdded on the device, NoSchedule for a critical XID and
# None for an application's (NVIDIA/k8s-dra-driver-gpu tests/bats GPU health tests).
def tainted(index: int, value: str = "79", effect: str = "NoSchedule",
            key: str = "gpu.nvidia.com/xid") -> dict[str, Any]:
    return {**gpu(index), "taints": [{"key": key, "value": value, "effect": effect,
                                      "timeAdded": "2026-12-02T14:00:00Z"}]}


def tainted_fleet(devices: list[dict[str, Any]]) -> tuple[FleetStore, DraFleet]:
    store, dra = joined()
    dra.set_slice("dra-0-gpu.nvidia.com", slice_devices(slice_of("dra-0", devices), DRIVER))
    return store, dra


def test_a_withholding_device_taint_keeps_a_free_device_from_new_pods_until_a_claim_holds_it():
    store, dra = tainted_fleet([tainted(0), tainted(1, "43", "None"), gpu(2), gpu(3)])
    node = store.nodes["dra-0"]
    assert node.gpus == 4  # still the node's, and still allocatable as far as the API goes
    assert [(w.resource, str(w.taint)) for w in node.withheld] == [
        ("nvidia.com/gpu", "gpu.nvidia.com/xid=79:NoSchedule")]  # None only informs
    fit = filter_node(NodeState(node, None, 2, None, None), Demand(2, (), "batch"))
    assert not fit.ok
    assert fit.reason == ("pod needs 2 healthy free GPUs, node has 1 "
                          "(1 DRA devices tainted gpu.nvidia.com/xid=79:NoSchedule)")
    # A pod allocated the device before the taint holds it: it is allocated, not withheld.
    dra.upsert_pod(Pod("ml", "p", "uid-1", 0, node="dra-0", claims=("gpu",)))
    dra.set_claim("ml/c", to_claim(claim("c", "uid-1", 1, [("dra-0", "gpu-0")]), DRIVER))
    assert store.nodes["dra-0"].withheld == ()
    dra.set_claim("ml/c", None)
    assert len(store.nodes["dra-0"].withheld) == 1
    dra.replace_claims([to_claim(claim("c", "uid-1", 1, [("dra-0", "gpu-0")]), DRIVER)])
    assert store.nodes["dra-0"].withheld == ()


def test_a_listed_withholding_taint_makes_the_pods_on_that_device_faulty_and_no_other():
    store, dra = tainted_fleet([tainted(0), tainted(1, "13", "None"),
                                tainted(2, key="example.com/maintenance"), gpu(3)])
    for i, uid in enumerate(("on-xid", "on-app-xid", "on-maintenance", "healthy")):
        dra.upsert_pod(Pod("ml", uid, uid, 0, node="dra-0", claims=("gpu",)))
        dra.set_claim(f"ml/{uid}", to_claim(claim(uid, uid, 1, [("dra-0", f"gpu-{i}")]),
                                            DRIVER))
    health = parse_policy({}).health
    faults = dra.faults(health)
    assert {k: str(f) for k, f in faults.items()} == {
        "ml/on-xid": "device dra-0/gpu-0 tainted gpu.nvidia.com/xid=79:NoSchedule "
                     "(device-taint)"}
    # Another pipeline's key counts once the policy names it.
    named = parse_policy({"health": {"deviceTaints": ["example.com/maintenance"]}}).health
    assert set(dra.faults(named)) == {"ml/on-maintenance"}
    # The node's own object says nothing: only the pod on the tainted device is faulty.
    assert set(pod_faults(store.pods.values(), store.nodes, health, {}, faults)) == {
        "ml/on-xid"}
