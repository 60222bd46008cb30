"""Faults injected into the reclaimer against the sandbox's real API server (issue 13): a leader
paused between deciding and acting while a standby takes the Lease and the pod gets busy, the
Lease deleted under a leader, a leader that cannot renew, a leader killed between recording
its intent and acting, and `restore` fed annotations it must not trust: it trusts only the stop
record gpusteward wrote (issue 25).

The Lease semantics are coordination.k8s.io/v1's (holderIdentity, renewTime,
leaseDurationSeconds: "a duration that candidates for a lease need to wait to force acquire
it"); client-go's own leaderelection package documents that it "does not guarantee that only
one client is acting as a leader (a.k.a. fencing)" — the fence here is what adds that.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable

import msgspec
import pytest

from gpusteward.adapters.errors import LeaseLost
from gpusteward.adapters.lease import LeaseGuard
from gpusteward.adapters.policyfile import load_policy
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import IDLE_SINCE, RECLAIM_REASON, REPLICAS_BEFORE, Action
from gpusteward.reclaimer.actor import scaled_reason
from gpusteward.reclaimer.loop import Reclaimer
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e.kube import (
    annotations,
    cycle_for,
    cycle_until,
    gone,
    gpu_pod,
    promql,
    reasons,
    restore,
    set_util,
    stop_entries,
)
from tests.e2e.scenarios import due_pod
from tests.e2e.test_reclaim import deployment as idle_deployment
from tests.e2e.test_reclaim import idle_job, running_pods

DURATION = 6  # seconds: renew deadline 3 s, check margin 1.5 s
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"


async def until(what: str, check: Callable[[], object], timeout: float = 60.0) -> None:
    """Poll without blocking the event loop for long (the guards' tasks keep running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.3)
    raise TimeoutError(f"never reached: {what}")


def guard(rec: Reclaimer, lease: str, identity: str) -> LeaseGuard:
    return LeaseGuard(rec.reader.api, "kube-system", lease, identity, DURATION)


async def lead(g: LeaseGuard) -> None:
    """What the reclaimer's serve loop does with its guard: acquire, renew, and again."""
    while True:
        await g.acquire()
        await g.hold()


class Gate:
    """Holds a cycle at one point (a GC pause, CPU starvation) until released."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        self.action: Action | None = None  # what the held cycle was about to do

    async def hold(self) -> None:
        self.reached.set()
        await self.release.wait()


class HeldAfterRead:
    """The reader, paused after the snapshot that decides to reclaim ``pod``: the cycle then
    decides on what it read before the pause, and acts after it."""

    def __init__(self, rec: Reclaimer, pod: str, gate: Gate) -> None:
        self.inner, self.policy, self.pod, self.gate = rec.reader, rec.policy, pod, gate

    async def read(self, recent):
        snap = await self.inner.read(recent)
        if any(a.kind == "reclaim" and a.pod.name == self.pod
               for a in plan(snap, self.policy).actions):
            await self.gate.hold()
        return snap


class HeldBeforeWrite:
    """The writer, paused just before the reclaim of ``pod`` (None: any), after the fence
    passed."""

    def __init__(self, rec: Reclaimer, pod: str | None, gate: Gate) -> None:
        self.inner, self.pod, self.gate = rec.writer, pod, gate

    async def apply(self, action: Action) -> str:
        if action.kind == "reclaim" and self.pod in (None, action.pod.name):
            self.gate.action = action
            await self.gate.hold()
        return await self.inner.apply(action)


async def make_busy(ns, name: str, box) -> None:
    """The pod computes again; returns once Prometheus holds a busy sample of it."""
    set_util(ns, [name], "90")
    # The session sandbox stores the scrape as a ServiceMonitor with honorLabels false does:
    # the workload's labels are exported_*; with true they are plain. Either will do.
    query = " or ".join(f'DCGM_FI_DEV_GPU_UTIL{{{p}namespace="{ns.name}",{p}pod="{name}"}} >= 90'
                        for p in ("exported_", ""))
    await until(f"a busy sample of {name}", lambda: promql(box.prometheus_url, query))


async def wait_out_min_pod_age(rec: Reclaimer) -> None:
    # A pod younger than minPodAge is protected and its marks cleared: let the due pod age.
    await asyncio.sleep(float(rec.policy.reclaim.min_pod_age) + 1)


async def test_a_paused_leader_does_not_evict_what_the_new_leader_found_busy(sandbox, ns,
                                                                             reclaimer):
    lease = f"e2e-{ns.name}"
    ns.create_pod(due_pod("victim", node="h100-0"))
    ns.running("victim")
    paused, standby = await reclaimer("enforce"), await reclaimer("enforce")
    await wait_out_min_pod_age(paused)
    old, new = guard(paused, lease, "paused-0"), guard(standby, lease, "standby-1")
    paused.fence, standby.fence = old, new
    await old.acquire()
    renewing = asyncio.create_task(old.hold())
    gate = Gate()
    paused.reader = HeldAfterRead(paused, "victim", gate)
    held = asyncio.create_task(cycle_until(paused, "the held cycle", gate.reached.is_set,
                                           timeout=90))
    await asyncio.wait_for(gate.reached.wait(), 90)
    # The leader has decided to evict and stops, renewals included: the process is paused.
    renewing.cancel()
    await make_busy(ns, "victim", sandbox)
    await asyncio.wait_for(new.acquire(), 4 * DURATION)
    standing = asyncio.create_task(new.hold())
    try:
        await cycle_until(standby, "the busy pod's marks cleared",
                          lambda: IDLE_SINCE not in annotations(ns, "victim"))
        gate.release.set()  # the old leader resumes where it stopped: about to act
        await asyncio.wait_for(held, 60)
    finally:
        standing.cancel()
    assert not gone(ns, "victim")
    assert "GPUReclaimed" not in reasons(ns, "victim")
    assert paused.metrics.fenced.labels("fenced")._value.get() >= 1
    assert paused.metrics.actions.labels("reclaim", "idle", ns.name, "fenced")._value.get() == 1


async def test_a_leader_paused_after_its_fence_check_still_rechecks_the_pod(sandbox, ns,
                                                                            reclaimer):
    # The fence passed just before the pause: the re-check of the pod itself must stop it.
    ns.create_pod(due_pod("victim", node="h100-1"))
    ns.running("victim")
    paused, other = await reclaimer("enforce"), await reclaimer("warn")
    await wait_out_min_pod_age(paused)
    gate = Gate()
    paused.writer = HeldBeforeWrite(paused, "victim", gate)
    held = asyncio.create_task(cycle_until(paused, "the held cycle", gate.reached.is_set,
                                           timeout=90))
    await asyncio.wait_for(gate.reached.wait(), 90)
    await make_busy(ns, "victim", sandbox)
    await cycle_until(other, "the busy pod's marks cleared",
                      lambda: IDLE_SINCE not in annotations(ns, "victim"))
    gate.release.set()
    await asyncio.wait_for(held, 60)
    assert not gone(ns, "victim")
    assert paused.metrics.actions.labels("reclaim", "idle", ns.name, "stale")._value.get() == 1


async def test_a_scale_down_rechecks_every_pod_of_the_workload(sandbox, ns, reclaimer):
    # Both replicas idle when decided; one gets busy (its marks cleared by another replica)
    # while the leader is held before the write: the Deployment keeps its replicas.
    path = deployment(ns, "serve", 2, {}, node="a100-1", util="0")
    await until("2 replicas running", lambda: len(running_pods(ns, "serve")) == 2, timeout=90)
    paused, other = await reclaimer("enforce"), await reclaimer("warn")
    gate = Gate()
    first, second = sorted(p["metadata"]["name"] for p in running_pods(ns, "serve"))
    paused.writer = HeldBeforeWrite(paused, None, gate)
    held = asyncio.create_task(cycle_until(paused, "the held cycle", gate.reached.is_set,
                                           timeout=120))
    await asyncio.wait_for(gate.reached.wait(), 120)
    busy = second if gate.action.pod.name == first else first
    await make_busy(ns, busy, sandbox)
    await cycle_until(other, "the busy replica's marks cleared",
                      lambda: IDLE_SINCE not in annotations(ns, busy))
    gate.release.set()
    await asyncio.wait_for(held, 60)
    assert ns.api.get(path)["spec"]["replicas"] == 2
    assert paused.metrics.actions.labels("reclaim", "idle", ns.name, "stale")._value.get() == 1


async def passes(g: LeaseGuard) -> bool:
    try:
        await g.check()
        return True
    except LeaseLost:
        return False


async def test_a_deleted_lease_never_gives_two_acting_leaders(api, ns, reclaimer):
    lease = f"e2e-{ns.name}"
    rec = await reclaimer("observe")
    a, b = guard(rec, lease, "replica-a"), guard(rec, lease, "replica-b")
    await a.acquire()
    tasks = [asyncio.create_task(lead(a)), asyncio.create_task(lead(b))]
    try:
        assert await passes(a) and not await passes(b)
        api.delete(f"{LEASES}/{lease}")
        both, samples = 0, []
        deadline = time.monotonic() + 3 * DURATION
        while time.monotonic() < deadline:
            pa, pb = await passes(a), await passes(b)
            both += pa and pb
            samples.append((pa, pb))
            await asyncio.sleep(0.1)
        assert both == 0
        holder = api.get(f"{LEASES}/{lease}")["spec"]["holderIdentity"]
        assert samples[-1] == (holder == "replica-a", holder == "replica-b")
    finally:
        for t in tasks:
            t.cancel()


async def test_a_leader_that_cannot_renew_stops_before_its_lease_can_be_taken(ns, reclaimer):
    lease = f"e2e-{ns.name}"
    rec = await reclaimer("observe")
    a, b = guard(rec, lease, "replica-a"), guard(rec, lease, "replica-b")
    await a.acquire()
    renewing = asyncio.create_task(a.hold())
    await asyncio.sleep(DURATION / 2)
    assert await passes(a)
    renewing.cancel()  # renewals stop (a partition between it and the API server)
    stopped = time.monotonic()
    taking = asyncio.create_task(b.acquire())
    while await passes(a):
        await asyncio.sleep(0.1)
    fenced_after = time.monotonic() - stopped
    await asyncio.wait_for(taking, 4 * DURATION)
    taken_after = time.monotonic() - stopped
    assert fenced_after <= a.renew_deadline + 1.0
    assert fenced_after < taken_after
    assert taken_after >= DURATION


class Killed(BaseException):
    """The process dies: nothing after this point runs, no handler catches it."""


class DiesBeforeActing:
    def __init__(self, rec: Reclaimer) -> None:
        self.inner = rec.writer

    async def apply(self, action: Action) -> str:
        if action.kind == "reclaim":
            raise Killed
        return await self.inner.apply(action)


async def test_a_leader_killed_between_intent_and_action_still_counts_against_the_limit(
        sandbox, ns, reclaimer):
    base = load_policy(sandbox.cfg.policy)
    limits = msgspec.structs.replace(base.reclaim.limits, max_per_hour=2)
    policy = msgspec.structs.replace(
        base, reclaim=msgspec.structs.replace(base.reclaim, limits=limits))
    ledger = f"e2e-{ns.name}-reclaims"
    pods = ("due-a", "due-b", "due-c")
    for name in pods:
        ns.create_pod(due_pod(name, node="a100-0"))
    for name in pods:
        ns.running(name)
    dying = await reclaimer("enforce", policy=policy, ledger=ledger)
    await wait_out_min_pod_age(dying)
    dying.writer = DiesBeforeActing(dying)
    with pytest.raises(Killed):
        await cycle_until(dying, "a reclaim", lambda: False, timeout=90)
    assert not any(gone(ns, n) for n in pods)
    path = f"/api/v1/namespaces/kube-system/configmaps/{ledger}"
    assert [e["state"] for e in json.loads(ns.api.get(path)["data"]["reclaims"])] == ["intent"]
    successor = await reclaimer("enforce", policy=policy, ledger=ledger)
    await cycle_until(successor, "one reclaim", lambda: any(gone(ns, n) for n in pods))
    await cycle_for(successor, 8)
    assert sum(gone(ns, n) for n in pods) == 1  # 2 per hour: the dead leader's intent + 1
    states = sorted(e["state"] for e in json.loads(ns.api.get(path)["data"]["reclaims"]))
    assert states == ["done", "intent"]


# --- restore trusts only what gpusteward itself recorded (issue 25) --------------------------
# Anyone who can edit a workload can write its annotations; the stop record lies in a
# ConfigMap in the reclaimer's namespace (kube-system here), written by gpusteward alone.

def deployment(ns, name: str, replicas: int, annotations: dict[str, str],
               node: str = "l4-2", util: str | None = None) -> str:
    pod = gpu_pod("x", 1, util=util, node=node, labels={"app": name})
    ns.api.create(f"/apis/apps/v1/namespaces/{ns.name}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name},
                                           "annotations": pod["metadata"]["annotations"]},
                              "spec": pod["spec"]}}})
    return f"/apis/apps/v1/namespaces/{ns.name}/deployments/{name}"


def refused(out: subprocess.CompletedProcess, *words: str) -> None:
    """Exit 1 and one ERROR line, saying all of ``words``."""
    assert out.returncode == 1, out.stderr
    errors = [line for line in out.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and all(w in errors[0] for w in words), out.stderr


# The forgery: a count and a reason that agree with each other, both hand-written.
FORGED = {REPLICAS_BEFORE: "100000", RECLAIM_REASON: scaled_reason("idle", 100000)}


@pytest.mark.parametrize(("marks", "refusal"), [
    pytest.param(FORGED, "is not in gpusteward's stop record", id="self-consistent-forgery"),
    pytest.param({REPLICAS_BEFORE: "2"}, "was not stopped by gpusteward",
                 id="no-reason-annotation"),
])
def test_restore_refuses_a_deployment_gpusteward_never_recorded(sandbox, ns, marks, refusal):
    path = deployment(ns, "serve", 0, marks)
    refused(restore(sandbox.kubeconfig, f"{ns.name}/Deployment/serve"), refusal)
    assert ns.api.get(path)["spec"]["replicas"] == 0


def suspended_job(ns, name: str, annotations: dict[str, str]) -> str:
    template = gpu_pod("x", 1, util="0", node="l4-2")
    template["spec"]["restartPolicy"] = "Never"
    ns.api.create(f"/apis/batch/v1/namespaces/{ns.name}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"suspend": True, "template": {"spec": template["spec"]}}})
    return f"/apis/batch/v1/namespaces/{ns.name}/jobs/{name}"


@pytest.mark.parametrize(("marks", "refusal"), [
    pytest.param({}, "was not stopped by gpusteward", id="a-queue-controllers-suspension"),
    pytest.param({RECLAIM_REASON: "idle"}, "is not in gpusteward's stop record",
                 id="given-a-hand-written-reason"),
])
def test_restore_never_resumes_a_job_someone_else_suspended(sandbox, ns, marks, refusal):
    path = suspended_job(ns, "queued", marks)
    refused(restore(sandbox.kubeconfig, f"{ns.name}/Job/queued"), refusal)
    assert ns.api.get(path)["spec"]["suspend"] is True


async def test_restore_brings_back_the_count_gpusteward_recorded_and_no_other(sandbox, ns,
                                                                              reclaimer):
    path = idle_deployment(ns, "serve", 2, "a100-0")
    wait_for("2 replicas running", lambda: len(running_pods(ns, "serve")) == 2)
    rec = await reclaimer("enforce")
    await cycle_until(rec, "scaled to zero", lambda: ns.api.get(path)["spec"]["replicas"] == 0)
    real = {k: ns.api.get(path)["metadata"]["annotations"][k]
            for k in (REPLICAS_BEFORE, RECLAIM_REASON)}
    target = f"{ns.name}/Deployment/serve"
    for marks, words in (
            (FORGED, ("'100000' disagrees with gpusteward's stop record (2 replicas)",)),
            ({REPLICAS_BEFORE: "٣"}, ("'٣' disagrees", "(2 replicas)")),
            ({REPLICAS_BEFORE: "1"}, ("'1' disagrees", "(2 replicas)"))):
        ns.api.merge_patch(path, {"metadata": {"annotations": {**real, **marks}}})
        refused(restore(sandbox.kubeconfig, target), *words)
        assert ns.api.get(path)["spec"]["replicas"] == 0
    ns.api.merge_patch(path, {"metadata": {"annotations": real}, "spec": {"replicas": 1}})
    refused(restore(sandbox.kubeconfig, target), "runs 1 replicas, not 0")
    ns.api.merge_patch(path, {"spec": {"replicas": 0}})
    out = restore(sandbox.kubeconfig, target)
    assert out.returncode == 0, out.stderr
    assert "scaled back to 2" in out.stdout
    assert ns.api.get(path)["spec"]["replicas"] == 2
    assert stop_entries(ns) == []


async def test_restore_resumes_a_job_gpusteward_suspended_once_and_never_its_namesake(
        sandbox, ns, reclaimer):
    train, twin = idle_job(ns, "train", "h100-1"), idle_job(ns, "twin", "h100-1")
    rec = await reclaimer("enforce")
    await cycle_until(rec, "both Jobs suspended", lambda: all(
        ns.api.get(p)["spec"].get("suspend") for p in (train, twin)))
    assert sorted(e["name"] for e in stop_entries(ns)) == ["train", "twin"]
    # twin deleted and created again, suspended, with gpusteward's reason written by hand
    stopped_uid = ns.api.get(twin)["metadata"]["uid"]
    ns.api.delete(twin, {"propagationPolicy": "Background"})
    wait_for("twin to go", lambda: not any(
        j["metadata"]["name"] == "twin" for j in ns.api.get(
            f"/apis/batch/v1/namespaces/{ns.name}/jobs")["items"]))
    suspended_job(ns, "twin", {RECLAIM_REASON: "idle"})
    refused(restore(sandbox.kubeconfig, f"{ns.name}/Job/twin"),
            f"but gpusteward stopped uid {stopped_uid}")
    assert ns.api.get(twin)["spec"]["suspend"] is True
    out = restore(sandbox.kubeconfig, f"{ns.name}/Job/train")
    assert out.returncode == 0, out.stderr
    job = ns.api.get(train)
    assert job["spec"]["suspend"] is False
    assert RECLAIM_REASON not in (job["metadata"].get("annotations") or {})
    assert [e["name"] for e in stop_entries(ns)] == ["twin"]  # only train's entry went
    refused(restore(sandbox.kubeconfig, f"{ns.name}/Job/train"),
            "was not stopped by gpusteward")
