"""gpusteward beside the real KubeRay operator (github.com/ray-project/kuberay/ray-operator,
built from its Go module by ``gpusteward sandbox up --with kuberay``, its CRDs from the same
module version): an idle RayCluster is suspended through spec.suspend, KubeRay deletes its pods
and reports RayClusterSuspended (kuberay apis/ray/v1/raycluster_types.go), a pending GPU pod is
then placed by the real kube-scheduler on the freed GPUs, and restore brings the cluster back.
The same for a RayJob (pod -> RayCluster -> RayJob: KubeRay deletes its cluster and reports
jobDeploymentStatus Suspended); a RayJob KubeRay would fail if suspended, and a RayService, which
has no switch, are blocked and keep running.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpusteward.core.reclaim.model import RECLAIM_BLOCKED, RECLAIM_REASON
from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e.kube import (
    BUSY_OR_PARTLY,
    Namespace,
    annotations,
    cycle_for,
    cycle_until,
    gpu_pod,
    kept_unless_wholly_idle,
    placed_then_restored,
    reasons,
    spec_suspend,
)
from tests.support.sandbox import fresh_namespace, started

NODE = "h100-1"  # 8 GPUs: two 4-GPU Ray workers fill it


@pytest.fixture(scope="module")
def ray_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from started(tmp_path_factory, "kuberay", with_controllers=("kuberay",))


@pytest.fixture
def ray_ns(ray_box: Sandbox) -> Iterator[Namespace]:
    yield from fresh_namespace(ray_box.api(), "ray", owners=tuple(
        f"/apis/ray.io/v1/namespaces/{{ns}}/{plural}"
        for plural in ("rayjobs", "rayservices", "rayclusters")))


def cluster_spec(util: str, node: str = NODE) -> dict[str, Any]:
    """A head without GPUs and two 4-GPU workers on node (RayClusterSpec, also a RayJob's
    rayClusterSpec and a RayService's rayClusterConfig)."""
    worker = gpu_pod("x", 4, util=util, node=node)
    return {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {
        "containers": [{"name": "ray-head", "image": "registry.invalid/ray:2"}]}}},
        "workerGroupSpecs": [{
            "groupName": "gpu", "replicas": 2, "minReplicas": 0, "maxReplicas": 2,
            "rayStartParams": {}, "template": {
                "metadata": {"annotations": worker["metadata"]["annotations"]},
                "spec": {"containers": [{**worker["spec"]["containers"][0],
                                         "name": "ray-worker"}],
                         "nodeSelector": worker["spec"]["nodeSelector"]}}}]}


def ray_object(ns: Namespace, plural: str, kind: str, name: str, spec: dict[str, Any]) -> str:
    ns.api.create(f"/apis/ray.io/v1/namespaces/{ns.name}/{plural}", {
        "apiVersion": "ray.io/v1", "kind": kind, "metadata": {"name": name}, "spec": spec})
    return f"/apis/ray.io/v1/namespaces/{ns.name}/{plural}/{name}"


def ray_cluster(ns: Namespace, name: str, util: str) -> str:
    return ray_object(ns, "rayclusters", "RayCluster", name, cluster_spec(util))


def ray_job(ns: Namespace, name: str, util: str, shutdown: bool) -> str:
    """A RayJob in KubeRay's default K8sJobMode: KubeRay creates its RayCluster (controlled by
    the RayJob), waits for it to be ready, then runs the submitter Job."""
    return ray_object(ns, "rayjobs", "RayJob", name, {
        "entrypoint": "python train.py", "shutdownAfterJobFinishes": shutdown,
        "rayClusterSpec": cluster_spec(util)})


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
    placed_then_restored(ns, ray_box.kubeconfig, "RayCluster", "rc",
                         lambda: len(workers(ns)), 2)


@BUSY_OR_PARTLY
async def test_a_cluster_not_wholly_idle_is_never_suspended(ray_box, ray_ns, reclaimer, busy):
    ns = ray_ns
    path = ray_cluster(ns, "c", util="80" if busy else "0")
    wait_for("its GPU pods running", lambda: len(workers(ns)) == 2, timeout=120)
    await kept_unless_wholly_idle(await reclaimer("enforce", box=ray_box), ns, busy,
                                  lambda: spec_suspend(ns, path), lambda: workers(ns))


def job_status(ns: Namespace, path: str) -> str:
    return ns.api.get(path).get("status", {}).get("jobDeploymentStatus", "")


async def test_an_idle_ray_job_is_suspended_at_the_top_and_its_gpus_placed_again(
        ray_box, ray_ns, reclaimer):
    ns = ray_ns
    path = ray_job(ns, "rj", util="0", shutdown=True)
    wait_for("KubeRay's RayJob cluster with two GPU workers", lambda: len(workers(ns)) == 2,
             timeout=120)
    wait_for("the RayJob to run", lambda: job_status(ns, path) == "Running", timeout=120)
    ns.create_pod(gpu_pod("waiting", 4, util="80", node=NODE))
    rec = await reclaimer("enforce", box=ray_box)
    await cycle_until(rec, "RayJob suspended",
                      lambda: ns.api.get(path)["spec"].get("suspend") is True, timeout=150)
    assert ns.api.get(path)["metadata"]["annotations"][RECLAIM_REASON] == "idle"
    wait_for("KubeRay to report it suspended", lambda: job_status(ns, path) == "Suspended",
             timeout=120)
    # KubeRay deleted the cluster it made; gpusteward never wrote to that cluster
    assert not ns.api.get(f"/apis/ray.io/v1/namespaces/{ns.name}/rayclusters")["items"]
    placed_then_restored(ns, ray_box.kubeconfig, "RayJob", "rj", lambda: len(workers(ns)), 2)
    assert job_status(ns, path) in ("Initializing", "Running")  # started again


async def test_a_ray_job_kuberay_would_fail_and_a_ray_service_are_blocked_not_stopped(
        ray_box, ray_ns, reclaimer):
    ns = ray_ns
    job = ray_job(ns, "keeps-cluster", util="0", shutdown=False)
    wait_for("the RayJob to run", lambda: job_status(ns, job) == "Running", timeout=120)
    service = ray_object(ns, "rayservices", "RayService", "serve",
                         {"rayClusterConfig": cluster_spec("0", node="h100-0")})
    wait_for("both owners' four GPU workers", lambda: len(workers(ns)) == 4, timeout=120)
    rec = await reclaimer("enforce", box=ray_box)
    pods = [p["metadata"]["name"] for p in workers(ns)]
    await cycle_until(rec, "every worker blocked", lambda: all(
        RECLAIM_BLOCKED in annotations(ns, p) for p in pods), timeout=150)
    why = {annotations(ns, p)[RECLAIM_BLOCKED] for p in pods}
    assert why == {"RayJob has shutdownAfterJobFinishes false, and KubeRay fails such a RayJob "
                   "when it is suspended", "RayService has no spec.suspend (kuberay v1.5.0)"}
    await cycle_for(rec, 5)
    assert job_status(ns, job) == "Running"  # not ValidationFailed
    assert not ns.api.get(job)["spec"].get("suspend")
    assert "suspend" not in ns.api.get(service)["spec"]
    assert len(workers(ns)) == 4
    assert all(reasons(ns, p).count("GPUReclaimBlocked") == 1 for p in pods)
