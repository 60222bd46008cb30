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

from collections.abc import Iterator

import pytest

from gpusteward.sandbox import dra
from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.fleet import Pool
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e.kube import Namespace

DRA_POOL = Pool(name="h100-dra", product="NVIDIA-H100-80GB-HBM3", count=2, gpus=4, dra=True)
DRA_NODES = DRA_POOL.node_names()


@pytest.fixture(scope="module")
def dra_pool(sandbox: Sandbox) -> Iterator[Pool]:
    sandbox.add_pool(DRA_POOL)
    try:
        yield DRA_POOL
    finally:
        sandbox.remove_pool(DRA_POOL.name)


def claim_template(ns: Namespace, name: str, count: int,
                   device_class: str = dra.GPU_CLASS) -> None:
    """A ResourceClaimTemplate as the driver's quickstart writes one: `exactly` N of a class."""
    ns.api.create(f"{dra.RESOURCE_API}/namespaces/{ns.name}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": device_class, "allocationMode": "ExactCount",
            "count": count}}]}}}})


def claim_pod(name: str, template: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        "containers": [{"name": "main", "image": "registry.invalid/cuda-job:1",
                        "resources": {"claims": [{"name": "gpu"}]}}],
        "terminationGracePeriodSeconds": 1}}


def pod_claim(ns: Namespace, pod: str) -> dict:
    """The claim the resourceclaim controller made for the pod, once allocated."""
    def allocated() -> dict | None:
        statuses = ns.pod(pod)["status"].get("resourceClaimStatuses") or []
        if not statuses:
            return None
        claim = ns.api.get(f"{dra.RESOURCE_API}/namespaces/{ns.name}/resourceclaims/"
                           f"{statuses[0]['resourceClaimName']}")
        return claim if claim.get("status", {}).get("allocation") else None
    return wait_for(f"{pod}'s claim to be allocated", allocated, timeout=60)


def test_the_real_scheduler_allocates_a_template_claim_on_a_kwok_dra_node(sandbox, ns,
                                                                           dra_pool):
    claim_template(ns, "two-gpus", 2)
    ns.create_pod(claim_pod("trainer", "two-gpus"))
    pod = ns.running("trainer")
    claim = pod_claim(ns, "trainer")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert pod["spec"]["nodeName"] in DRA_NODES
    assert len(results) == 2
    assert {(r["driver"], r["pool"]) for r in results} == {(dra.DRIVER, pod["spec"]["nodeName"])}
    assert all(r["device"].startswith("gpu-") for r in results)
    assert [(r["resource"], r["name"], r["uid"]) for r in claim["status"]["reservedFor"]] == [
        ("pods", "trainer", pod["metadata"]["uid"])]
