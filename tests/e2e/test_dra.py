"""GPUs allocated through Dynamic Resource Allocation, on the sandbox's real v1.36 control plane.

A DRA pool (``gpusteward.sandbox.dra``): kwok nodes with no GPU allocatable whose GPUs are
published as one ResourceSlice per node the way NVIDIA/k8s-dra-driver-gpu publishes them, plus
its DeviceClasses. No kubelet plugin runs: the scheduler's DynamicResources plugin allocates
from the slices alone, the resourceclaim controller makes claims from templates, and kwok runs
the pod. 1.36 needs no feature gate for this: DynamicResourceAllocation is GA, and
DRAExtendedResource (KEP-5004) and DRADeviceTaints are beta and on by default
(k8s.io/kubernetes v1.36 `pkg/features/kube_features.go`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import yaml

from gpusteward.core.reclaim.model import IDLE_SINCE, RECLAIM_AT
from gpusteward.core.times import stamp
from gpusteward.sandbox import dra
from gpusteward.sandbox.cluster import SANDBOX_POLICY, Sandbox
from gpusteward.sandbox.fleet import XID_GPUS_LABEL, XID_LABEL, Pool
from gpusteward.sandbox.kubehttp import wait_for
from gpusteward.sandbox.simulator import EXPORTER_DRA_LABEL
from tests.e2e import scenarios
from tests.e2e.kube import (
    Namespace,
    annotations,
    cycle_until,
    gone,
    gpu_pod,
    reasons,
    wait_for_gpu_samples,
)

# Cards no device-plugin pool of the sandbox has: a pod accepting them can only land here.
H200 = Pool(name="h200-dra", product="NVIDIA-H200", count=2, gpus=4, memory_mi_b=143771,
            dra=True)
L40S = Pool(name="l40s-dra", product="NVIDIA-L40S", count=1, gpus=4, memory_mi_b=46068,
            dra=True)
# The same card as the default fleet's device-plugin l4-0/1/2: a mixed L4 fleet.
L4 = Pool(name="l4-dra", product="NVIDIA-L4", count=1, gpus=4, memory_mi_b=23034, dra=True)
DRA_NODES = [*H200.node_names(), *L40S.node_names(), *L4.node_names()]
H200S = set(H200.node_names())


@pytest.fixture(scope="module")
def dra_pool(sandbox: Sandbox) -> Iterator[list[Pool]]:
    for pool in (H200, L40S, L4):
        sandbox.add_pool(pool)
    try:
        yield [H200, L40S, L4]
    finally:
        for pool in (H200, L40S, L4):
            sandbox.remove_pool(pool.name)
        if not (sandbox.cfg.managed_resources and sandbox.cfg.node_cache_capable):
            sandbox.restart_scheduler(managed_resources=True, node_cache_capable=True)


def claim_template(ns: Namespace, name: str, count: int,
                   device_class: str = dra.GPU_CLASS) -> None:
    """A ResourceClaimTemplate as the driver's quickstart writes one: `exactly` N of a class."""
    ns.api.create(f"{dra.RESOURCE_API}/namespaces/{ns.name}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": device_class, "allocationMode": "ExactCount",
            "count": count}}]}}}})


def claim_pod(name: str, template: str, **kw) -> dict:
    """``gpu_pod``'s metadata (cards, class, util) on a pod whose GPUs come from a claim."""
    pod = gpu_pod(name, 1, **kw)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return pod


def pod_claim(ns: Namespace, pod: str, extended: bool = False) -> dict:
    """The claim made for the pod (by the resourceclaim controller from its template, or
    ``extended``: by the scheduler for its extended resource), once allocated."""
    def allocated() -> dict | None:
        status = ns.pod(pod)["status"]
        names = ([status["extendedResourceClaimStatus"]["resourceClaimName"]]
                 if extended and "extendedResourceClaimStatus" in status else
                 [s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or ()])
        if not names:
            return None
        claim = ns.api.get(f"{dra.RESOURCE_API}/namespaces/{ns.name}/resourceclaims/"
                           f"{names[0]}")
        return claim if claim.get("status", {}).get("allocation") else None
    return wait_for(f"{pod}'s claim to be allocated", allocated, timeout=60)


def test_the_real_scheduler_allocates_a_template_claim_on_a_kwok_dra_node(sandbox, ns,
                                                                           dra_pool):
    claim_template(ns, "two-gpus", 2)
    ns.create_pod(claim_pod("trainer", "two-gpus", cards="NVIDIA-H200"))
    pod = ns.running("trainer")
    claim = pod_claim(ns, "trainer")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert pod["spec"]["nodeName"] in DRA_NODES
    assert len(results) == 2
    assert {(r["driver"], r["pool"]) for r in results} == {(dra.DRIVER, pod["spec"]["nodeName"])}
    assert all(r["device"].startswith("gpu-") for r in results)
    assert [(r["resource"], r["name"], r["uid"]) for r in claim["status"]["reservedFor"]] == [
        ("pods", "trainer", pod["metadata"]["uid"])]


@pytest.mark.parametrize("node_cache_capable", [True, False],
                         ids=["nodeCacheCapable", "full-node-objects"])
def test_pods_asking_nvidia_gpu_are_served_by_the_device_class_on_accepted_cards(
        sandbox, ns, dra_pool, scheduler_with, node_cache_capable):
    # Without the DRA join the extender saw no GPUs on these nodes and failed every one; with
    # full Node objects it still judges a node it watches by its watch, DRA devices and all.
    scheduler_with(node_cache_capable=node_cache_capable)
    for i in range(3):
        ns.create_pod(gpu_pod(f"h200-{i}", 1, cards="NVIDIA-H200"))
    ns.create_pod(gpu_pod("l40s", 1, cards="NVIDIA-L40S"))
    assert {ns.node_of(f"h200-{i}") for i in range(3)} <= H200S
    assert ns.node_of("l40s") == "l40s-dra-0"
    claim = pod_claim(ns, "l40s", extended=True)
    assert claim["metadata"]["annotations"][dra.EXTENDED_CLAIM_ANNOTATION] == "true"
    assert [r["pool"] for r in claim["status"]["allocation"]["devices"]["results"]] == [
        "l40s-dra-0"]


def test_claim_template_pods_land_on_the_cards_they_accept(sandbox, ns, dra_pool,
                                                           scheduler_with):
    # kube-scheduler sends a pod to an extender with managedResources only if it asks one of
    # them; a pod whose GPUs come from claims alone asks none, so here it sends every pod.
    scheduler_with(managed_resources=False)
    claim_template(ns, "one-gpu", 1)
    for i in range(3):
        ns.create_pod(claim_pod(f"l40s-{i}", "one-gpu", cards="NVIDIA-L40S"))
        ns.create_pod(claim_pod(f"h200-{i}", "one-gpu", cards="NVIDIA-H200"))
    assert {ns.node_of(f"l40s-{i}") for i in range(3)} == {"l40s-dra-0"}
    assert {ns.node_of(f"h200-{i}") for i in range(3)} <= H200S


def test_spread_class_prefers_the_cooler_dra_node(sandbox, ns, dra_pool):
    # Half of each node's GPUs loaded (as in the device-plugin scenario): a clear difference
    # in mean load, the same packing.
    for node, util in (("h200-dra-0", "95"), ("h200-dra-1", "5")):
        ns.create_pod(gpu_pod(f"load-{node}", 2, node=node, util=util))
    for node in H200S:
        ns.running(f"load-{node}")
    wait_for_gpu_samples(sandbox.prometheus_url, ns.name, [f"load-{n}" for n in sorted(H200S)])
    ns.create_pod(gpu_pod("serve", 1, cards="NVIDIA-H200", cls="inference"))
    assert ns.node_of("serve") == "h200-dra-1"


@pytest.mark.parametrize("coolest", ["l4-dra-0", "l4-1"])
def test_a_mixed_fleet_places_by_load_whichever_way_its_gpus_are_served(sandbox, ns, dra_pool,
                                                                        coolest):
    """Device-plugin L4s and a DRA L4 side by side rank as one fleet of L4s."""
    nodes = ["l4-0", "l4-1", "l4-2", "l4-dra-0"]
    for node in nodes:
        ns.create_pod(gpu_pod(f"load-{node}", 2, node=node, util="5" if node == coolest else "70"))
    for node in nodes:
        ns.running(f"load-{node}")
    wait_for_gpu_samples(sandbox.prometheus_url, ns.name, [f"load-{n}" for n in nodes])
    ns.create_pod(gpu_pod("serve", 1, cards="NVIDIA-L4", cls="inference"))
    assert ns.node_of("serve") == coolest


def test_a_node_with_a_lost_device_gets_no_pod_that_needs_it(sandbox, ns, dra_pool):
    api, path = sandbox.api(), "/api/v1/nodes/h200-dra-0"
    api.merge_patch(path, {"metadata": {"labels": {XID_LABEL: "79", XID_GPUS_LABEL: "0"}}})
    try:
        wait_for("the extender to see the XID",
                 lambda: not scenarios.filter_passes(sandbox, "h200-dra-0", gpus=4), timeout=60)
        ns.create_pod(gpu_pod("whole-node", 4, cards="NVIDIA-H200"))
        assert ns.node_of("whole-node") == "h200-dra-1"
    finally:
        api.merge_patch(path, {"metadata": {"labels": {XID_LABEL: None, XID_GPUS_LABEL: None}}})
        wait_for("h200-dra-0 healthy again",
                 lambda: scenarios.filter_passes(sandbox, "h200-dra-0", gpus=4), timeout=90)


async def test_an_idle_pod_served_by_the_device_class_is_warned_then_reclaimed(ns, reclaimer,
                                                                                dra_pool):
    await scenarios.an_idle_pod_is_warned_then_evicted(ns, await reclaimer("enforce"),
                                                       node="h200-dra-0")


async def test_a_busy_dra_pod_is_left_alone(ns, reclaimer, dra_pool):
    await scenarios.a_busy_pod_is_left_alone_and_its_marks_cleared(
        ns, await reclaimer("enforce"), node="h200-dra-1")


@pytest.fixture
def exporter_without_dra_mapping(sandbox, dra_pool) -> Iterator[str]:
    """l40s-dra-0's exporter labels its GPUs with their UUID alone, never with a DRA pod."""
    api, path = sandbox.api(), "/api/v1/nodes/l40s-dra-0"
    api.merge_patch(path, {"metadata": {"labels": {EXPORTER_DRA_LABEL: "off"}}})
    try:
        yield "l40s-dra-0"
    finally:
        api.merge_patch(path, {"metadata": {"labels": {EXPORTER_DRA_LABEL: None}}})


async def test_an_idle_claim_pod_is_judged_by_its_devices_uuids(ns, reclaimer,
                                                                  exporter_without_dra_mapping):
    claim_template(ns, "two-gpus", 2)
    ns.create_pod(claim_pod("idle", "two-gpus", node=exporter_without_dra_mapping, util="0"))
    ns.running("idle")
    rec = await reclaimer("enforce")
    await cycle_until(rec, "idle mark", lambda: IDLE_SINCE in annotations(ns, "idle"))
    await cycle_until(rec, "warning", lambda: RECLAIM_AT in annotations(ns, "idle"))
    await cycle_until(rec, "eviction", lambda: gone(ns, "idle"))
    assert {"GPUIdle", "GPUIdleWarning", "GPUReclaimed"} <= set(reasons(ns, "idle"))


def test_the_report_is_exact_for_a_known_dra_workload(sandbox, tmp_path,
                                                      exporter_without_dra_mapping):
    """Two GPUs busy through a template claim, one idle through the DeviceClass-served
    `nvidia.com/gpu`, one idle through a claim whose GPU's series carry only its UUID."""
    team = f"dra-report-{secrets.token_hex(3)}"
    policy = yaml.safe_load(SANDBOX_POLICY.read_text())
    policy["cardTiers"] = [
        {"name": "premium", "products": ["NVIDIA-H200"], "costPerGpuHour": scenarios.PREMIUM},
        {"name": "standard", "products": ["NVIDIA-A100*"]},
        {"name": "economy", "products": ["NVIDIA-L40S"], "costPerGpuHour": scenarios.ECONOMY}]
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    ns = Namespace(sandbox.api(), team)
    ns.create()
    try:
        labels = {"gpusteward.io/team": team}
        claim_template(ns, "one-gpu", 1)
        claim_template(ns, "two-gpus", 2)
        ns.create_pod(claim_pod("busy", "two-gpus", node="h200-dra-0", util="80",
                                labels=labels))
        ns.create_pod(gpu_pod("idle", 1, node="h200-dra-1", util="0", labels=labels))
        ns.create_pod(claim_pod("cheap", "one-gpu", node=exporter_without_dra_mapping,
                                util="0", labels=labels))
        for name in ("busy", "idle", "cheap"):
            ns.running(name)
        # "cheap"'s series name no pod: wait for the other two, then for its GPU's samples.
        wait_for_gpu_samples(sandbox.prometheus_url, team, ["busy", "idle"], settle=0)
        time.sleep(scenarios.WINDOW_S + 4)
        workload = scenarios.Workload(sandbox, ns, team, path)
        doc = workload.json("team")
        (mine,) = [g for g in doc["groups"] if g["name"] == team]
        assert {k: mine[k] for k in ("allocated", "used", "idle", "unknown", "active_ratio",
                                     "allocated_gpu_hours", "idle_gpu_hours",
                                     "idle_cost", "mean_util_percent")} == {
            "allocated": 4.0, "used": 2.0, "idle": 2.0, "unknown": 0.0, "active_ratio": 0.5,
            "allocated_gpu_hours": scenarios.hours(4), "idle_gpu_hours": scenarios.hours(2),
            "idle_cost": 0.7, "mean_util_percent": 40.0}
        idle = {p["pod"]: p for p in doc["top_idle_pods"] if p["namespace"] == team}
        assert {n: (p["card"], p["idle_cost"]) for n, p in idle.items()} == {
            "idle": ("NVIDIA-H200", 0.5), "cheap": ("NVIDIA-L40S", 0.2)}
        cards = {g["name"]: g for g in workload.json("card")["groups"]}
        assert (cards["NVIDIA-H200"]["allocatable"], cards["NVIDIA-L40S"]["allocatable"]) == (
            8.0, 4.0)
    finally:
        ns.delete()


@contextmanager
def devices_tainted(box: Sandbox, node: str, devices: set[str]) -> Iterator[None]:
    """The devices tainted in the node's slice as NVIDIA's DRA driver taints a GPU after XID 79
    (NVMLDeviceHealthCheck gate; NVIDIA/k8s-dra-driver-gpu tests/bats GPU health tests: one
    `gpu.nvidia.com/xid` taint per device, the code as value, a timeAdded)."""
    api = box.api()
    path = f"{dra.RESOURCE_API}/resourceslices/{dra.slice_name(node)}"
    clean = api.get(path)["spec"]["devices"]
    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule",
             "timeAdded": stamp(time.time())}
    api.merge_patch(path, {"spec": {"devices": [
        {**d, "taints": [taint]} if d["name"] in devices else d for d in clean]}})
    try:
        yield
    finally:
        api.merge_patch(path, {"spec": {"devices": clean}})


def allocated_device(ns: Namespace, pod: str) -> str:
    return pod_claim(ns, pod)["status"]["allocation"]["devices"]["results"][0]["device"]


async def test_a_device_tainted_no_schedule_is_never_offered_and_its_idle_pod_is_faulty(
        sandbox, ns, reclaimer, dra_pool):
    """l40s-dra-0 has 4 GPUs: "broken" and "beside" hold one each, both idle and past their
    deadline; the driver taints broken's GPU and one free GPU."""
    node = "l40s-dra-0"
    claim_template(ns, "one-gpu", 1)
    marks = {IDLE_SINCE: stamp(time.time() - 60), RECLAIM_AT: stamp(time.time() - 1)}
    for name in ("broken", "beside"):
        ns.create_pod(claim_pod(name, "one-gpu", node=node, util="0", annotations=marks))
        ns.running(name)
    held = {allocated_device(ns, n) for n in ("broken", "beside")}
    free = sorted({f"gpu-{i}" for i in range(L40S.gpus)} - held)
    assert scenarios.filter_passes(sandbox, node, gpus=2)
    with devices_tainted(sandbox, node, {allocated_device(ns, "broken"), free[0]}):
        wait_for("the extender to withhold the tainted free GPU",
                 lambda: not scenarios.filter_passes(sandbox, node, gpus=2), timeout=30)
        assert scenarios.filter_passes(sandbox, node, gpus=1)  # the untainted one
        await scenarios.the_faulty_pod_stays_and_its_idle_neighbour_goes(
            ns, await reclaimer("enforce"), "gpu.nvidia.com/xid=79:NoSchedule")
