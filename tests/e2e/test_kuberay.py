"""gpusteward beside the real KubeRay operator (github.com/ray-project/kuberay/ray-operator,
built from its Go module by ``gpusteward sandbox up --with kuberay``, its CRDs from the same
module version): an idle RayCluster is suspended through spec.suspend, KubeRay deletes its pods
and reports RayClusterSuspended (kuberay apis/ray/v1/raycluster_types.go), a pending GPU pod is
then placed by the real kube-scheduler on the freed GPUs, and restore brings the cluster back.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from gpusteward.core.reclaim.model import IDLE_SINCE, RECLAIM_REASON
from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e.kube import Namespace, cycle_for, cycle_until, gpu_pod
from tests.support.sandbox import fresh_namespace, started

NODE = "h100-1"  # 8 GPUs: two 4-GPU Ray workers fill it


@pytest.fixture(scope="module")
def ray_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from started(tmp_path_factory, "kuberay", with_controllers=("kuberay",))


@pytest.fixture
def ray_ns(ray_box: Sandbox) -> Iterator[Namespace]:
    yield from fresh_namespace(ray_box.api(), "ray",
                               owners=("/apis/ray.io/v1/namespaces/{ns}/rayclusters",))


def ray_cluster(ns: Namespace, name: str, util: str) -> str:
    worker = gpu_pod("x", 4, util=util, node=NODE)
    ns.api.create(f"/apis/ray.io/v1/namespaces/{ns.name}/rayclusters", {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name},
        "spec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {
            "containers": [{"name": "ray-head", "image": "registry.invalid/ray:2"}]}}},
            "workerGroupSpecs": [{
                "groupName": "gpu", "replicas": 2, "minReplicas": 0, "maxReplicas": 2,
                "rayStartParams": {}, "template": {
                    "metadata": {"annotations": worker["metadata"]["annotations"]},
                    "spec": {"containers": [{**worker["spec"]["containers"][0],
                                             "name": "ray-worker"}],
                             "nodeSelector": worker["spec"]["nodeSelector"]}}}]}})
    return f"/apis/ray.io/v1/namespaces/{ns.name}/rayclusters/{name}"


def workers(ns: Namespace, phase: str = "Running") -> list[dict[str, Any]]:
    return [p for p in ns.pods() if (p["metadata"].get("labels") or {}).get(
        "ray.io/node-type") == "worker" and p["status"].get("phase") == phase
        and "deletionTimestamp" not in p["metadata"]]


def suspended(cluster: dict[str, Any]) -> bool:
    return any(c["type"] == "RayClusterSuspended" and c["status"] == "True"
               for c in cluster.get("status", {}).get("conditions") or ())


async def test_an_idle_ray_cluster_is_suspended_and_its_gpus_placed_again(
        ray_box, ray_ns, reclaimer):
    ns = ray_ns
    path = ray_cluster(ns, "rc", util="0")
    wait_for("KubeRay's two GPU workers running", lambda: len(workers(ns)) == 2, timeout=120)
    ns.create_pod(gpu_pod("waiting", 4, util="80", node=NODE))  # the node is full: it waits
    rec = await reclaimer("enforce", box=ray_box)
    await cycle_until(rec, "RayCluster suspended",
                      lambda: ns.api.get(path)["spec"].get("suspend") is True, timeout=150)
    assert ns.api.get(path)["metadata"]["annotations"][RECLAIM_REASON] == "idle"
    wait_for("KubeRay to report it suspended", lambda: suspended(ns.api.get(path)),
             timeout=120)
    assert not workers(ns)
    ns.running("waiting", timeout=120)  # the real scheduler placed it on the freed GPUs
    listed = subprocess.run([sys.executable, "-m", "gpusteward", "reclaimer", "restore",
                             "--list", f"--kubeconfig={ray_box.kubeconfig}"],
                            capture_output=True, text=True, timeout=60)
    assert re.search(rf"RayCluster\s+{ns.name}/rc\s+stopped\s", listed.stdout), listed.stdout
    ns.api.delete(ns.path("pods", "waiting"))
    out = subprocess.run([sys.executable, "-m", "gpusteward", "reclaimer", "restore",
                          f"{ns.name}/RayCluster/rc", f"--kubeconfig={ray_box.kubeconfig}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    wait_for("KubeRay to bring its workers back", lambda: len(workers(ns)) == 2, timeout=120)


async def test_a_busy_ray_cluster_is_left_running(ray_box, ray_ns, reclaimer):
    ns = ray_ns
    path = ray_cluster(ns, "busy", util="80")
    wait_for("its workers running", lambda: len(workers(ns)) == 2, timeout=120)
    rec = await reclaimer("enforce", box=ray_box)
    await cycle_for(rec, 30)  # twice the idle window: an idle cluster is suspended by then
    assert not ns.api.get(path)["spec"].get("suspend")
    assert all(IDLE_SINCE not in (p["metadata"].get("annotations") or {}) for p in workers(ns))
    assert len(workers(ns)) == 2
