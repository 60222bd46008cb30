"""gpusteward beside the real KEDA operator (github.com/kedacore/keda/v2 v2.18.0, built from its Go
module by ``gpusteward sandbox up --with keda``, its CRDs from the same module version).

A Deployment autoscaled by a ScaledObject: KEDA makes the HPA and controls it (kedacore/keda
controllers/keda/hpa.go), so scaling the Deployment down would be undone. An idle one is paused
through the ScaledObject's ``autoscaling.keda.sh/paused-replicas: "0"``; KEDA takes the pause (its
Paused condition; controllers/keda/scaledobject_controller.go) and the Deployment goes to zero, a
pending GPU pod is placed by the real kube-scheduler on the freed GPUs, and restore removes the
annotation, upon which KEDA autoscales the Deployment again from its minReplicaCount
(pkg/scaling/executor/scale_scaledobjects.go).

KEDA v2.18 scales the target to the paused count only in a second reconcile, which its HPA's
deletion triggers and which can read the ScaledObject before its own Paused condition is in its
cache (kedacore/keda issues 7446 and 7663): then nothing scales the target. gpusteward finishes
such a pause itself; the second test makes that state on purpose (the pause taken, then the
target scaled back up behind KEDA's back, which KEDA, paused, leaves alone).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from gpusteward.core.owners import KEDA_PAUSED_REPLICAS
from gpusteward.core.reclaim.model import RECLAIM_REASON, RECLAIMED_AT, REPLICAS_BEFORE
from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.kubehttp import KubeHTTPError, wait_for
from tests.e2e.kube import (
    BUSY_OR_PARTLY,
    Namespace,
    cycle_until,
    gone,
    gpu_pod,
    kept_unless_wholly_idle,
    placed_then_restored,
)
from tests.support.apiproxy import ApiProxy, writes_to
from tests.support.sandbox import fresh_namespace, started

NODE = "h100-1"  # 8 GPUs: two 4-GPU replicas fill it
STAMP = "2026-12-01T00:00:00Z"  # when the test's own pause says gpusteward paused it


@pytest.fixture(scope="module")
def keda_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from started(tmp_path_factory, "keda", with_controllers=("keda",))


@pytest.fixture
def keda_ns(keda_box: Sandbox) -> Iterator[Namespace]:
    yield from fresh_namespace(keda_box.api(), "keda", owners=(
        "/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects",))


def scaled_deployment(ns: Namespace, name: str, util: str,
                      paused_by_gpusteward: bool = False) -> tuple[str, str]:
    """A Deployment of two 4-GPU replicas and the ScaledObject that keeps it at two: a cron
    trigger (no external system to reach) with minReplicaCount = maxReplicaCount = 2; paused at
    zero from the start as gpusteward pauses one, when asked."""
    pod = gpu_pod("x", 4, util=util, node=NODE, labels={"app": name})
    ns.api.create(f"/apis/apps/v1/namespaces/{ns.name}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": pod["metadata"], "spec": pod["spec"]}}})
    ns.api.create(f"/apis/keda.sh/v1alpha1/namespaces/{ns.name}/scaledobjects", {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {
            "name": name, "annotations": {
                KEDA_PAUSED_REPLICAS: "0", RECLAIM_REASON: "idle",
                RECLAIMED_AT: STAMP} if paused_by_gpusteward else {}},
        "spec": {"scaleTargetRef": {"name": name}, "minReplicaCount": 2, "maxReplicaCount": 2,
                 "triggers": [{"type": "cron", "metadata": {
                     "timezone": "Etc/UTC", "start": "0 0 * * *", "end": "59 23 * * *",
                     "desiredReplicas": "2"}}]}})
    return (f"/apis/apps/v1/namespaces/{ns.name}/deployments/{name}",
            f"/apis/keda.sh/v1alpha1/namespaces/{ns.name}/scaledobjects/{name}")


def replicas(ns: Namespace, app: str) -> list[dict[str, Any]]:
    return [p for p in ns.pods() if (p["metadata"].get("labels") or {}).get("app") == app
            and p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]]


def keda_hpa(ns: Namespace, name: str) -> dict[str, Any] | None:
    try:
        return ns.api.get(f"/apis/autoscaling/v2/namespaces/{ns.name}/horizontalpodautoscalers/"
                          f"keda-hpa-{name}")
    except KubeHTTPError as e:
        if e.status == 404:
            return None
        raise


def paused(so: dict[str, Any]) -> bool:
    return any(c.get("type") == "Paused" and c.get("status") == "True"
               for c in so.get("status", {}).get("conditions") or ())


async def test_an_idle_keda_deployment_is_paused_at_zero_and_its_gpus_placed_again(
        keda_box, keda_ns, reclaimer):
    ns = keda_ns
    deployment, so = scaled_deployment(ns, "api", util="0")
    wait_for("two replicas running", lambda: len(replicas(ns, "api")) == 2, timeout=120)
    wait_for("KEDA's HPA, controlled by the ScaledObject", lambda: (
        hpa := keda_hpa(ns, "api")) is not None and hpa["metadata"]["ownerReferences"][0][
        "kind"] == "ScaledObject", timeout=60)
    ns.create_pod(gpu_pod("waiting", 4, util="80", node=NODE))  # the node is full: it waits
    rec = await reclaimer("enforce", box=keda_box)
    await cycle_until(rec, "ScaledObject paused", lambda: pause_asked(ns, so), timeout=150)
    annotations = ns.api.get(so)["metadata"]["annotations"]
    assert annotations[KEDA_PAUSED_REPLICAS] == "0" and annotations[RECLAIM_REASON] == "idle"
    # KEDA takes the pause and scales to zero, or takes it and stops (its race), and then
    # gpusteward finishes it: either way the Deployment reaches zero, never undone
    await cycle_until(rec, "KEDA paused, the Deployment at zero", lambda: paused(
        ns.api.get(so)) and ns.api.get(deployment)["spec"]["replicas"] == 0, timeout=120)
    assert REPLICAS_BEFORE not in (ns.api.get(deployment)["metadata"].get("annotations") or {})
    placed_then_restored(ns, keda_box.kubeconfig, "ScaledObject", "api",
                         lambda: len(replicas(ns, "api")), 2)


async def test_a_pause_keda_took_without_scaling_is_finished_by_gpusteward(
        keda_box, keda_ns, reclaimer):
    ns = keda_ns
    deployment, so = scaled_deployment(ns, "stuck", util="0", paused_by_gpusteward=True)
    wait_for("KEDA to take the pause", lambda: paused(ns.api.get(so)), timeout=90)
    # The stage: the pause taken, the target running, a pod waiting for its GPUs. KEDA
    # sometimes still finishes its own pause a moment later (a reconcile of the paused
    # ScaledObject whose target is not at the paused count re-runs its scaling: keda v2.18
    # controllers/keda/scaledobject_controller.go, reconcileScaledObject), so the Deployment
    # may reach zero before gpusteward acts; then the stage is set again, up to three times.
    rec = None
    for _ in range(3):
        ns.api.merge_patch(f"{deployment}/scale", {"spec": {"replicas": 2}})
        wait_for("two replicas running under the taken pause",
                 lambda: len(replicas(ns, "stuck")) == 2, timeout=120)
        ns.create_pod(gpu_pod("waiting", 4, util="80", node=NODE))
        rec = rec or await reclaimer("enforce", box=keda_box)
        await cycle_until(rec, "the Deployment scaled to zero",
                          lambda: ns.api.get(deployment)["spec"]["replicas"] == 0, timeout=150)
        if ns.api.get(so)["metadata"]["annotations"][RECLAIMED_AT] != STAMP:
            break
        ns.api.delete(ns.path("pods", "waiting"), {"gracePeriodSeconds": 0})
        wait_for("the waiting pod gone", lambda: gone(ns, "waiting"), timeout=60)
    # finished by gpusteward's stop through the ScaledObject (it stamped it again; KEDA, paused,
    # scales nothing), as the pause asked, not reclaimed as a Deployment of its own: restore
    # goes through the ScaledObject alone
    assert ns.api.get(so)["metadata"]["annotations"][RECLAIMED_AT] != STAMP
    assert REPLICAS_BEFORE not in (ns.api.get(deployment)["metadata"].get("annotations") or {})
    placed_then_restored(ns, keda_box.kubeconfig, "ScaledObject", "stuck",
                         lambda: len(replicas(ns, "stuck")), 2)


def pause_asked(ns: Namespace, so: str) -> bool:
    return KEDA_PAUSED_REPLICAS in (ns.api.get(so)["metadata"].get("annotations") or {})


@BUSY_OR_PARTLY
async def test_a_keda_deployment_not_wholly_idle_is_never_paused(keda_box, keda_ns, reclaimer,
                                                                 busy):
    ns = keda_ns
    _, so = scaled_deployment(ns, "d", util="80" if busy else "0")
    wait_for("two replicas running", lambda: len(replicas(ns, "d")) == 2, timeout=120)
    await kept_unless_wholly_idle(await reclaimer("enforce", box=keda_box), ns, busy,
                                  lambda: pause_asked(ns, so), lambda: replicas(ns, "d"))


async def test_the_pause_is_fenced_on_the_scaled_object_it_writes(keda_box, keda_ns, reclaimer,
                                                                  tmp_path):
    # The reclaimer's pause is held in a proxy in front of it while the ScaledObject is edited
    # (tests/e2e/test_fencing.py does the same for every other owner's stop): the pause was
    # derived from the object before the edit, and the API server refuses it.
    ns = keda_ns
    deployment, so = scaled_deployment(ns, "fenced", util="0")
    wait_for("two replicas running", lambda: len(replicas(ns, "fenced")) == 2, timeout=120)
    async with ApiProxy(keda_box.api_url).running() as p:
        rec = await reclaimer("enforce", box=keda_box,
                              kubeconfig=p.kubeconfig(keda_box.token, tmp_path / "proxied"))
        path = so.removeprefix("/apis")
        p.hold(writes_to(path, "PATCH"))
        acting = asyncio.create_task(cycle_until(rec, "the pause held", p.reached.is_set,
                                                 timeout=150))
        await asyncio.wait_for(p.reached.wait(), 150)
        ns.api.merge_patch(so, {"metadata": {"annotations": {"example.com/touched": "yes"}}})
        p.release()
        await asyncio.wait_for(acting, 60)
        assert p.written_after_release(path) == [409]
    assert KEDA_PAUSED_REPLICAS not in ns.api.get(so)["metadata"]["annotations"]
    assert ns.api.get(deployment)["spec"]["replicas"] == 2
    assert rec.metrics.fenced.labels("fenced")._value.get() == 1
