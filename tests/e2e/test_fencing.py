"""Every reclaimer write fenced by the API server itself (issue 25), against the sandbox's real
kube-apiserver: a leader whose write is already on its way when it stalls — held in an HTTP
proxy in front of it (tests.support.apiproxy), as a write sent just before a GC pause, SIGSTOP or
a throttled node — while a standby takes the Lease, the pod turns busy and the standby clears its
marks. The write then reaches the server carrying the resourceVersion it was derived from and
is refused with 409 Conflict. An owner's stop is fenced on the owner, which the pod's marks do
not move: the new leader's first cycle touches the owner of every reclaim begun and not
finished (core.reclaim.takeover), which does.

The server-side guards are Kubernetes' own: a patch that carries ``metadata.resourceVersion`` is
applied only to that version (apiserver's optimistic concurrency, "the object has been
modified"), and an eviction's ``deleteOptions.preconditions`` {uid, resourceVersion} are checked
against the pod in etcd (kubernetes v1.36.3 pkg/registry/core/pod/storage/eviction.go,
addConditionAndDeletePod: "the ResourceVersion in the precondition ... does not match").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpusteward.adapters.lease import LeaseGuard
from gpusteward.core.owners import KUEUE_JOB_UID, KUEUE_QUEUE, NOTEBOOK_STOPPED
from gpusteward.core.reclaim.model import FENCED_AT, IDLE_SINCE, RECLAIM_REASON
from gpusteward.reclaimer.loop import Reclaimer
from gpusteward.sandbox import owner_crds
from tests.e2e.kube import annotations, cycle_until, gone, gpu_pod, reasons
from tests.e2e.scenarios import due_pod
from tests.e2e.test_faults import make_busy, until, wait_out_min_pod_age
from tests.e2e.test_reclaim_kinds import (
    create,
    gpu_job,
    idle_notebook,
    job_pod_running,
    owned_pod,
)
from tests.support.apiproxy import ApiProxy, lease_reads, writes_to

TIMEOUT = 150.0  # mark, warn and act on a loaded machine


@pytest.fixture
async def proxy(sandbox, tmp_path: Path) -> AsyncIterator[tuple[ApiProxy, Path]]:
    async with ApiProxy(sandbox.api_url).running() as p:
        yield p, p.kubeconfig(sandbox.token, tmp_path / "proxied.kubeconfig")


def leader(rec: Reclaimer, lease: str, identity: str, duration: int) -> LeaseGuard:
    """What serve._lead wires: the guard as the fence, its deadline as the client's gate."""
    guard = LeaseGuard(rec.reader.api, "kube-system", lease, identity, duration)
    rec.fence = guard
    rec.reader.api.gate = guard.may_write
    return guard


def fenced(rec: Reclaimer, ns: str) -> tuple[float, float]:
    return (rec.metrics.fenced.labels("fenced")._value.get(),
            rec.metrics.actions.labels("reclaim", "idle", ns, "fenced")._value.get())


@pytest.mark.parametrize(("duration", "slow_lease", "held"), [
    pytest.param(6, 0.0, ("/pods/victim", "PATCH"), id="reason-patch-held"),
    # A slow API server: the stalled leader's Lease reads come back a second late, as in the
    # attack run that evicted a busy pod; its reason patch lands before the takeover, and the
    # eviction is the write held.
    pytest.param(10, 1.0, ("/pods/victim/eviction", "POST"), id="slow-lease-eviction-held"),
])
async def test_a_stalled_leaders_write_is_refused_by_the_api_server_after_a_takeover(
        sandbox, ns, reclaimer, proxy, duration, slow_lease, held):
    p, kubeconfig = proxy
    lease = f"e2e-{ns.name}"
    ns.create_pod(due_pod("victim", node="h100-0"))
    ns.running("victim")
    stalled = await reclaimer("enforce", kubeconfig=kubeconfig)
    standby = await reclaimer("warn")
    await wait_out_min_pod_age(stalled)
    old = leader(stalled, lease, "stalled-0", duration)
    if slow_lease:
        p.slow(lease_reads, slow_lease)
    p.hold(writes_to(*held))
    await old.acquire()
    renewing = asyncio.create_task(old.hold())
    acting = asyncio.create_task(cycle_until(stalled, "a write held", p.reached.is_set,
                                             timeout=120))
    await asyncio.wait_for(p.reached.wait(), 120)
    renewing.cancel()  # the process is paused: its renewals stop with it
    await make_busy(ns, "victim", sandbox)
    new = leader(standby, lease, "standby-1", duration)
    await asyncio.wait_for(new.acquire(), 4 * duration)
    standing = asyncio.create_task(new.hold())
    try:
        await cycle_until(standby, "the busy pod's marks cleared",
                          lambda: IDLE_SINCE not in annotations(ns, "victim"))
        after_takeover = ns.pod("victim")["metadata"]["resourceVersion"]
        p.release()  # the held write reaches the API server now
        await asyncio.wait_for(acting, 60)
    finally:
        standing.cancel()
    assert p.written_after_release("/pods/victim") == [409]
    assert ns.pod("victim")["metadata"]["resourceVersion"] == after_takeover
    assert not gone(ns, "victim")
    assert "GPUReclaimed" not in reasons(ns, "victim")
    assert "GPUReclaimFenced" not in reasons(ns, "victim")  # it may no longer write at all
    if slow_lease:  # renewals that slow also let the local write deadline stop a cycle or two
        assert min(fenced(stalled, ns.name)) >= 1
    else:
        assert fenced(stalled, ns.name) == (1, 1)


async def test_a_write_that_meets_a_change_is_fenced_said_in_an_event_and_decided_again(
        sandbox, ns, reclaimer, proxy):
    # The leader keeps its Lease; someone else changes the pod between its read and its write.
    p, kubeconfig = proxy
    ns.create_pod(due_pod("victim", node="h100-1"))
    ns.running("victim")
    rec = await reclaimer("enforce", kubeconfig=kubeconfig)
    await wait_out_min_pod_age(rec)
    guard = leader(rec, f"e2e-{ns.name}", "leader-0", 6)
    await guard.acquire()
    renewing = asyncio.create_task(guard.hold())
    try:
        p.hold(writes_to("/pods/victim", "PATCH"))
        acting = asyncio.create_task(cycle_until(rec, "a write held", p.reached.is_set,
                                                 timeout=120))
        await asyncio.wait_for(p.reached.wait(), 120)
        ns.api.merge_patch(ns.path("pods", "victim"), {"metadata": {"labels": {
            "example.com/touched": "yes"}}})
        p.release()
        await asyncio.wait_for(acting, 60)
        assert p.written_after_release("/pods/victim") == [409]
        assert fenced(rec, ns.name) == (1, 1)
        assert "GPUReclaimFenced" in reasons(ns, "victim")
        assert RECLAIM_REASON not in annotations(ns, "victim") and not gone(ns, "victim")
        # The next cycle reads the pod as it is now, still idle, and reclaims it.
        await cycle_until(rec, "the pod evicted", lambda: gone(ns, "victim"), timeout=60)
    finally:
        renewing.cancel()


async def test_a_new_leader_fences_the_owner_of_a_reclaim_another_leader_had_on_its_way(
        sandbox, ns, reclaimer, proxy):
    # The stalled leader's pod write landed; its owner write (the Job's suspend) is in flight.
    # The pod's marks do not guard the owner; the new leader's first cycle touches the owner.
    p, kubeconfig = proxy
    path, stopped = idle_job(ns)
    await until("the Job's pod running", lambda: any(
        pod["status"].get("phase") == "Running" for pod in ns.pods()), timeout=90)
    lease = f"e2e-{ns.name}"
    stalled = await reclaimer("enforce", kubeconfig=kubeconfig)
    old = leader(stalled, lease, "stalled-0", 6)
    await old.acquire()
    renewing = asyncio.create_task(old.hold())
    p.hold(writes_to(path.removeprefix("/apis"), "PATCH"))
    acting = asyncio.create_task(cycle_until(stalled, "the Job's suspend held",
                                             p.reached.is_set, timeout=TIMEOUT))
    await asyncio.wait_for(p.reached.wait(), TIMEOUT)
    renewing.cancel()
    standby = await reclaimer("enforce")
    new = leader(standby, lease, "standby-1", 6)
    await asyncio.wait_for(new.acquire(), 24)
    standby.reread_ledger()  # what serve._lead does on taking the Lease
    standing = asyncio.create_task(new.hold())
    try:
        await standby.cycle()  # its first cycle: fences, marks, reclaims nothing
        assert FENCED_AT in (ns.api.get(path)["metadata"].get("annotations") or {})
        p.release()
        await asyncio.wait_for(acting, 60)
    finally:
        standing.cancel()
    assert p.written_after_release(path.removeprefix("/apis")) == [409]
    assert not stopped(ns.api.get(path))
    assert standby.metrics.actions.labels("fence", "idle", ns.name, "done")._value.get() == 1


# --- each owner-native stop, fenced on the object it writes ---------------------------------

def idle_job(ns) -> tuple[str, Any]:
    template = gpu_pod("x", 1, util="0", node="a100-1")
    template["spec"]["restartPolicy"] = "Never"
    ns.api.create(f"/apis/batch/v1/namespaces/{ns.name}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
        "spec": {"template": {"metadata": {"annotations": template["metadata"]["annotations"]},
                              "spec": template["spec"]}}})
    return (f"/apis/batch/v1/namespaces/{ns.name}/jobs/train",
            lambda obj: obj["spec"].get("suspend") is True)


def idle_deployment(ns) -> tuple[str, Any]:
    pod = gpu_pod("x", 1, util="0", node="a100-1", labels={"app": "serve"})
    ns.api.create(f"/apis/apps/v1/namespaces/{ns.name}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "serve"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "serve"}},
                 "template": {"metadata": pod["metadata"], "spec": pod["spec"]}}})
    return (f"/apis/apps/v1/namespaces/{ns.name}/deployments/serve",
            lambda obj: obj["spec"]["replicas"] == 0)


def notebook(ns) -> tuple[str, Any]:
    return (idle_notebook(ns, "a100-1"),
            lambda obj: NOTEBOOK_STOPPED in (obj["metadata"].get("annotations") or {}))


def idle_pytorchjob(ns) -> tuple[str, Any]:
    job = create(ns, "kubeflow.org/v1", "pytorchjobs", "PyTorchJob", "ddp",
                 {"runPolicy": {"suspend": False}, "pytorchReplicaSpecs": {}})
    owned_pod(ns, "ddp-master-0", job, "a100-1")
    return (f"/apis/kubeflow.org/v1/namespaces/{ns.name}/pytorchjobs/ddp",
            lambda obj: obj["spec"]["runPolicy"]["suspend"] is True)


def idle_leaderworkerset(ns) -> tuple[str, Any]:
    lws = create(ns, "leaderworkerset.x-k8s.io/v1", "leaderworkersets", "LeaderWorkerSet",
                 "lws", {"replicas": 1})
    owned_pod(ns, "lws-0", lws, "a100-1")
    return (f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns.name}/leaderworkersets/lws",
            lambda obj: obj["spec"]["replicas"] == 0)


def idle_kueue_workload(ns) -> tuple[str, Any]:
    job = gpu_job(ns, "queued", {KUEUE_QUEUE: "team-a"})
    create(ns, "kueue.x-k8s.io/v1beta2", "workloads", "Workload", "job-queued-1a2b3",
           labels={KUEUE_JOB_UID: job["metadata"]["uid"]})
    job_pod_running(ns, "queued")
    return (f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns.name}/workloads/job-queued-1a2b3",
            lambda obj: obj["spec"]["active"] is False)


@pytest.fixture(scope="module")
def crds(sandbox):
    api = sandbox.api()
    owner_crds.install(api)
    yield
    owner_crds.remove(api)


@pytest.mark.parametrize("workload", [
    pytest.param(idle_job, id="Job-suspend"),
    pytest.param(idle_deployment, id="Deployment-scale"),
    pytest.param(notebook, id="Notebook-stop-annotation"),
    pytest.param(idle_pytorchjob, id="PyTorchJob-suspend-field"),
    pytest.param(idle_leaderworkerset, id="LeaderWorkerSet-scale-subresource"),
    pytest.param(idle_kueue_workload, id="Kueue-Workload-deactivate"),
])
async def test_each_owner_stop_is_fenced_on_the_object_it_writes(sandbox, ns, reclaimer, proxy,
                                                                 crds, workload):
    p, kubeconfig = proxy
    path, stopped = workload(ns)
    await until("the workload's pods running", lambda: any(
        pod["status"].get("phase") == "Running" for pod in ns.pods()), timeout=90)
    rec = await reclaimer("enforce", kubeconfig=kubeconfig)
    p.hold(writes_to(path.rpartition("/apis")[2], "PATCH"))
    acting = asyncio.create_task(cycle_until(rec, "the owner's stop held", p.reached.is_set,
                                             timeout=TIMEOUT))
    await asyncio.wait_for(p.reached.wait(), TIMEOUT)
    # Meanwhile its owner changes it (a controller's write, a user's edit): the stop that was
    # derived from the object before that change must not land on top of it.
    ns.api.merge_patch(path, {"metadata": {"annotations": {"example.com/touched": "yes"}}})
    p.release()
    await asyncio.wait_for(acting, 60)
    assert p.written_after_release(path.rpartition("/apis")[2]) == [409]
    assert not stopped(ns.api.get(path))
    assert rec.metrics.fenced.labels("fenced")._value.get() == 1
