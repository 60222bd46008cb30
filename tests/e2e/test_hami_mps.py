"""GPUs shared through HAMi and through MPS on the sandbox's real control plane: placed, judged,
reclaimed and billed by the share each pod holds.

* HAMi: a node as HAMi's device plugin leaves it (no GFD labels; allocatable 2 GPUs x split 4;
  ``hami.io/node-nvidia-register``, gpusteward.sandbox.hami cites the source), its vGPU
  monitor's per-container series (gpusteward.sandbox.hamimon) scraped as a ServiceMonitor
  with a ``node`` relabeling scrapes them, and HAMi's scheduler as its chart runs it: a
  kube-scheduler of its own (profile ``hami-scheduler``) with deploy/scheduler/hami-scheduler-
  config.yaml, calling gpusteward's extender and then a stand-in for HAMi's
  (gpusteward.sandbox.hamisched, HAMi's filter and bind wire shape). What is proven: that
  configuration against the real kube-scheduler and gpusteward's real extender; HAMi's device
  choice itself is the stand-in's, not HAMi's.
* MPS: a node as GFD labels one under the device plugin's ``sharing.mps`` (replicas 4,
  ``sharing-strategy: mps``, ``-SHARED``; NVIDIA/k8s-device-plugin internal/lm/resource.go).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from gpusteward.core import hami
from gpusteward.core.model import TEAM_LABEL
from gpusteward.core.reclaim.model import IDLE_SINCE
from gpusteward.sandbox import dra
from gpusteward.sandbox.cluster import SANDBOX_POLICY, Sandbox
from gpusteward.sandbox.fleet import HamiSpec, Pool, TaintSpec
from gpusteward.sandbox.hami import BIND_PHASE, GPU_POLICY, NODE, SCHEDULER_NAME, uuid
from gpusteward.sandbox.kubehttp import wait_for
from gpusteward.sandbox.simulator import HAMI_MONITOR_ANNOTATION
from tests.e2e.kube import (
    Namespace,
    annotations,
    apply_priority_classes,
    cycle_until,
    events,
    gone,
    gpu_pod,
    wait_for_gpu_samples,
)
from tests.e2e.scenarios import Workload

HAMI = Pool(name="h100-hami", product="NVIDIA-H100-80GB-HBM3", count=1, gpus=2,
            memory_mi_b=81559, hami=HamiSpec(split=4))
HAMI_NODE = "h100-hami-0"
MPS_TAINT = "sandbox.gpusteward.io/mps"
MPS = Pool(name="l4-mps", product="NVIDIA-L4", count=1, gpus=2, memory_mi_b=23034, replicas=4,
           sharing="mps", taints=[TaintSpec(key=MPS_TAINT, effect="NoSchedule")])
MPS_NODE = "l4-mps-0"


@pytest.fixture(scope="module")
def shared_pools(sandbox: Sandbox) -> Iterator[Sandbox]:
    for pool in (HAMI, MPS):
        sandbox.add_pool(pool)
    sandbox.start_hami_scheduler()
    try:
        yield sandbox
    finally:
        sandbox.stop_hami_scheduler()
        for pool in (HAMI, MPS):
            sandbox.remove_pool(pool.name)


@pytest.fixture
def team_ns(api) -> Iterator[Namespace]:
    """A namespace named for a team of its own, so the report's team row is this test's."""
    ns = Namespace(api, f"hami-{secrets.token_hex(3)}")
    ns.create()
    yield ns
    ns.delete()


def hami_pod(name: str, *, cores: int, util: str, mem: int | None = 8192,
             cards: str | None = None, **annotations: str) -> dict:
    """A pod for HAMi's scheduler, asking one vGPU with ``mem`` MiB (None: neither memory nor
    percentage, so the whole card's) and ``cores`` percent, its devices binpacked."""
    pod = gpu_pod(name, 1, util=util, cards=cards,
                  annotations={GPU_POLICY: "binpack", **annotations})
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    limits["nvidia.com/gpucores"] = str(cores)
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    pod["spec"]["schedulerName"] = SCHEDULER_NAME
    return pod


def test_hami_places_on_the_nodes_gpustewards_filter_kept(shared_pools, ns):
    ns.create_pod(hami_pod("h100", cores=30, util="0", cards="NVIDIA-H100*"))
    assert ns.node_of("h100") == HAMI_NODE
    notes = annotations(ns, "h100")
    [placed] = hami.slices(notes)
    assert placed.uuid in {uuid(HAMI_NODE, 0), uuid(HAMI_NODE, 1)}
    assert (placed.mem_mib, placed.cores) == (8192, 30)
    assert notes[NODE] == HAMI_NODE
    wait_for("HAMi's bind to finish", lambda: annotations(ns, "h100").get(BIND_PHASE) ==
             "success", timeout=30)
    # A card only other nodes have: gpusteward's filter leaves HAMi no node, so HAMi writes
    # nothing on the pod, and the pod waits with both extenders' reasons.
    ns.create_pod(hami_pod("a100", cores=30, util="0", cards="NVIDIA-A100*"))
    wait_for("a100 to be found unschedulable",
             lambda: any(r == "FailedScheduling" for r, _ in events(ns, "a100")), timeout=60)
    assert NODE not in annotations(ns, "a100")
    assert ns.pod("a100")["spec"].get("nodeName") is None


async def test_hami_pods_are_judged_by_their_own_use_reclaimed_and_billed_by_share(
        shared_pools, team_ns, reclaimer):
    ns = team_ns
    # Device 0: loud (50 % of its cores, busy), quiet (30 %, idle), mute (20 %, no series of
    # its own). Device 1: alone, asking neither memory nor cores' share below 100: the whole
    # card, idle, the only pod there, judged by the device.
    for name, cores, util, extra in (("loud", 50, "70", {}), ("quiet", 30, "1", {}),
                                     ("mute", 20, "0", {HAMI_MONITOR_ANNOTATION: "off"})):
        ns.create_pod(hami_pod(name, cores=cores, util=util, **extra))
        assert ns.node_of(name) == HAMI_NODE
    ns.create_pod(hami_pod("alone", cores=100, util="2", mem=None))
    assert ns.node_of("alone") == HAMI_NODE
    devices = {n: hami.slices(annotations(ns, n))[0].uuid for n in ("loud", "quiet", "mute",
                                                                    "alone")}
    assert devices["loud"] == devices["quiet"] == devices["mute"] != devices["alone"]
    for name in devices:
        ns.running(name)
    wait_for_gpu_samples(shared_pools.prometheus_url, ns.name, ["loud", "quiet"],
                         metric="hami_container_device_utilization_ratio")
    billed = Workload(shared_pools, ns, ns.name, SANDBOX_POLICY).json("team")
    [row] = [g for g in billed["groups"] if g["name"] == ns.name]
    assert row["allocated"] == pytest.approx(0.5 + 0.3 + 0.2 + 1.0)
    rec = await reclaimer("enforce")
    await cycle_until(rec, "quiet and alone reclaimed",
                      lambda: gone(ns, "quiet") and gone(ns, "alone"), 120)
    assert not gone(ns, "loud") and not gone(ns, "mute")
    assert IDLE_SINCE not in annotations(ns, "loud")
    assert IDLE_SINCE not in annotations(ns, "mute")  # unknown: never marked idle


async def test_an_mps_replica_is_placed_judged_reclaimed_and_billed_as_a_quarter(
        shared_pools, team_ns, reclaimer):
    ns = team_ns
    # the -SHARED product names the MPS node alone (the plain L4 nodes match NVIDIA-L4)
    ns.create_pod(gpu_pod("replica", 1, util="0", cards="NVIDIA-L4-SHARED", tolerate=MPS_TAINT))
    assert ns.node_of("replica") == MPS_NODE
    node = shared_pools.api().get(f"/api/v1/nodes/{MPS_NODE}")["metadata"]["labels"]
    assert (node["nvidia.com/gpu.sharing-strategy"], node["nvidia.com/gpu.product"]) == (
        "mps", "NVIDIA-L4-SHARED")
    ns.running("replica")
    wait_for_gpu_samples(shared_pools.prometheus_url, ns.name, ["replica"])
    billed = Workload(shared_pools, ns, ns.name, SANDBOX_POLICY).json("team")
    [row] = [g for g in billed["groups"] if g["name"] == ns.name]
    assert row["allocated"] == pytest.approx(0.25)
    rec = await reclaimer("enforce")
    await cycle_until(rec, "the idle replica reclaimed", lambda: gone(ns, "replica"), 90)



async def test_an_idle_slice_is_freed_for_a_waiting_pod_no_gpu_has_cores_for(
        shared_pools, ns, reclaimer):
    """vGPU slots are left on both GPUs, but no GPU has the 50 % of its cores the waiting pod
    asks; reclaiming the idle 60 % slice gives it one. Same priority as the slice (the
    scheduler's own preemption takes only lower ones): the queue claims it because its team
    (vision, quota 2 GPUs in sandbox/policy.yaml) borrows beyond its quota, counted in shares,
    and the waiting pod's (nlp) is within its own (docs/policy.md, "queue")."""
    apply_priority_classes(ns.api, {"gpu-mid": 5000})
    vision, nlp = {TEAM_LABEL: "vision"}, {TEAM_LABEL: "nlp"}
    ns.create_pod(gpu_pod("vision-base", 2, node="h100-0", util="90", labels=vision,
                          priority_class="gpu-mid"))  # vision's quota, filled first
    ns.running("vision-base")
    for name, cores, util, team in (("idle-60", 60, "0", vision), ("busy-40", 40, "80", nlp),
                                    ("busy-whole", 100, "80", nlp)):
        pod = hami_pod(name, cores=cores, util=util, mem=8192 if cores < 100 else None)
        pod["metadata"]["labels"] |= team
        pod["spec"]["priorityClassName"] = "gpu-mid"
        ns.create_pod(pod)
        ns.running(name)
    wait_for_gpu_samples(shared_pools.prometheus_url, ns.name, ["idle-60", "busy-40"],
                         metric="hami_container_device_utilization_ratio")
    urgent = hami_pod("urgent", cores=50, util="80")
    urgent["metadata"]["labels"] |= nlp
    urgent["spec"]["priorityClassName"] = "gpu-mid"
    ns.create_pod(urgent)
    wait_for("urgent to be unschedulable", lambda: any(
        c.get("reason") == "Unschedulable" for c in ns.pod("urgent")["status"].get(
            "conditions") or []), timeout=60)
    rec = await reclaimer("enforce")
    await cycle_until(rec, "idle-60 reclaimed for urgent", lambda: gone(ns, "idle-60"), 90)
    seen = events(ns, "idle-60")
    assert any("for pending" in message and "urgent" in message
               for reason, message in seen if reason == "GPUReclaimed"), "\n".join(
        map(str, seen + events(ns, "urgent")))
    assert ns.running("urgent", timeout=90)["spec"]["nodeName"] == HAMI_NODE
    assert not gone(ns, "busy-40") and not gone(ns, "busy-whole")


def test_a_device_class_serving_nvidia_gpu_leaves_hami_pods_unplaceable(shared_pools, ns):
    """The pitfall docs/install.md ("HAMi") warns of, on the real kube-scheduler v1.36.3: with a
    DeviceClass whose extendedResourceName is nvidia.com/gpu, the DynamicResources plugin finds
    that no node offers nvidia.com/gpucores ("cannot fit resource"); without it the pod places."""
    api = shared_pools.api()
    [gpu_class] = [c for c in dra.device_classes() if c["spec"].get("extendedResourceName")]
    path = f"{dra.RESOURCE_API}/deviceclasses/{gpu_class['metadata']['name']}"
    api.apply(path, gpu_class)
    try:
        ns.create_pod(hami_pod("stuck", cores=10, util="0"))
        wait_for("stuck to be found unschedulable", lambda: any(
            "cannot fit resource" in message for reason, message in events(ns, "stuck")
            if reason == "FailedScheduling"), timeout=60)
        assert ns.pod("stuck")["spec"].get("nodeName") is None
    finally:
        api.delete(path)
    ns.create_pod(hami_pod("placed", cores=10, util="0"))
    assert ns.node_of("placed") == HAMI_NODE
