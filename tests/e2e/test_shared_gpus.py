"""Time-sliced and MIG GPUs in the sandbox: the extender and the reclaimer against the real
kube-scheduler, API server and Prometheus.

The default fleet's `t4-0` is 2 Tesla T4s time-sliced 4 ways (allocatable nvidia.com/gpu 8,
product `Tesla-T4-SHARED`, tainted `gpusteward.io/time-sliced`); `a100-mig-0` is 2 A100s under
the MIG mixed strategy (allocatable nvidia.com/mig-1g.10gb 14). The simulator reports them as
dcgm-exporter does: one series per physical time-sliced GPU, one per MIG instance without
DCGM_FI_DEV_GPU_UTIL, or with a 0 where the node is labelled so (NVIDIA/dcgm-exporter#216).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gpusteward.core.reclaim.model import IDLE_SINCE
from gpusteward.sandbox.fleet import MIG_GPU_UTIL_LABEL, XID_GPUS_LABEL, XID_LABEL
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e.kube import annotations, cycle_until, gone, gpu_pod, wait_for_gpu_samples

T4, MIG = "t4-0", "a100-mig-0"
TIME_SLICED = "gpusteward.io/time-sliced"
SLICE = "nvidia.com/mig-1g.10gb"


def extender(box, verb: str, pod: dict, node: str):
    body = json.dumps({"Pod": pod, "NodeNames": [node]}).encode()
    req = urllib.request.Request(f"{box.extender_url}/{verb}", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.load(resp)


def t4_fits(box, replicas: int) -> bool:
    reply = extender(box, "filter", gpu_pod("probe", replicas, tolerate=TIME_SLICED), T4)
    return bool(reply["NodeNames"] == [T4])


@contextmanager
def labelled(box, node: str, labels: dict[str, str]) -> Iterator[None]:
    api, path = box.api(), f"/api/v1/nodes/{node}"
    api.merge_patch(path, {"metadata": {"labels": labels}})
    try:
        yield
    finally:
        api.merge_patch(path, {"metadata": {"labels": dict.fromkeys(labels)}})


@pytest.mark.parametrize("gpu_util", ["absent", "zero"])
async def test_a_busy_mig_pod_is_never_reclaimed_and_an_idle_one_is(sandbox, ns, reclaimer,
                                                                    gpu_util):
    with labelled(sandbox, MIG, {MIG_GPU_UTIL_LABEL: gpu_util}):
        for name, util in (("busy", "80"), ("idle", "0")):
            ns.create_pod(gpu_pod(name, 1, node=MIG, util=util, resource=SLICE))
        for name in ("busy", "idle"):
            assert ns.running(name)["spec"]["nodeName"] == MIG
        rec = await reclaimer("enforce")
        await cycle_until(rec, "the idle MIG pod reclaimed", lambda: gone(ns, "idle"), 120)
        assert not gone(ns, "busy")
        assert IDLE_SINCE not in annotations(ns, "busy")


def test_mig_pods_are_placed_by_the_extender_on_the_mig_node(sandbox, ns):
    """The scheduler sends nvidia.com/mig-* pods to the extender (managedResources) and the
    node offers them; a pod asking for the plain A100 card lands there too."""
    ns.create_pod(gpu_pod("slice", 2, resource=SLICE, cards="NVIDIA-A100-SXM4-80GB"))
    assert ns.node_of("slice") == MIG


def test_a_saturated_time_sliced_node_is_scored_hot(sandbox, ns):
    """5 replicas at 100 %: both physical T4s saturated. Divided by the 8 replicas it would read
    25 % used; per physical GPU it reads 100 %, so a coolness-only class scores it 0."""
    for i in range(5):
        ns.create_pod(gpu_pod(f"hot{i}", 1, node=T4, util="100", tolerate=TIME_SLICED))
    for i in range(5):
        ns.running(f"hot{i}")
    wait_for_gpu_samples(sandbox.prometheus_url, ns.name, ["hot0", "hot4"])
    probe = gpu_pod("probe", 1, cls="interactive", tolerate=TIME_SLICED)
    assert extender(sandbox, "prioritize", probe, T4) == [{"Host": T4, "Score": 0}]


def test_a_time_sliced_pod_asking_for_the_plain_card_lands_on_the_shared_node(sandbox, ns):
    ns.create_pod(gpu_pod("t4", 1, cards="Tesla-T4", tolerate=TIME_SLICED))
    assert ns.node_of("t4") == T4


def test_a_lost_time_sliced_gpu_takes_all_its_replicas_out_of_filter_capacity(sandbox):
    assert t4_fits(sandbox, 5)
    with labelled(sandbox, T4, {XID_LABEL: "79", XID_GPUS_LABEL: "1"}):
        wait_for("the extender to see GPU 1 lost", lambda: not t4_fits(sandbox, 5), timeout=30)
        assert t4_fits(sandbox, 4)  # GPU 0's 4 replicas are still there
    wait_for(f"{T4} healthy again", lambda: t4_fits(sandbox, 5), timeout=90)
