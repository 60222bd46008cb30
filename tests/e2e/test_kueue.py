"""gpusteward beside the real Kueue (sigs.k8s.io/kueue, built from its Go module by
``gpusteward sandbox up --with kueue``, its CRDs from the same module version): an idle admitted
Workload is deactivated, Kueue evicts it and releases its quota, and a waiting higher-priority
Workload is admitted and runs on the freed GPU; restored, Kueue admits it again and resumes its
Job. gpusteward never writes the Job's suspend: Kueue owns that field (kueue site docs, "Run a
Kubernetes Job": Kueue suspends and resumes it). A busy Workload, and one with a pod still busy,
are never deactivated. Under ``reclaim.kueue.action: demote`` an idle Workload borrowing from
its cohort is demoted through Kueue's priority-boost annotation (KEP-7990; the sandbox's Kueue
runs with its PriorityBoost gate), Kueue itself preempts it for a Workload it would not have
preempted it for before, and readmitted it gets its priority back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from gpusteward.adapters.policyfile import load_policy
from gpusteward.core.owners import KUEUE_JOB_UID, KUEUE_PRIORITY_BOOST, KUEUE_QUEUE
from gpusteward.core.reclaim.model import RECLAIM_REASON, RECLAIMED_AT
from gpusteward.core.typedconfig import Duration
from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.kubehttp import KubeHTTP, wait_for
from tests.e2e.kube import (
    BUSY_OR_PARTLY,
    Namespace,
    apply_priority_classes,
    cycle_for,
    cycle_until,
    gpu_pod,
    kept_unless_wholly_idle,
    managers,
    restore,
)
from tests.support.sandbox import fresh_namespace, started

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
GPUS_IN_QUEUE = 1  # one GPU of quota: the second Job waits for the first one's
WORKLOAD_PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"  # kueue pkg/controller/constants


@pytest.fixture(scope="module")
def kueue_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from started(tmp_path_factory, "kueue", with_controllers=("kueue",))


def apply_basics(api: KubeHTTP) -> None:
    """The PriorityClasses and the one ResourceFlavor every queue here uses."""
    apply_priority_classes(api, {"gpu-low": 100, "gpu-high": 10000})
    api.apply(f"{KUEUE}/resourceflavors/default", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": "default"}, "spec": {}})


@pytest.fixture
def queue_ns(kueue_box: Sandbox, request: pytest.FixtureRequest) -> Iterator[Namespace]:
    """A namespace with its own LocalQueue and ClusterQueue of GPUS_IN_QUEUE GPUs (or the
    test's indirect parameter)."""
    gpus = getattr(request, "param", GPUS_IN_QUEUE)
    api = kueue_box.api()
    apply_basics(api)
    for ns in fresh_namespace(api, "kueue"):
        cq = f"gpus-{ns.name}"  # a queue per test: no test waits on another's quota
        api.apply(f"{KUEUE}/clusterqueues/{cq}", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{
                "coveredResources": ["nvidia.com/gpu"],
                "flavors": [{"name": "default", "resources": [
                    {"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]}})
        api.apply(f"{KUEUE}/namespaces/{ns.name}/localqueues/team", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "team", "namespace": ns.name},
            "spec": {"clusterQueue": cq}})
        yield ns


def queued_job(ns: Namespace, name: str, priority_class: str, util: str,
               pods: int = 1, queue: str = "team",
               workload_priority: str | None = None) -> dict[str, Any]:
    """A Job for Kueue of ``pods`` 1-GPU pods, created suspended as Kueue's docs ask without
    its webhook; ``workload_priority``: the WorkloadPriorityClass its Workload gets."""
    labels = {KUEUE_QUEUE: queue}
    if workload_priority is not None:
        labels[WORKLOAD_PRIORITY_CLASS] = workload_priority
    pod = gpu_pod("x", 1, util=util, node="h100-0", priority_class=priority_class)
    pod["spec"]["restartPolicy"] = "Never"
    return ns.api.create(f"/apis/batch/v1/namespaces/{ns.name}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {"suspend": True, "parallelism": pods, "completions": pods, "template": {
            "metadata": {"annotations": pod["metadata"]["annotations"]}, "spec": pod["spec"]}}})


def workload_of(ns: Namespace, job: dict[str, Any]) -> dict[str, Any] | None:
    items = ns.api.get(f"{KUEUE}/namespaces/{ns.name}/workloads?labelSelector="
                       f"{KUEUE_JOB_UID}%3D{job['metadata']['uid']}")["items"]
    return items[0] if items else None


def waiting_for_quota(ns: Namespace, job: dict[str, Any]) -> None:
    wait_for("the second Workload to wait for quota", lambda: (
        (wl := workload_of(ns, job)) is not None and not condition(wl, "QuotaReserved")),
        timeout=60)


def condition(obj: dict[str, Any] | None, kind: str) -> bool:
    return obj is not None and any(c["type"] == kind and c["status"] == "True"
                                   for c in obj.get("status", {}).get("conditions") or ())


def running(ns: Namespace, job: str) -> list[dict[str, Any]]:
    return [p for p in ns.pods() if (p["metadata"].get("labels") or {}).get("job-name") == job
            and p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]]


async def test_an_idle_admitted_workload_is_deactivated_and_a_waiting_one_runs(
        kueue_box, queue_ns, reclaimer):
    ns = queue_ns
    low = queued_job(ns, "low", "gpu-low", util="0")
    wait_for("Kueue to admit and start the idle Job", lambda: running(ns, "low"), timeout=120)
    # Of equal priority, so queue enforcement leaves it to the idle timeout (the test below).
    high = queued_job(ns, "high", "gpu-low", util="80")
    waiting_for_quota(ns, high)
    rec = await reclaimer("enforce", box=kueue_box)
    low_wl = f"{KUEUE}/namespaces/{ns.name}/workloads/{workload_of(ns, low)['metadata']['name']}"
    await cycle_until(rec, "the idle Workload deactivated",
                      lambda: ns.api.get(low_wl)["spec"].get("active") is False, timeout=150)
    assert ns.api.get(low_wl)["metadata"]["annotations"][RECLAIM_REASON] == "idle"
    # Kueue, not gpusteward, evicts it: the Job is suspended and its pod goes
    wait_for("Kueue to suspend the idle Job and remove its pod", lambda: (
        ns.api.get(f"/apis/batch/v1/namespaces/{ns.name}/jobs/low")["spec"]["suspend"]
        and not running(ns, "low")), timeout=120)
    wait_for("the waiting Workload admitted and running", lambda: running(ns, "high"),
             timeout=120)
    job = ns.api.get(f"/apis/batch/v1/namespaces/{ns.name}/jobs/low")
    ours = managers(ns.api.get(low_wl), "f:active")
    assert ours and not ours & managers(job, "f:suspend"), (ours, managers(job, "f:suspend"))
    assert RECLAIM_REASON not in (job["metadata"].get("annotations") or {})
    # restored once the quota is free again, Kueue admits it and resumes its Job
    ns.api.delete(f"/apis/batch/v1/namespaces/{ns.name}/jobs/high",
                  {"propagationPolicy": "Background"})
    out = restore(kueue_box.kubeconfig, f"{ns.name}/Workload/{low_wl.rpartition('/')[2]}")
    assert out.returncode == 0, out.stderr
    assert ns.api.get(low_wl)["spec"]["active"] is True
    wait_for("Kueue to admit the restored Workload and run its pod", lambda: running(ns, "low"),
             timeout=120)


async def test_queue_enforcement_deactivates_an_idle_workload_for_one_waiting_for_quota(
        kueue_box, queue_ns, reclaimer):
    """A higher-priority Workload waiting for admission has no pending pod (Kueue keeps its Job
    suspended): its demand is read from the Workload itself, and the idle lower-priority one is
    deactivated for it at once, under a policy whose idle timeout would take an hour."""
    ns = queue_ns
    base = load_policy(kueue_box.cfg.policy)
    hour_grace = msgspec.structs.replace(base.reclaim.idle, grace=Duration(3600))
    policy = msgspec.structs.replace(base, reclaim=msgspec.structs.replace(
        base.reclaim, idle=hour_grace))
    low = queued_job(ns, "low", "gpu-low", util="0")
    wait_for("Kueue to admit and start the idle Job", lambda: running(ns, "low"), timeout=120)
    high = queued_job(ns, "high", "gpu-high", util="80")
    waiting_for_quota(ns, high)
    assert not [p for p in ns.pods() if (p["metadata"].get("labels") or {}).get(
        "job-name") == "high"]  # no pending pod: the demand is the Workload's
    rec = await reclaimer("enforce", box=kueue_box, policy=policy)
    low_wl = f"{KUEUE}/namespaces/{ns.name}/workloads/{workload_of(ns, low)['metadata']['name']}"
    await cycle_until(rec, "the idle Workload deactivated for the waiting one",
                      lambda: ns.api.get(low_wl)["spec"].get("active") is False, timeout=150)
    assert ns.api.get(low_wl)["metadata"]["annotations"][RECLAIM_REASON] == "queue"
    wait_for("the waiting Workload admitted and running", lambda: running(ns, "high"),
             timeout=120)
    assert condition(workload_of(ns, high), "Admitted")


@pytest.mark.parametrize("queue_ns", [2], indirect=True)  # room for both pods of the Job
@BUSY_OR_PARTLY
async def test_a_workload_not_wholly_idle_is_never_deactivated(kueue_box, queue_ns, reclaimer,
                                                               busy):
    ns = queue_ns
    job = queued_job(ns, "pair", "gpu-low", util="80" if busy else "0", pods=2)
    wait_for("Kueue to admit the Job and run both pods", lambda: len(running(ns, "pair")) == 2,
             timeout=120)
    wl = f"{KUEUE}/namespaces/{ns.name}/workloads/{workload_of(ns, job)['metadata']['name']}"
    await kept_unless_wholly_idle(await reclaimer("enforce", box=kueue_box), ns, busy,
                                  lambda: ns.api.get(wl)["spec"].get("active") is False,
                                  lambda: running(ns, "pair"))


# Kueue re-queues the Workloads waiting in a cohort when an admitted one's effective priority
# changes, a boost included, only where that priority comes from a WorkloadPriorityClass (kueue
# v0.17.0 pkg/workload PriorityChanged: "Updates to Pod Priority are not supported"); the
# priority of Workloads whose Jobs name one is that class's value.
WORKLOAD_PRIORITIES = {"wl-low": 100, "wl-high": 10000}


@pytest.fixture
def cohort_ns(kueue_box: Sandbox) -> Iterator[Namespace]:
    """A namespace with two LocalQueues on two ClusterQueues of one cohort: ``borrow`` (no GPU
    of its own: what it runs is borrowed) and ``lend`` (the cohort's one GPU; it takes back
    what is borrowed only from lower priorities, reclaimWithinCohort: LowerPriority; kueue
    v0.17.0 apis/kueue/v1beta2/clusterqueue_types.go ClusterQueuePreemption)."""
    api = kueue_box.api()
    apply_basics(api)
    for name, value in WORKLOAD_PRIORITIES.items():
        api.apply(f"{KUEUE}/workloadpriorityclasses/{name}", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
            "metadata": {"name": name}, "value": value})
    for ns in fresh_namespace(api, "kueue"):
        for queue, gpus, preemption in (("borrow", 0, {}),
                                         ("lend", 1, {"reclaimWithinCohort": "LowerPriority"})):
            cq = f"{queue}-{ns.name}"
            api.apply(f"{KUEUE}/clusterqueues/{cq}", {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                "metadata": {"name": cq},
                "spec": {"namespaceSelector": {}, "cohortName": f"cohort-{ns.name}",
                         "preemption": preemption, "resourceGroups": [{
                             "coveredResources": ["nvidia.com/gpu"],
                             "flavors": [{"name": "default", "resources": [
                                 {"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]}})
            api.apply(f"{KUEUE}/namespaces/{ns.name}/localqueues/{queue}", {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                "metadata": {"name": queue, "namespace": ns.name},
                "spec": {"clusterQueue": cq}})
        yield ns


async def test_an_idle_borrowing_workload_is_demoted_preempted_by_kueue_and_undemoted(
        kueue_box, cohort_ns, reclaimer):
    ns = cohort_ns
    base = load_policy(kueue_box.cfg.policy)
    policy = msgspec.structs.replace(base, reclaim=msgspec.structs.replace(
        base.reclaim, kueue=msgspec.structs.replace(base.reclaim.kueue, action="demote")))
    idle = queued_job(ns, "idle", "gpu-high", util="0", queue="borrow",
                      workload_priority="wl-high")
    wait_for("Kueue to admit the borrowing Job and run it", lambda: running(ns, "idle"),
             timeout=120)
    lender = queued_job(ns, "lender", "gpu-low", util="80", queue="lend",
                        workload_priority="wl-low")
    waiting_for_quota(ns, lender)
    # Kueue preempts at once where it may (its scheduler's next pass): it may not here, the
    # borrower outranks the lender's Workload
    await asyncio.sleep(5)
    assert not condition(workload_of(ns, lender), "QuotaReserved") and running(ns, "idle")
    idle_wl = f"{KUEUE}/namespaces/{ns.name}/workloads/{workload_of(ns, idle)['metadata']['name']}"
    rec = await reclaimer("enforce", box=kueue_box, policy=policy)
    await cycle_until(rec, "the idle Workload demoted", lambda: KUEUE_PRIORITY_BOOST in (
        ns.api.get(idle_wl)["metadata"].get("annotations") or {}), timeout=150)
    wl = ns.api.get(idle_wl)
    assert wl["metadata"]["annotations"][KUEUE_PRIORITY_BOOST] == str(
        policy.reclaim.kueue.priority_boost)
    assert wl["metadata"]["annotations"][RECLAIM_REASON] == "idle"
    assert wl["spec"].get("active") is not False  # demoted, not deactivated
    # Kueue, now ranking it below the lender's Workload, takes the borrowed GPU back
    wait_for("Kueue to preempt the demoted Workload and admit the lender's", lambda: (
        condition(workload_of(ns, lender), "Admitted") and not running(ns, "idle")), timeout=120)
    wait_for("the lender's Job running", lambda: running(ns, "lender"), timeout=120)
    assert any(c["type"] == "Evicted" and c["reason"] == "Preempted"
               for c in ns.api.get(idle_wl)["status"].get("conditions") or ())
    # waiting for readmission it stays demoted (it would preempt the lender back otherwise)
    await cycle_for(rec, 6)
    assert KUEUE_PRIORITY_BOOST in ns.api.get(idle_wl)["metadata"]["annotations"]
    assert running(ns, "lender")
    # the quota free again, Kueue admits it again, and it runs at its own priority
    ns.api.delete(f"/apis/batch/v1/namespaces/{ns.name}/jobs/lender",
                  {"propagationPolicy": "Background"})
    wait_for("Kueue to admit the demoted Workload again", lambda: running(ns, "idle"),
             timeout=120)
    await cycle_until(rec, "the boost removed", lambda: KUEUE_PRIORITY_BOOST not in (
        ns.api.get(idle_wl)["metadata"].get("annotations") or {}), timeout=60)
    left = ns.api.get(idle_wl)["metadata"].get("annotations") or {}
    assert RECLAIM_REASON not in left and RECLAIMED_AT not in left
