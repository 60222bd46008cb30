"""GPUs HAMi slices: the node's registered devices, each pod's slices, the share a pod holds, and
who a device series speaks for -- over the shapes HAMi writes.

Shapes, from github:Project-HAMi/HAMi at v2.10.0 (4707fb0) unless named:
* pod ``hami.io/vgpu-devices-allocated``: ``pkg/device/devices.go`` EncodeContainerDevices /
  EncodePodSingleDevice (every device ended by ``:``, every container, empty ones too, by ``;``,
  init containers first); the repo's own fixtures ``GPU-init1,NVIDIA,500,10:;;`` and
  ``;;GPU-main1,NVIDIA,2000,50:;`` (``pkg/device-plugin/nvidiadevice/nvinternal/plugin/
  util_test.go``) and ``docs/develop/protocol.md``'s example;
* node ``hami.io/node-nvidia-register``: MarshalNodeDevices' JSON (every field omitempty, so a
  first device has no ``index``), the fixture of ``pkg/scheduler/scheduler_test.go``, and the
  colon/comma form of v2.7.0's EncodeNodeDevices (``docs/develop/protocol.md``);
* allocatable ``nvidia.com/gpu`` = GPUs x deviceSplitCount (chart default 10).
"""

from __future__ import annotations

import msgspec
import pytest

from gpusteward.core import hami
from gpusteward.core.attribution import Attribution
from gpusteward.core.kubewire import WireNode, to_node
from gpusteward.core.model import Node
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.quota import borrowed, usage
from gpusteward.core.report.facts import pod_usages
from gpusteward.core.report.model import ReportInput, Window
from gpusteward.core.scoring import Demand, filter_node
from gpusteward.core.sharing import (
    devices_held,
    node_physical_gpus,
    pod_share,
    pod_shares,
    replicas,
)
from gpusteward.reclaimer.metrics import ReclaimerMetrics
from tests.factories import H100, NOW, readings, state
from tests.unit.test_reclaim_decide import POLICY, gpu_pod, idle, pending, snapshot

UUID_A = "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76"
UUID_B = "GPU-0fc3c4b8-2a1e-47a5-9d5b-3b3c0b9e2f11"
# MarshalNodeDevices of two H100s: the first's index 0 and the second's health false omitted.
REGISTER = (
    f'[{{"id":"{UUID_A}","count":10,"devmem":81559,"devcore":100,'
    '"type":"NVIDIA H100 80GB HBM3","mode":"hami-core","health":true},'
    f'{{"id":"{UUID_B}","index":1,"count":10,"devmem":81559,"devcore":100,'
    '"type":"NVIDIA H100 80GB HBM3","numa":1,"mode":"hami-core"}]')
# v2.7.0's EncodeNodeDevices: id,count,devmem,devcore,type,numa,health,index,mode then ':'.
LEGACY_REGISTER = (f"{UUID_A},10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true,0,hami-core:"
                   f"{UUID_B},10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true,1,hami-core:")


def hami_node(name: str = "n1", register: str = REGISTER, labels: dict | None = None):
    wire = {"metadata": {"name": name, "labels": labels or {},
                         "annotations": {hami.NODE_REGISTER: register}},
            "status": {"allocatable": {"nvidia.com/gpu": "20"}}}
    return to_node(msgspec.convert(wire, WireNode), ["nvidia.com/gpu"])


def sliced(name: str, allocated: str, gpus: int = 1, **kw):
    return gpu_pod(name, gpus=gpus, annotations={hami.ALLOCATED: allocated}, **kw)


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        pytest.param(f"{UUID_A},NVIDIA,1024,30:;;", [(UUID_A, "NVIDIA", 1024, 30)],
                     id="one-gpu-container-and-one-without"),
        pytest.param("GPU-init1,NVIDIA,500,10:;;", [("GPU-init1", "NVIDIA", 500, 10)],
                     id="plugin-fixture-init-container"),
        pytest.param(";;GPU-main1,NVIDIA,2000,50:;", [("GPU-main1", "NVIDIA", 2000, 50)],
                     id="plugin-fixture-after-empty-containers"),
        pytest.param("GPU-a,NVIDIA,500,3:GPU-b,NVIDIA,500,3:;",
                     [("GPU-a", "NVIDIA", 500, 3), ("GPU-b", "NVIDIA", 500, 3)],
                     id="two-devices-in-one-container"),
        pytest.param(";;", [], id="served-to-allocate-left-empty"),
        pytest.param("GPU-a,NVIDIA,lots,3:;", [], id="not-a-number"),
        pytest.param("GPU-a,NVIDIA:;", [], id="too-few-fields"),
    ],
)
def test_the_slices_of_a_pods_allocation(text, wanted):
    assert [tuple(s) for s in hami.slices({hami.ALLOCATED: text})] == wanted


@pytest.mark.parametrize(
    ("register", "devices"),
    [
        pytest.param(REGISTER, [(UUID_A, 10, 81559, 100), (UUID_B, 10, 81559, 100)],
                     id="json-v2.8-and-later"),
        pytest.param('[{"id":"GPU-0","count":10,"devmem":8192,"devcore":100,'
                     '"type":"NVIDIA-A100","numa":0,"health":true,"index":0,'
                     '"mode":"hami-core"}]', [("GPU-0", 10, 8192, 100)],
                     id="scheduler-test-fixture"),
        pytest.param(LEGACY_REGISTER, [(UUID_A, 10, 32768, 100), (UUID_B, 10, 32768, 100)],
                     id="colon-comma-v2.7"),
        pytest.param("[{not json", [], id="broken-json"),
        pytest.param("GPU-a,ten,1,1,x:", [], id="broken-legacy"),
    ],
)
def test_a_nodes_registered_devices(register, devices):
    got = hami.node_devices(register)
    assert [(d.id, d.count, d.devmem, d.devcore) for d in got] == devices


def test_a_hami_node_counts_its_physical_gpus_and_names_its_card_without_gfd():
    n = hami_node()
    assert (n.gpus, replicas(n), node_physical_gpus(n)) == (20, 10, 2.0)
    assert n.product == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert hami_node(register=LEGACY_REGISTER).product == "Tesla-V100-PCIE-32GB-SHARED"


def test_a_gfd_product_label_wins_over_the_registered_type():
    labelled = hami_node(labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    assert labelled.product == "NVIDIA-H100-80GB-HBM3"


@pytest.mark.parametrize(
    ("allocated", "share"),
    [
        pytest.param(f"{UUID_A},NVIDIA,1024,30:;", 0.30, id="cores-first"),
        pytest.param(f"{UUID_A},NVIDIA,20389,0:;", 20389 / 81559, id="memory-without-cores"),
        pytest.param(f"{UUID_A},NVIDIA,81559,100:;", 1.0, id="neither-asked-whole-gpu"),
        pytest.param(f"{UUID_A},NVIDIA,1024,30:{UUID_B},NVIDIA,1024,30:;", 0.60,
                     id="two-slices"),
        pytest.param("GPU-elsewhere,NVIDIA,1024,0:;", 1.0, id="unknown-device-memory-whole"),
    ],
)
def test_a_hami_pod_holds_the_share_its_slices_give(allocated, share):
    n = hami_node()
    p = sliced("p", allocated)
    assert pod_share(p, n) == pytest.approx(share)


def test_a_pod_hami_did_not_place_counts_in_the_nodes_units():
    n = hami_node()
    assert pod_share(gpu_pod("plain", gpus=5), n) == pytest.approx(0.5)


def test_pricing_every_pod_at_once_gives_each_the_share_pod_share_gives():
    # pod_shares prices alike pods once: pods differing only in their allocation, in their node
    # or in their request must each still get their own share; a pending pod holds none.
    nodes = {"n1": hami_node(), "plain": Node("plain", H100, 8)}
    pods = [sliced("a", f"{UUID_A},NVIDIA,1024,30:;"), sliced("b", f"{UUID_A},NVIDIA,1024,60:;"),
            sliced("c", f"{UUID_A},NVIDIA,1024,30:;"), gpu_pod("d", gpus=5),
            gpu_pod("e", gpus=5, node="plain"), gpu_pod("f", gpus=2, node="plain"),
            gpu_pod("g", node=None)]
    shares = pod_shares(pods, nodes)
    assert shares == {p.uid: pytest.approx(pod_share(p, nodes[p.node]))
                      for p in pods if p.node is not None}
    assert [round(shares[u], 2) for u in "abcdef"] == [0.3, 0.6, 0.3, 0.5, 5.0, 2.0]


def test_each_slice_is_its_own_gpus_series():
    n = hami_node()
    two = sliced("p", f"{UUID_A},NVIDIA,1024,30:{UUID_B},NVIDIA,1024,30:;", gpus=2)
    assert devices_held(two, n) == 2


def test_a_device_series_speaks_for_the_one_pod_on_it_and_for_none_where_pods_share_it():
    alone = sliced("alone", f"{UUID_A},NVIDIA,1024,30:;")
    one = sliced("one", f"{UUID_B},NVIDIA,1024,30:;")
    two = sliced("two", f"{UUID_B},NVIDIA,2048,50:;")
    who = Attribution.of(["Hostname"], "auto", ["n1"], [alone, one, two])
    device = {"Hostname": "n1", "gpu": "0"}
    assert who.pod({**device, "UUID": UUID_A}) == alone.key
    assert who.pod({**device, "UUID": UUID_B}) is None
    # dcgm-exporter naming a pod on a shared GPU is not believed either
    assert who.pod({**device, "UUID": UUID_B, "exported_namespace": "ml",
                    "exported_pod": "one"}) is None
    # HAMi's own per-container series of the shared GPU is the pod's own use
    per_pod = {**device, "UUID": UUID_B, "vgpu": "hami", "exported_namespace": "ml",
               "exported_pod": "two"}
    assert who.pod(per_pod) == two.key


TEAMS = parse_policy({"teams": {"vision": {"quotaGpus": 1}}})


def test_quotas_count_the_share_a_hami_pod_holds():
    # three 30 % slices are 0.9 GPU: inside vision's quota of 1, where counting vGPUs made 3
    n = hami_node()
    pods = [sliced(f"v{i}", f"{UUID_A},NVIDIA,1024,30:;", labels={"gpusteward.io/team": "vision"},
                   age=1000 - i) for i in range(3)]
    nodes = {"n1": n}
    assert usage(pods, TEAMS, {}, pod_shares(pods, nodes))["vision"].used == pytest.approx(0.9)
    assert borrowed(pods, TEAMS, {}, {}, pod_shares(pods, nodes)) == set()
    fourth = sliced("v3", f"{UUID_B},NVIDIA,1024,30:;", labels={"gpusteward.io/team": "vision"},
                    age=10)
    assert borrowed([*pods, fourth], TEAMS, {}, {}, pod_shares([*pods, fourth], nodes)) == {
        fourth.uid}


def test_three_thirds_of_a_gpu_fill_a_quota_of_one_exactly():
    n = hami_node()
    pods = [sliced(f"v{i}", f"{UUID_A},NVIDIA,1024,0:;", labels={"gpusteward.io/team": "vision"})
            for i in range(3)]
    third = msgspec.structs.replace(n, vgpus=tuple(msgspec.structs.replace(d, devmem=3072)
                                                   for d in n.vgpus))
    assert not usage(pods, TEAMS, {}, pod_shares(pods, {"n1": third}))["vision"].over


def test_the_report_and_the_reclaimers_gauge_bill_the_share():
    n = hami_node()
    pods = [sliced("a", f"{UUID_A},NVIDIA,1024,30:;"), sliced("b", f"{UUID_A},NVIDIA,1024,20:;")]
    snap = snapshot(pods, nodes=[n])
    usages = pod_usages(ReportInput(snap, Window(NOW - 3600, NOW, 60), ()), POLICY)
    assert {u.name: u.gpus for u in usages} == pytest.approx({"a": 0.3, "b": 0.2})
    metrics = ReclaimerMetrics()
    metrics.observe(snap, plan(snap, POLICY), 1.0)
    held = [s.value for family in metrics.registry.collect() if family.name == "gpusteward_gpus"
            for s in family.samples if s.labels["state"] == "allocated"]
    assert held == pytest.approx([0.5])



# --- queue enforcement frees a share: a waiting pod needs cores and memory on one device -------

def waiting_for(cores: int, mem: int = 8192, vgpus: int = 1):
    return pending("want", vgpus, 1000, vgpu_asks=(hami.Ask.of(vgpus, mem, None, cores),))


def hami_queue(waiting, *victims):
    """GPU A: an idle low-priority 50 % slice and a busy 40 % one; GPU B: a busy whole card. Slots
    are plenty (10 - 2 and 10 - 1): counted in vGPU slots the waiting pod fits already. Beside
    it a free H100 HAMi does not manage, where HAMi never places the pod."""
    n = hami_node()
    pods = [sliced("idle-50", f"{UUID_A},NVIDIA,8192,50:;", priority=10),
            sliced("busy-40", f"{UUID_A},NVIDIA,8192,40:;", priority=10),
            sliced("busy-whole", f"{UUID_B},NVIDIA,81559,100:;", priority=10), *victims, waiting]
    ev = {p.key: idle() for p in pods}
    ev["ml/busy-40"] = ev["ml/busy-whole"] = idle(peak=90)
    return plan(snapshot(pods, ev, nodes=[n, Node("plain", H100, 8)]), POLICY)


def reclaimed_for_queue(p) -> list[str]:
    return [a.pod.name for a in p.actions if a.kind == "reclaim" and a.reason == "queue"]


def test_a_waiting_pod_gets_the_idle_slice_whose_cores_it_needs():
    # 30 % asked, 10 % free on A, none on B: only reclaiming idle-50 makes room
    assert reclaimed_for_queue(hami_queue(waiting_for(30))) == ["idle-50"]


def test_no_slice_is_reclaimed_where_freeing_it_would_not_make_room():
    # 70 % asked: A would have 60 % free without idle-50, B none; reclaiming helps no one
    assert reclaimed_for_queue(hami_queue(waiting_for(70))) == []


def test_a_waiting_pod_that_fits_in_the_cores_left_needs_no_reclaim():
    assert reclaimed_for_queue(hami_queue(waiting_for(10))) == []


def test_memory_counts_as_cores_do():
    # 5 % of the cores fit on A, 70,000 MiB do not (16,384 used of 81,559); without idle-50 they do
    assert reclaimed_for_queue(hami_queue(waiting_for(5, mem=70000))) == ["idle-50"]


def test_a_waiting_pods_asks_are_read_from_its_containers():
    from gpusteward.core.kubewire import WirePod, to_pod

    def container(**limits: str) -> dict:
        return {"name": "c", "resources": {"limits": limits}}

    wire = {"metadata": {"name": "p", "namespace": "ml", "uid": "u"}, "spec": {"containers": [
        container(**{"nvidia.com/gpu": "2", "nvidia.com/gpucores": "30",
                     "nvidia.com/gpumem": "4096"}),
        container(**{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}),
        container(cpu="1")]}}
    p = to_pod(msgspec.convert(wire, WirePod), ["nvidia.com/gpu"])
    assert p.vgpu_asks == (hami.Ask(2, 4096, 101, 30), hami.Ask(1, 0, 25, 0))
    assert p.gpus == 3
    # a plain GPU pod is HAMi's only where it names HAMi's scheduler (its webhook sets it)
    plain = {**wire, "spec": {"containers": [container(**{"nvidia.com/gpu": "1"})]}}
    assert to_pod(msgspec.convert(plain, WirePod), ["nvidia.com/gpu"]).vgpu_asks == ()
    plain["spec"]["schedulerName"] = "hami-scheduler"
    assert to_pod(msgspec.convert(plain, WirePod), ["nvidia.com/gpu"]).vgpu_asks == (
        hami.Ask(1, 0, 100, 0),)


# --- the extender's filter keeps only nodes HAMi's own filter could take -----------------------

def slice_demand(cores: int, mem: int = 8192) -> Demand:
    return Demand(gpus=1, card_patterns=(), class_name="batch",
                  vgpu_asks=(hami.Ask.of(1, mem, None, cores),))


def test_the_filter_keeps_a_hami_node_only_where_a_gpu_has_the_cores_and_memory():
    n = hami_node()
    on = [sliced("a", f"{UUID_A},NVIDIA,8192,70:;"), sliced("b", f"{UUID_B},NVIDIA,8192,90:;")]
    s = state(n, pods=on, gpu_readings=readings("n1", [0.5, 0.5]))
    assert filter_node(s, slice_demand(30)).ok  # GPU A has 30 % left
    fit = filter_node(s, slice_demand(31))
    assert not fit.ok and fit.resolvable and "cores and memory" in fit.reason
    assert not filter_node(s, slice_demand(10, mem=80000)).ok  # memory, on either GPU
    plain = filter_node(state(Node("n1", H100, 8)), slice_demand(10))
    assert not plain.ok and not plain.resolvable  # HAMi places it on its own nodes only
