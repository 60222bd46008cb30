"""The reclaimer against the sandbox: real API server (Eviction API, PDBs), controller manager
(Job, Deployment, disruption controllers), kube-scheduler and Prometheus.

Cycles run in-process through the real adapters, so each test steps the reclaimer itself; the
sandbox policy (sandbox/policy.yaml) uses a 15 s window and a 4 s grace.
"""

from __future__ import annotations

import json
import time
import urllib.request

import msgspec
import pytest

from gpusteward.adapters.policyfile import load_policy
from gpusteward.core.reclaim.model import IDLE_SINCE, RECLAIM_AT, REPLICAS_BEFORE
from gpusteward.reclaimer.ledger import LedgerError
from gpusteward.sandbox.fleet import Pool
from gpusteward.sandbox.kubehttp import wait_for
from gpusteward.sandbox.procs import Proc, free_port
from gpusteward.sandbox.simulator import VIRTUAL_GPUS_LABEL
from tests.e2e import scenarios
from tests.e2e.kube import (
    annotations,
    apply_priority_classes,
    cycle_for,
    cycle_until,
    gone,
    gpu_pod,
    promql,
    reasons,
    restore,
    stop_entries,
    wait_for_gpu_samples,
)
from tests.e2e.scenarios import due_pod

PRIORITIES = {"gpu-low": 100, "gpu-mid": 5000, "gpu-high": 10000, "gpu-critical": 2_000_000}


@pytest.fixture(scope="module", autouse=True)
def priority_classes(sandbox):
    apply_priority_classes(sandbox.api(), PRIORITIES)


async def test_an_idle_bare_pod_is_warned_then_evicted(ns, reclaimer):
    await scenarios.an_idle_pod_is_warned_then_evicted(ns, await reclaimer("enforce"))


async def test_a_busy_pod_is_left_alone_and_its_marks_cleared(ns, reclaimer):
    await scenarios.a_busy_pod_is_left_alone_and_its_marks_cleared(ns, await reclaimer("enforce"))


# One time-sliced T4 (GFD: nvidia.com/gpu.replicas 2, product -SHARED, allocatable 2) whose
# exporter runs with --kubernetes-virtual-gpus: a copy of the GPU's series per pod (vgpu label).
SHARED_POOL = Pool(name="ts", product="Tesla-T4", count=1, gpus=2, memory_mi_b=15360, labels={
    "nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "2",
    "nvidia.com/gpu.count": "1", "nvidia.com/gpu.sharing-strategy": "time-slicing",
    VIRTUAL_GPUS_LABEL: "true"})


@pytest.fixture
def shared_gpu(sandbox, ns):
    sandbox.add_pool(SHARED_POOL)
    try:
        yield "ts-0"
    finally:  # its pods first, or they would outlive their node
        ns.api.delete(ns.path())
        wait_for("pods on the shared GPU to go", lambda: not ns.pods(), timeout=60)
        sandbox.remove_pool("ts")


async def test_on_a_shared_gpu_only_the_idle_pod_is_reclaimed(sandbox, ns, reclaimer, shared_gpu):
    ns.create_pod(gpu_pod("busy", 1, node=shared_gpu, util="80"))
    ns.create_pod(gpu_pod("idle", 1, node=shared_gpu, util="0"))
    for name in ("busy", "idle"):
        ns.running(name)
    wait_for_gpu_samples(sandbox.prometheus_url, ns.name, ["busy", "idle"], settle=0)
    # One physical GPU holds both: their series are copies of its own, one per pod.
    uuids = promql(sandbox.prometheus_url, f'count by (UUID) (DCGM_FI_DEV_GPU_UTIL{{'
                                           f'Hostname="{shared_gpu}"}})')
    assert [r["value"][1] for r in uuids] == ["2"]
    rec = await reclaimer("enforce")
    await cycle_until(rec, "idle mark", lambda: IDLE_SINCE in annotations(ns, "idle"))
    await cycle_until(rec, "eviction", lambda: gone(ns, "idle"))
    assert not gone(ns, "busy")
    assert IDLE_SINCE not in annotations(ns, "busy")
    assert "GPUReclaimed" not in reasons(ns, "busy")


async def test_the_per_hour_limit_outlives_the_reclaimer_that_counted(sandbox, ns, reclaimer):
    # maxPerHour 1 and two due pods: the first reclaimer takes one; a second one (a restart, or
    # another replica taking the Lease) reads the ledger and takes no more this hour.
    base = load_policy(sandbox.cfg.policy)
    limits = msgspec.structs.replace(base.reclaim.limits, max_per_hour=1)
    policy = msgspec.structs.replace(
        base, reclaim=msgspec.structs.replace(base.reclaim, limits=limits))
    ledger = f"e2e-{ns.name}-reclaims"
    pods = ("due-a", "due-b")
    for name in pods:
        ns.create_pod(due_pod(name, node="h100-0"))
    for name in pods:
        ns.running(name)
    first = await reclaimer("enforce", policy=policy, ledger=ledger)
    await cycle_until(first, "one reclaim", lambda: any(gone(ns, n) for n in pods))
    restarted = await reclaimer("enforce", policy=policy, ledger=ledger)
    await cycle_for(restarted, 8)
    assert sum(gone(ns, n) for n in pods) == 1
    record = ns.api.get(f"/api/v1/namespaces/kube-system/configmaps/{ledger}")
    assert len(json.loads(record["data"]["reclaims"])) == 1


async def test_a_damaged_ledger_stops_the_cycle_before_anything_is_done(ns, reclaimer):
    ledger = f"e2e-{ns.name}-reclaims"
    ns.api.create("/api/v1/namespaces/kube-system/configmaps", {
        "metadata": {"name": ledger}, "data": {"reclaims": "not a list"}})
    ns.create_pod(due_pod("due", node="h100-0"))
    ns.running("due")
    rec = await reclaimer("enforce", ledger=ledger)
    with pytest.raises(LedgerError, match="not a list of reclaims"):
        await rec.cycle()
    assert not gone(ns, "due")


async def test_an_eviction_keeps_the_pods_own_longer_grace(ns, reclaimer):
    # A checkpointing trainer asks for 600 s (spec.terminationGracePeriodSeconds); the sandbox
    # policy's evictionGrace is 1 s. The API server records the grace the eviction's
    # DeleteOptions gave in metadata.deletionGracePeriodSeconds; a finalizer of the test's own
    # keeps the pod readable. kwok's pod-delete stage (its default Stages) then deletes the pod
    # again with no grace, which lowers the live value at once, so the test reads the update
    # the eviction made, replayed by a watch from before it.
    manifest = due_pod("trainer", node="h100-1")
    manifest["spec"]["terminationGracePeriodSeconds"] = 600
    manifest["metadata"]["finalizers"] = ["e2e.gpusteward.io/hold"]
    ns.create_pod(manifest)
    ns.running("trainer")
    before = ns.pod("trainer")["metadata"]["resourceVersion"]
    rec = await reclaimer("enforce")
    try:
        await cycle_until(rec, "eviction", lambda: gone(ns, "trainer"))
        marked = [e["object"]["metadata"] for e in ns.api.watch(
                  ns.path() + "?fieldSelector=metadata.name%3Dtrainer", before)
                  if "deletionTimestamp" in e["object"]["metadata"]]
        assert marked[0]["deletionGracePeriodSeconds"] == 600
    finally:
        ns.api.merge_patch(ns.path("pods", "trainer"), {"metadata": {"finalizers": None}})
        ns.api.delete(ns.path("pods", "trainer"), {"gracePeriodSeconds": 0})


def guarded(ns, name: str, node: str) -> None:
    """A due idle pod whose PodDisruptionBudget allows no eviction, running."""
    ns.create_pod(due_pod(name, node=node, labels={"app": name}))
    ns.api.create(f"/apis/policy/v1/namespaces/{ns.name}/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}}})
    ns.running(name)


async def test_a_pdb_blocks_eviction_until_it_is_relaxed(ns, reclaimer):
    guarded(ns, "guarded", "h100-0")
    rec = await reclaimer("enforce")
    await cycle_until(rec, "a blocked eviction", lambda: "GPUReclaimBlocked" in
                      reasons(ns, "guarded"))
    assert not gone(ns, "guarded")
    assert ns.pod("guarded")["status"]["phase"] == "Running"
    ns.api.merge_patch(f"/apis/policy/v1/namespaces/{ns.name}/poddisruptionbudgets/guarded",
                       {"spec": {"minAvailable": 0}})
    await cycle_until(rec, "eviction once the PDB allows it", lambda: gone(ns, "guarded"))


def job_pods(ns, job: str) -> list[dict]:
    return [p for p in ns.pods() if p["metadata"].get("labels", {}).get("job-name") == job
            and "deletionTimestamp" not in p["metadata"]]


def idle_job(ns, name: str, node: str) -> str:
    """A one-pod Job on ``node`` whose GPU reads idle, once its pod runs; its path."""
    template = gpu_pod("x", 1, util="0", node=node)
    template["spec"]["restartPolicy"] = "Never"
    ns.api.create(f"/apis/batch/v1/namespaces/{ns.name}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": {
            "metadata": {"annotations": template["metadata"]["annotations"]},
            "spec": template["spec"]}}})
    wait_for("the Job's pod to run", lambda: any(
        p["status"].get("phase") == "Running" for p in job_pods(ns, name)))
    return f"/apis/batch/v1/namespaces/{ns.name}/jobs/{name}"


async def test_an_idle_job_is_suspended_and_its_pods_go_away(ns, reclaimer):
    job_path = idle_job(ns, "train", "h100-1")
    rec = await reclaimer("enforce")
    await cycle_until(rec, "Job suspended", lambda: ns.api.get(job_path)["spec"].get("suspend"))
    wait_for("the Job's pods to go away", lambda: not job_pods(ns, "train"), timeout=60)


def deployment(ns, name: str, replicas: int, node: str) -> str:
    pod = gpu_pod("x", 1, util="0", node=node, labels={"app": name})
    ns.api.create(f"/apis/apps/v1/namespaces/{ns.name}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name},
                                           "annotations": pod["metadata"]["annotations"]},
                              "spec": pod["spec"]}}})
    return f"/apis/apps/v1/namespaces/{ns.name}/deployments/{name}"


def running_pods(ns, app: str) -> list[dict]:
    return [p for p in ns.pods() if p["metadata"].get("labels", {}).get("app") == app
            and p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]]


async def test_an_idle_deployment_is_scaled_to_zero_and_restored(sandbox, ns, reclaimer):
    path = deployment(ns, "serve", 2, "a100-0")
    wait_for("2 replicas running", lambda: len(running_pods(ns, "serve")) == 2)
    rec = await reclaimer("enforce")
    await cycle_until(rec, "scaled to zero", lambda: ns.api.get(path)["spec"]["replicas"] == 0)
    assert ns.api.get(path)["metadata"]["annotations"][REPLICAS_BEFORE] == "2"
    [recorded] = stop_entries(ns)  # gpusteward's own record, which restore trusts
    assert (recorded["kind"], recorded["name"], recorded["replicas"], recorded["uid"]) == (
        "Deployment", "serve", 2, ns.api.get(path)["metadata"]["uid"])
    wait_for("its pods to go away", lambda: not running_pods(ns, "serve"), timeout=60)
    out = restore(sandbox.kubeconfig, f"{ns.name}/Deployment/serve")
    assert out.returncode == 0, out.stderr
    restored = ns.api.get(path)
    assert restored["spec"]["replicas"] == 2
    assert REPLICAS_BEFORE not in (restored["metadata"].get("annotations") or {})
    assert stop_entries(ns) == []  # restored: its entry goes
    wait_for("replicas back", lambda: len(running_pods(ns, "serve")) == 2)


async def test_a_partly_idle_deployment_is_only_marked(ns, reclaimer):
    path = deployment(ns, "mixed", 2, "a100-1")
    wait_for("2 replicas running", lambda: len(running_pods(ns, "mixed")) == 2)
    busy, idle = [p["metadata"]["name"] for p in running_pods(ns, "mixed")]
    ns.api.merge_patch(ns.path("pods", busy), {"metadata": {"annotations": {
        "sandbox.gpusteward.io/gpu-util": "75"}}})
    rec = await reclaimer("enforce")
    await cycle_until(rec, "the idle replica warned", lambda: RECLAIM_AT in annotations(ns, idle))
    await cycle_for(rec, 8)  # well past the 4 s grace
    assert ns.api.get(path)["spec"]["replicas"] == 2
    assert len(running_pods(ns, "mixed")) == 2


async def test_a_protected_priority_pod_is_never_touched(ns, reclaimer):
    ns.create_pod(gpu_pod("vip", 1, node="h100-0", util="0", priority_class="gpu-critical"))
    ns.running("vip")
    before = ns.pod("vip")["metadata"]["resourceVersion"]
    rec = await reclaimer("enforce")
    await cycle_for(rec, 25)  # longer than window + grace
    after = ns.pod("vip")
    assert after["metadata"]["resourceVersion"] == before
    assert "deletionTimestamp" not in after["metadata"]
    assert not [r for r in reasons(ns, "vip") if r.startswith("GPU")]


async def test_a_pending_pod_gets_exactly_the_right_idle_pod_reclaimed(ns, reclaimer,
                                                                      scheduler_with):
    # Queue enforcement alone: with DefaultPreemption on the scheduler would act first
    # (tests/e2e/test_preemption.py shows the two together).
    scheduler_with(preemption=False)
    # l4-0: idle, low priority. l4-1: idle, high priority. l4-2: busy. All L4 GPUs are taken.
    ns.create_pod(gpu_pod("low-idle", 4, node="l4-0", util="0", priority_class="gpu-low"))
    ns.create_pod(gpu_pod("high-idle", 4, node="l4-1", util="0", priority_class="gpu-high"))
    ns.create_pod(gpu_pod("busy", 4, node="l4-2", util="90", priority_class="gpu-low"))
    for name in ("low-idle", "high-idle", "busy"):
        ns.running(name)
    ns.create_pod(gpu_pod("urgent", 4, cards="NVIDIA-L4", priority_class="gpu-mid"))
    wait_for("the scheduler to find no room", lambda: any(
        c.get("reason") == "Unschedulable"
        for c in ns.pod("urgent")["status"].get("conditions", [])))
    rec = await reclaimer("enforce")
    await cycle_until(rec, "the low-priority idle pod reclaimed", lambda: gone(ns, "low-idle"))
    assert ns.node_of("urgent", timeout=90) == "l4-0"
    assert not gone(ns, "high-idle") and not gone(ns, "busy")
    assert "GPUReclaimed" not in reasons(ns, "high-idle")


async def test_an_over_quota_team_is_reclaimed_before_a_within_quota_team(api, ns, reclaimer):
    # vision's quota is 2 GPUs: v-new (created last) takes it to 3, so it is borrowed.
    # nlp (quota 8) is within its quota and waits for the longer 30 s window.
    vision, nlp = {"gpusteward.io/team": "vision"}, {"gpusteward.io/team": "nlp"}
    ns.create_pod(gpu_pod("v-old", 1, node="h100-0", util="0", labels=vision))
    ns.running("v-old")
    time.sleep(1.1)  # creationTimestamp has second resolution: v-old must be strictly older
    ns.create_pod(gpu_pod("v-new", 2, node="h100-0", util="0", labels=vision))
    ns.create_pod(gpu_pod("n-1", 1, node="h100-1", util="0", labels=nlp))
    for name in ("v-new", "n-1"):
        ns.running(name)
    rec = await reclaimer("enforce")
    await cycle_until(rec, "the borrowed pod reclaimed", lambda: gone(ns, "v-new"))
    assert not gone(ns, "n-1") and not gone(ns, "v-old")


async def test_nothing_is_reclaimed_while_prometheus_is_down(sandbox, ns, reclaimer):
    ns.create_pod(due_pod("idle", node="h100-0"))
    ns.running("idle")
    rec = await reclaimer("enforce")
    sandbox.stop_component("prometheus")
    try:
        for _ in range(3):
            decided = await rec.cycle()
            assert decided.halted and decided.actions == ()
        assert not gone(ns, "idle")
    finally:
        sandbox.start_prometheus()


async def test_observe_mode_leaves_the_cluster_unchanged(ns, reclaimer):
    ns.create_pod(gpu_pod("idle", 1, node="h100-0", util="0"))
    ns.create_pod(due_pod("due", node="h100-0"))
    for name in ("idle", "due"):
        ns.running(name)
    versions = {n: ns.pod(n)["metadata"]["resourceVersion"] for n in ("idle", "due")}
    rec = await reclaimer("observe")
    await cycle_for(rec, 20)
    assert {n: ns.pod(n)["metadata"]["resourceVersion"] for n in versions} == versions
    assert not [r for n in versions for r in reasons(ns, n) if r.startswith("GPU")]
    skipped = rec.metrics.actions.labels("reclaim", "idle", ns.name, "skipped")._value.get()
    assert skipped >= 1  # decided, logged and counted: only not carried out


def _leader(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("gpusteward_reclaimer_leader "):
                return float(line.split()[1])
    return -1.0


def test_two_replicas_never_both_act(sandbox, ns, tmp_path):
    ns.create_pod(due_pod("idle", node="h100-0"))
    ns.running("idle")
    ports = [free_port(), free_port()]
    procs = [Proc(f"reclaimer-{i}", sandbox.reclaimer_argv(port, name="e2e-ha"),
                  tmp_path / f"reclaimer-{i}.log").start() for i, port in enumerate(ports)]
    try:
        wait_for("one leader", lambda: sorted(_leader(p) for p in ports) == [0.0, 1.0],
                 timeout=60)
        wait_for("the idle pod reclaimed", lambda: gone(ns, "idle"), timeout=60)
        time.sleep(4)  # several more cycles of both replicas
        assert sorted(_leader(p) for p in ports) == [0.0, 1.0]
        assert reasons(ns, "idle").count("GPUReclaimed") == 1
        logs = [p.log.read_text() for p in procs]
        assert sum("leading as" in log for log in logs) == 1
        lease = sandbox.api().get("/apis/coordination.k8s.io/v1/namespaces/kube-system/"
                                  "leases/e2e-ha")
        assert lease["spec"]["holderIdentity"]
    finally:
        for p in procs:
            p.stop()
