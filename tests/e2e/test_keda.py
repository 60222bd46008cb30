"""gpusteward beside the real KEDA operator (github.com/kedacore/keda/v2 v2.18.0, built from its Go
module by ``gpusteward sandbox up --with keda``, its CRDs from the same module version).

A Deployment autoscaled by a ScaledObject: KEDA makes the HPA and controls it (kedacore/keda
controllers/keda/hpa.go), so scaling the Deployment down would be undone. An idle one is paused
through the ScaledObject's ``autoscaling.keda.sh/paused-replicas: "0"``; KEDA takes the pause
(its Paused condition; controllers/keda/scaledobject_controller.go) and gpusteward never writes
the Deployment; restore removes the annotation and KEDA autoscales it again at its
minReplicaCount. Not asserted: that KEDA then scales the Deployment to zero. KEDA v2.18 does that
only in a second reconcile, which its HPA's deletion triggers and which can read its own status
before the Paused condition is in its cache, leaving the target at its replicas (kedacore/keda
issues 7446 and 7663); this test saw it both ways.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpusteward.core.reclaim.kinds import KEDA_PAUSED_REPLICAS
from gpusteward.core.reclaim.model import RECLAIM_REASON
from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.kubehttp import KubeHTTPError, wait_for
from tests.e2e.kube import (
    BUSY_OR_PARTLY,
    Namespace,
    cycle_until,
    gpu_pod,
    kept_unless_wholly_idle,
    restore,
)
from tests.support.sandbox import fresh_namespace, started

NODE = "h100-1"  # 8 GPUs: two 4-GPU replicas fill it


@pytest.fixture(scope="module")
def keda_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from started(tmp_path_factory, "keda", with_controllers=("keda",))


@pytest.fixture
def keda_ns(keda_box: Sandbox) -> Iterator[Namespace]:
    yield from fresh_namespace(keda_box.api(), "keda", owners=(
        "/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects",))


def scaled_deployment(ns: Namespace, name: str, util: str) -> tuple[str, str]:
    """A Deployment of two 4-GPU replicas and the ScaledObject that keeps it at two: a cron
    trigger (no external system to reach) with minReplicaCount = maxReplicaCount = 2."""
    pod = gpu_pod("x", 4, util=util, node=NODE, labels={"app": name})
    ns.api.create(f"/apis/apps/v1/namespaces/{ns.name}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": pod["metadata"], "spec": pod["spec"]}}})
    ns.api.create(f"/apis/keda.sh/v1alpha1/namespaces/{ns.name}/scaledobjects", {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name},
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


async def test_an_idle_keda_deployment_is_paused_through_its_scaled_object_and_restored(
        keda_box, keda_ns, reclaimer):
    ns = keda_ns
    deployment, so = scaled_deployment(ns, "api", util="0")
    wait_for("two replicas running", lambda: len(replicas(ns, "api")) == 2, timeout=120)
    wait_for("KEDA's HPA, controlled by the ScaledObject", lambda: (
        hpa := keda_hpa(ns, "api")) is not None and hpa["metadata"]["ownerReferences"][0][
        "kind"] == "ScaledObject", timeout=60)
    rec = await reclaimer("enforce", box=keda_box)
    await cycle_until(rec, "ScaledObject paused at zero", lambda: pause_asked(ns, so),
                      timeout=150)
    annotations = ns.api.get(so)["metadata"]["annotations"]
    assert annotations[KEDA_PAUSED_REPLICAS] == "0" and annotations[RECLAIM_REASON] == "idle"
    wait_for("KEDA to take the pause", lambda: paused(ns.api.get(so)), timeout=90)
    managers = {m["manager"] for m in ns.api.get(deployment)["metadata"]["managedFields"]}
    assert not any("gpusteward" in m for m in managers), managers  # KEDA's to scale, not ours
    out = restore(keda_box.kubeconfig, f"{ns.name}/ScaledObject/api")
    assert out.returncode == 0, out.stderr
    assert not pause_asked(ns, so)
    wait_for("KEDA to autoscale it again at its two replicas", lambda: not paused(
        ns.api.get(so)) and len(replicas(ns, "api")) == 2, timeout=120)


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
