"""GPUs freed for a waiting pod go to that pod (docs/policy.md, "queue"): the real kube-scheduler
with DefaultPreemption, the reclaimer's queue claim, and the pod's nomination, which the
scheduler's nominator honours whoever wrote it (pkg/scheduler/backend/queue/nominator.go,
UpdateNominatedPod; filtering counts nominated pods of equal or higher priority first) while it
lasts, and the extender, which keeps reserved GPUs from every other pod while the reservation
lasts.

The waiting pod has the idle pod's priority, so the scheduler cannot preempt for it
(DefaultPreemption takes only lower priorities); the queue claims the idle pod all the same
because its team (vision, quota 2 GPUs in sandbox/policy.yaml) borrows beyond its quota and the
waiting pod's (nlp, quota 8) is within its own.
"""

from __future__ import annotations

import json

from gpusteward.core.model import RESERVED, TEAM_LABEL
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e import kube
from tests.e2e.test_preemption import H100

PRIORITIES = {"gpu-low": 100, "gpu-mid": 5000}


def unschedulable(ns, name: str) -> bool:
    return any(c.get("reason") == "Unschedulable"
               for c in ns.pod(name)["status"].get("conditions") or [])


async def test_freed_gpus_go_to_the_pod_they_were_freed_for(sandbox, ns, reclaimer,
                                                             scheduler_with):
    scheduler_with(preemption=True, preempt_verb=True)
    kube.apply_priority_classes(sandbox.api(), PRIORITIES)
    vision, nlp = {TEAM_LABEL: "vision"}, {TEAM_LABEL: "nlp"}
    ns.create_pod(kube.gpu_pod("idle", 8, node="h100-0", util="0", priority_class="gpu-mid",
                          labels=vision))
    ns.create_pod(kube.gpu_pod("busy", 8, node="h100-1", util="90", priority_class="gpu-mid",
                          labels=vision))
    ns.running("idle")
    ns.running("busy")
    kube.wait_for_gpu_samples(sandbox.prometheus_url, ns.name, ["idle", "busy"])
    ns.create_pod(kube.gpu_pod("urgent", 8, cards=H100, priority_class="gpu-mid", labels=nlp))
    wait_for("the urgent pod to be unschedulable", lambda: unschedulable(ns, "urgent"),
             timeout=60)
    rec = await reclaimer("enforce")
    await kube.cycle_until(rec, "the idle pod reclaimed for the urgent one",
                      lambda: kube.gone(ns, "idle"), timeout=90)
    reserved = json.loads(kube.annotations(ns, "urgent")[RESERVED])
    assert reserved["node"] == "h100-0" and reserved["gpus"] == 8
    # nominated there; the nomination may be gone already (a failed attempt of the pod while
    # its victim terminates clears it: schedule_one.go clearNominatedNode), or it bound there
    urgent = ns.pod("urgent")
    assert urgent["status"].get("nominatedNodeName") in (None, "h100-0")
    assert urgent["spec"].get("nodeName") in (None, "h100-0")
    assert "GPUReserved" in kube.reasons(ns, "urgent")
    # A lower-priority pod that fits only there comes right after the eviction.
    wait_for("the idle pod to go", lambda: "idle" not in {
        p["metadata"]["name"] for p in ns.api.get(
            f"/api/v1/namespaces/{ns.name}/pods")["items"]}, timeout=60)
    ns.create_pod(kube.gpu_pod("late", 8, cards=H100, priority_class="gpu-low"))
    assert ns.node_of("urgent", timeout=90) == "h100-0"
    assert not ns.pod("late")["spec"].get("nodeName")
    # Bound: the next cycle releases the reservation.
    await kube.cycle_until(rec, "the reservation released",
                      lambda: RESERVED not in kube.annotations(ns, "urgent"), timeout=30)
    assert "GPUReservationReleased" in kube.reasons(ns, "urgent")


async def test_a_reservation_expires_and_its_nomination_is_cleared(sandbox, ns, reclaimer):
    """Its pod never binds (it asks for a card no node has); its reservation, made long ago
    (as by a replica that failed over since), is released and the nomination cleared."""
    ns.create_pod(kube.gpu_pod("waits", 1, cards="NVIDIA-NONE*"))
    wait_for("the pod to be unschedulable", lambda: unschedulable(ns, "waits"), timeout=60)
    rec = await reclaimer("enforce")
    until = "2000-01-01T00:00:00Z"  # a reservation made long ago (as a failed-over one)
    ns.api.merge_patch(ns.path("pods", "waits"), {"metadata": {"annotations": {
        RESERVED: json.dumps({"node": "h100-0", "gpus": 1, "priority": 0,
                              "until": until})}}})
    ns.api.merge_patch(ns.path("pods", "waits") + "/status",
                       {"status": {"nominatedNodeName": "h100-0"}})
    await kube.cycle_until(rec, "the reservation released",
                      lambda: RESERVED not in kube.annotations(ns, "waits"), timeout=30)
    assert not ns.pod("waits")["status"].get("nominatedNodeName")
    released = [m for r, m in kube.events(ns, "waits") if r == "GPUReservationReleased"]
    assert released and f"expired at {until}" in released[0]
