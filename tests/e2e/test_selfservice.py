"""Self-service restore against the sandbox's real API server and Deployment and Job
controllers: ``gpusteward.io/restore: "true"`` on a workload the reclaimer stopped brings it
back at the next cycle, within the team's quota, else an Event says why (docs/operations.md).
Only what gpusteward's own stop record holds comes back: hand-written annotations never do.
"""

from __future__ import annotations

import time

from gpusteward.adapters.webhook import Webhooks
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.model import RECLAIM_REASON, REPLICAS_BEFORE, RESTORE, StopEntry
from gpusteward.reclaimer.actor import scaled_reason
from gpusteward.reclaimer.outbox import Outbox
from gpusteward.sandbox.kubehttp import wait_for
from gpusteward.sandbox.receiver import Receiver
from tests.e2e.kube import cycle_until, gpu_pod, stop_entries
from tests.e2e.test_faults import FORGED, suspended_job
from tests.e2e.test_reclaim import deployment, idle_job, job_pods, running_pods


def object_events(ns, kind: str, name: str) -> list[tuple[str, str]]:
    items = ns.api.get(f"/api/v1/namespaces/{ns.name}/events")["items"]
    return [(e["reason"], e.get("message", "")) for e in items
            if e["involvedObject"]["kind"] == kind and e["involvedObject"]["name"] == name]


def ask_back(ns, path: str) -> None:
    ns.api.merge_patch(path, {"metadata": {"annotations": {RESTORE: "true"}}})


async def nothing() -> None:
    pass


async def test_a_scaled_down_deployment_comes_back_when_its_owner_asks(ns, reclaimer,
                                                                       tmp_path):
    path = deployment(ns, "serve", 2, "a100-0")
    wait_for("2 replicas running", lambda: len(running_pods(ns, "serve")) == 2)
    receiver = Receiver()
    policy = parse_policy({"notifications": {"sinks": [
        {"name": "owners", "urlFile": str(receiver.url_file(tmp_path)), "events": ["restored"]}]}})
    rec = await reclaimer("enforce")
    rec.outbox = Outbox(policy.notifications, Webhooks(5.0), None, rec.metrics)
    await cycle_until(rec, "scaled to zero", lambda: ns.api.get(path)["spec"]["replicas"] == 0)
    wait_for("its pods to go away", lambda: not running_pods(ns, "serve"), timeout=60)
    ask_back(ns, path)
    await rec.cycle()  # the next cycle, whatever telemetry says
    restored = ns.api.get(path)
    assert restored["spec"]["replicas"] == 2
    left = restored["metadata"].get("annotations") or {}
    assert not {RESTORE, REPLICAS_BEFORE, RECLAIM_REASON} & set(left)
    [(_, message)] = [e for e in object_events(ns, "Deployment", "serve")
                      if e[0] == "GPURestored"]
    assert "scaled back to 2" in message and RESTORE in message
    assert rec.metrics.restores.labels(ns.name, "restored")._value.get() == 1
    await rec.outbox.round(nothing)
    [told] = receiver.bodies()
    assert (told["event"], told["workload"]) == ("restored", f"{ns.name}/Deployment/serve")
    assert "scaled back to 2" in told["message"]
    receiver.close()
    await rec.outbox.deliver.close()
    wait_for("replicas back", lambda: len(running_pods(ns, "serve")) == 2)
    assert stop_entries(ns) == []


async def test_forged_restore_requests_are_refused_and_change_nothing(ns, reclaimer):
    # The two forgeries, each asked for by its owner: a Deployment at zero with a count
    # and reason written by hand, and a Job a queue suspended, given gpusteward's reason.
    deploy = deployment(ns, "forged", 0, "a100-0")
    ns.api.merge_patch(deploy, {"metadata": {"annotations": FORGED}})
    job = suspended_job(ns, "queued", {RECLAIM_REASON: "idle"})
    for path in (deploy, job):
        ask_back(ns, path)
    rec = await reclaimer("enforce")
    await rec.cycle()
    assert ns.api.get(deploy)["spec"]["replicas"] == 0
    assert ns.api.get(job)["spec"]["suspend"] is True
    for kind, name in (("Deployment", "forged"), ("Job", "queued")):
        [message] = [m for r, m in object_events(ns, kind, name) if r == "GPURestoreRefused"]
        assert "is not in gpusteward's stop record" in message
    assert rec.metrics.restores.labels(ns.name, "refused")._value.get() == 2


async def test_a_suspended_job_resumes_when_its_owner_asks(ns, reclaimer):
    path = idle_job(ns, "train", "h100-1")
    rec = await reclaimer("enforce")
    await cycle_until(rec, "Job suspended", lambda: ns.api.get(path)["spec"].get("suspend"))
    wait_for("the Job's pods to go away", lambda: not job_pods(ns, "train"), timeout=60)
    ask_back(ns, path)
    await rec.cycle()
    assert ns.api.get(path)["spec"]["suspend"] is False
    assert [r for r, _ in object_events(ns, "Job", "train")].count("GPURestored") == 1
    wait_for("the Job's pod back", lambda: any(
        p["status"].get("phase") == "Running" for p in job_pods(ns, "train")), timeout=60)


async def test_a_restore_over_the_teams_quota_is_refused_with_an_event(ns, reclaimer):
    # vision's quota is 2 GPUs (sandbox policy); one is held, the stopped Deployment needs 2.
    vision = {"gpusteward.io/team": "vision"}
    ns.create_pod(gpu_pod("holder", 1, node="h100-0", util="90", labels=vision))
    ns.running("holder")
    path = deployment(ns, "big", 0, "h100-0")
    ns.api.merge_patch(path, {"metadata": {"annotations": {
        REPLICAS_BEFORE: "2", RECLAIM_REASON: scaled_reason("idle", 2)}},
        "spec": {"template": {"metadata": {"labels": vision}}}})
    ask_back(ns, path)
    rec = await reclaimer("enforce")
    await rec.cycle()
    after = ns.api.get(path)
    assert after["spec"]["replicas"] == 0
    assert RESTORE not in after["metadata"]["annotations"]  # answered once, not every cycle
    assert after["metadata"]["annotations"][REPLICAS_BEFORE] == "2"  # restorable later
    [(_, message)] = [e for e in object_events(ns, "Deployment", "big")
                      if e[0] == "GPURestoreRefused"]
    assert "team vision holds 1 of its 2 GPUs and Deployment big needs 2 more" in message
    await rec.cycle()
    assert len(object_events(ns, "Deployment", "big")) == 1


async def test_a_restore_that_loses_a_race_reads_again_and_still_restores(ns, reclaimer):
    # The Deployment controller writes status while pods go away, so the resourceVersion a
    # restore read is often stale by its patch (CI saw "HTTP 409 Conflict"). Here another
    # writer changes the object between the restore's read and its patch, every time once.
    path = deployment(ns, "racy", 0, "a100-0")
    ns.api.merge_patch(path, {"metadata": {"annotations": {
        REPLICAS_BEFORE: "1", RECLAIM_REASON: scaled_reason("idle", 1)}}})
    rec = await reclaimer("enforce")
    # as the reclaimer records its scale-down from 1 (not the race under test here)
    await rec.stops.record(StopEntry(ns.name, "apps", "Deployment", "deployments", "racy",
                                     ns.api.get(path)["metadata"]["uid"], "scale", 1, "idle",
                                     time.time()))
    restorer = rec.selfservice.restorer
    real_read, reads = restorer.apps.read_namespaced_deployment, []

    async def read_then_someone_writes(*args, **kwargs):
        obj = await real_read(*args, **kwargs)
        reads.append(obj.metadata.resource_version)
        if len(reads) == 1:
            ns.api.merge_patch(path, {"metadata": {"labels": {"touched": "yes"}}})
        return obj

    restorer.apps.read_namespaced_deployment = read_then_someone_writes
    done = await restorer.restore(ns.name, "Deployment", "racy")
    assert done == f"Deployment {ns.name}/racy scaled back to 1"
    assert len(reads) == 2 and reads[0] != reads[1]  # the first patch met a real 409
    after = ns.api.get(path)
    assert after["spec"]["replicas"] == 1
    assert after["metadata"]["labels"]["touched"] == "yes"  # the other write is kept
    assert REPLICAS_BEFORE not in after["metadata"]["annotations"]
