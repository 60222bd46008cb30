"""The extender against a real Prometheus holding dcgm-exporter-shaped history, stored as a
Prometheus Operator ServiceMonitor scrape stores it, in both honorLabels modes.

The fleet is fed into the watch cache directly (this tier has no API server); telemetry comes
from Prometheus for real, through PrometheusSource.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpusteward.adapters.telemetry import PrometheusSource
from gpusteward.core.dcgm import PodRef
from gpusteward.core.fleet import FleetStore
from gpusteward.core.policy import parse_policy
from gpusteward.extender.app import Extender, create_app
from gpusteward.extender.view import PlacementView
from gpusteward.sandbox.scrape import DCGM_EXPORTER
from gpusteward.sandbox.simgpu import SimGpu, render_openmetrics_history
from tests.factories import A100, H100, L4, node, pod
from tests.support.prometheus import servicemonitor

H100_NAME = "NVIDIA H100 80GB HBM3"


def gpus_at(now: float, t: float) -> list[SimGpu]:
    """The fleet's GPUs at time t. l-stale stops reporting 3 minutes before now."""
    out = [SimGpu("h-hot", i, H100_NAME, util_percent=90 if i < 4 else 0,
                  pod=PodRef("ml", f"busy{i}", "main") if i < 4 else None) for i in range(8)]
    out += [SimGpu("h-cool", i, H100_NAME) for i in range(8)]
    out += [SimGpu("a-xid", i, "NVIDIA A100-SXM4-80GB", xid=79 if i == 0 else 0)
            for i in range(8)]
    if t < now - 180:
        out += [SimGpu("l-stale", i, "NVIDIA L4", util_percent=100) for i in range(4)]
    return out


def history(now: float, minutes: int = 10, step: float = 15.0, node_label: str = "Hostname",
            honor: bool = False, gpus=gpus_at, scrape=None):
    frames = []
    t = now - minutes * 60
    while t <= now - 5:
        frames.append((t, gpus(now, t)))
        t += step
    return render_openmetrics_history(frames, node_label=node_label,
                                      scrape=scrape or servicemonitor(honor))


def fleet() -> FleetStore:
    store = FleetStore()
    store.replace_all(
        [node("h-hot", H100), node("h-cool", H100), node("a-xid", A100),
         node("l-stale", L4, gpus=4), node("l-missing", L4, gpus=4)],
        [pod(f"busy{i}", node="h-hot", bound_at=time.time() - 3600) for i in range(4)],
    )
    return store


def training_pod(gpus: int, cards: str | None = None) -> dict:
    annotations = {"gpusteward.io/card-types": cards} if cards else {}
    return {"metadata": {"name": "t", "namespace": "ml", "labels": {"gpusteward.io/class":
                                                                    "training"},
                         "annotations": annotations},
            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


NAMES = ["h-hot", "h-cool", "a-xid", "l-stale", "l-missing"]


@pytest.fixture(scope="module")
def now() -> float:
    return time.time()


@pytest.fixture(scope="module", params=[False, True],
                ids=["honorLabels-false", "honorLabels-true"])
def honor(request) -> bool:
    return bool(request.param)


@pytest.fixture(scope="module")
def prometheus(module_prometheus_factory, now, honor):  # read only
    return module_prometheus_factory(history_openmetrics=history(now, honor=honor))


async def client_for(url: str, policy_data: dict | None = None):
    policy = parse_policy(policy_data or {})
    view = PlacementView(policy, fleet())
    source = PrometheusSource.at(url, policy.telemetry, policy.health, attempts=1,
                              locate=lambda: (view.fleet.nodes, view.fleet.pod_nodes()))  # serve.py
    extender = Extender(view, source)
    await extender.refresh()
    return extender, TestClient(TestServer(create_app(extender)))


async def post(client, verb: str, body: dict) -> bytes:
    resp = await client.post(f"/{verb}", data=json.dumps(body, separators=(",", ":")))  # as Go
    assert resp.status == 200
    return await resp.read()


async def test_prioritize_scores_live_telemetry_byte_for_byte(prometheus):
    _, client = await client_for(prometheus.url)
    async with client:
        body = await post(client, "prioritize", {"Pod": training_pod(1), "Nodes": None,
                                                 "NodeNames": NAMES})
    # card 3, coolness 2, packing 1, health 2 (see gpusteward/core/scoring.py):
    # h-hot  (3*1 + 2*0.55 + 5/8 + 2*1)/8 = 0.84 -> 8; h-cool (3 + 2 + 1/8 + 2)/8 = 0.89 -> 9
    # a-xid  (3*0.5 + 2 + 1/8 + 2*7/8)/8 = 0.67 -> 7
    # L4s    not a training tier, stale/missing telemetry -> neutral 0.5: (0 + 1 + 1/4 + 1)/8 -> 3
    assert body == (b'[{"Host":"h-hot","Score":8},{"Host":"h-cool","Score":9},'
                    b'{"Host":"a-xid","Score":7},{"Host":"l-stale","Score":3},'
                    b'{"Host":"l-missing","Score":3}]')


async def test_filter_names_mode_byte_for_byte(prometheus):
    _, client = await client_for(prometheus.url)
    async with client:
        body = await post(client, "filter", {
            "Pod": training_pod(8, "NVIDIA-H100*,NVIDIA-A100*"), "Nodes": None,
            "NodeNames": NAMES})
    wants = "(pod wants NVIDIA-H100*,NVIDIA-A100*)"
    assert body == (
        b'{"Nodes":null,"NodeNames":["h-cool"],'
        b'"FailedNodes":{"h-hot":"pod needs 8 healthy free GPUs, node has 4",'
        b'"a-xid":"pod needs 8 healthy free GPUs, node has 7 (unhealthy: gpu 0: XID 79)"},'
        b'"FailedAndUnresolvableNodes":{"l-stale":"card NVIDIA-L4 not accepted ' + wants.encode()
        + b'","l-missing":"card NVIDIA-L4 not accepted ' + wants.encode() + b'"},"Error":""}'
    )


async def test_filter_full_node_mode_returns_the_same_verdicts(prometheus):
    items = [{"metadata": {"name": n, "labels": {"nvidia.com/gpu.product": p}},
              "status": {"allocatable": {"nvidia.com/gpu": g}}}
             for n, p, g in [("h-cool", H100, "8"), ("a-xid", A100, "8"), ("l-stale", L4, "4")]]
    _, client = await client_for(prometheus.url)
    async with client:
        body = await post(client, "filter", {
            "Pod": training_pod(8, "NVIDIA-H100*,NVIDIA-A100*"),
            "Nodes": {"metadata": {}, "items": items}, "NodeNames": None})
    expected_nodes = json.dumps({"metadata": {}, "items": [items[0]]}, separators=(",", ":"))
    assert body.startswith(b'{"Nodes":' + expected_nodes.encode() + b',"NodeNames":null,')
    reply = json.loads(body)
    assert list(reply["FailedNodes"]) == ["a-xid"]
    assert list(reply["FailedAndUnresolvableNodes"]) == ["l-stale"]


async def test_a_refresh_runs_a_fixed_number_of_queries(prometheus):
    extender, client = await client_for(prometheus.url)
    source = extender.telemetry
    before = source.client.queries_run
    await extender.refresh()
    assert source.client.queries_run - before == len(source.queries) == 7


async def test_readings_carry_sample_time_and_pod_attribution(prometheus, now):
    extender, _ = await client_for(prometheus.url)
    readings = {r.gpu: r for r in extender.view.telemetry.for_node("h-hot")}
    assert readings["0"].pod == "ml/busy0"  # the workload's labels win in both modes
    # A free GPU names only the exporter's own pod, in either mode (the target's `pod`, or the
    # one Prometheus fills in); the node state drops it (that pod holds no GPU): it stays free.
    assert readings["7"].pod == "gpu-operator/" + DCGM_EXPORTER.pod("h-hot")
    state = extender.view.book.states["h-hot"]
    assert state.allocated == 4 and state.free == 4
    assert readings["0"].util == pytest.approx(0.9)
    assert now - 30 < readings["0"].sampled_at <= now
    stale = extender.view.telemetry.for_node("l-stale")
    assert stale and all(r.sampled_at < now - 170 for r in stale)
    assert extender.view.telemetry.for_node("l-missing") == ()


def old_exporter_gpus(now: float, t: float) -> list[SimGpu]:
    """An exporter without NODE_NAME: its Hostname is its own pod's name."""
    return [SimGpu(DCGM_EXPORTER.pod("h-cool"), i, H100_NAME, util_percent=80) for i in range(8)]


async def test_an_older_exporters_series_find_their_node_by_the_scrapes_node_label(
        prometheus_factory, now, honor):
    # NVIDIA/gpu-operator#472: Hostname="nvidia-dcgm-exporter-57pvc", node="aks-..." stored.
    prom = prometheus_factory(history_openmetrics=history(
        now, gpus=old_exporter_gpus, scrape=servicemonitor(
            honor, node_label="node", node_of={DCGM_EXPORTER.pod("h-cool"): "h-cool"})))
    extender, _ = await client_for(prom.url)
    assert [r.util for r in extender.view.telemetry.for_node("h-cool")] == [0.8] * 8
    assert extender.view.book.states["h-cool"].util == pytest.approx(0.8)


async def test_an_older_exporters_series_find_their_node_by_the_exporter_pods_node(
        prometheus_factory, now, honor):
    # No node label in the scrape: the watch saw the exporter pod (no GPU) bound to h-cool.
    prom = prometheus_factory(history_openmetrics=history(
        now, gpus=old_exporter_gpus, scrape=servicemonitor(
            honor, node_of={DCGM_EXPORTER.pod("h-cool"): "h-cool"})))
    policy = parse_policy({})
    view = PlacementView(policy, fleet())
    view.fleet.note_gpuless("uid-exporter", DCGM_EXPORTER.pod("h-cool"), "h-cool")
    source = PrometheusSource.at(prom.url, policy.telemetry, policy.health, attempts=1,
                              locate=lambda: (view.fleet.nodes, view.fleet.pod_nodes()))
    telemetry = await source.fetch()
    assert [r.util for r in telemetry.for_node("h-cool")] == [0.8] * 8


async def test_the_node_label_is_configurable(prometheus_factory, now):
    prom = prometheus_factory(history_openmetrics=history(now, node_label="hostname"))
    extender, _ = await client_for(prom.url, {"telemetry": {"nodeLabels": ["hostname"]}})
    assert len(extender.view.telemetry.for_node("h-cool")) == 8
    default, _ = await client_for(prom.url)  # looks for Hostname first, then hostname
    assert len(default.view.telemetry.for_node("h-cool")) == 8
    other, _ = await client_for(prom.url, {"telemetry": {"nodeLabels": ["kubernetes_node"]}})
    assert other.view.telemetry.for_node("h-cool") == ()


async def test_unreachable_prometheus_gives_neutral_scores_and_a_metric(unused_tcp_port):
    extender, client = await client_for(f"http://127.0.0.1:{unused_tcp_port}")
    async with client:
        body = await post(client, "prioritize", {"Pod": training_pod(1),
                                                 "NodeNames": ["h-cool", "l-missing"]})
        metrics = await (await client.get("/metrics")).text()
    # h-cool: (3*1 + 2*0.5 + 1/8 + 2*0.5)/8 = 0.64 -> 6: load and health neutral, card still counts
    assert json.loads(body) == [{"Host": "h-cool", "Score": 6}, {"Host": "l-missing", "Score": 3}]
    assert extender.metrics.refresh_errors._value.get() >= 1
    assert "gpusteward_telemetry_stale_nodes 5.0" in metrics


async def test_garbage_from_prometheus_is_treated_as_unavailable(dcgm_endpoint):
    # A DCGM endpoint is an HTTP server that is not Prometheus: /api/v1/query answers garbage.
    extender, client = await client_for(f"http://{dcgm_endpoint.target}")
    async with client:
        status = (await client.post("/filter", data=json.dumps(
            {"Pod": training_pod(1), "NodeNames": ["h-cool"]}))).status
    assert status == 200
    assert extender.metrics.refresh_errors._value.get() >= 1
    assert extender.view.stale_nodes() == 5


async def test_stale_readings_turn_neutral_without_a_new_fetch(prometheus):
    extender, _ = await client_for(prometheus.url)
    assert extender.view.stale_nodes() == 2  # l-stale and l-missing
    extender.view.clock = lambda: time.time() + 3600  # an hour later, Prometheus gone quiet
    extender.telemetry = None
    await extender.refresh()
    assert extender.view.stale_nodes() == 5


# dcgm-exporter's XID gauge never drops back (NVIDIA/dcgm-exporter#500): "x-old" had XID 79
# nine minutes ago and still shows it. With DCGM_EXP_XID_ERRORS_COUNT enabled its count went
# back to 0, and that count is what the extender believes.
XID_NODES = {"x-old": (79, 540), "x-new": (79, 30), "x-app": (13, 30)}  # node: (XID, age s)


def xid_history(now: float) -> str:
    frames = []
    for t in range(int(now) - 600, int(now) - 4, 15):
        frames.append((t, [
            SimGpu(name, i, "NVIDIA A100-SXM4-80GB", xid=xid if i == 0 else 0,
                   xid_count=int(i == 0 and now - age <= t <= now - age + 60))
            for name, (xid, age) in XID_NODES.items() for i in range(8)]))
    return render_openmetrics_history(frames, xid_count_window_ms=60_000,
                                      extra_labels={"job": "dcgm", "instance": "dcgm:9400"})


async def test_the_windowed_xid_count_wins_over_the_sticky_gauge(prometheus_factory, now):
    prom = prometheus_factory(history_openmetrics=xid_history(now))
    policy = parse_policy({"health": {"xidWindow": "2m"}})
    source = PrometheusSource.at(prom.url, policy.telemetry, policy.health, attempts=1)
    telemetry = await source.fetch()
    xids = {n: max(r.xid for r in telemetry.for_node(n)) for n in XID_NODES}
    # x-old: the count is 0 for 8 minutes; x-app: XID 13 is an application fault (ignored).
    assert xids == {"x-old": 0, "x-new": 79, "x-app": 0}
    # The gauge alone, as without the count, would still call x-old unhealthy.
    (gauge,) = await source.client.query('max(DCGM_FI_DEV_XID_ERRORS{Hostname="x-old"})')
    assert gauge["value"][1] == "79"


# Issue 13, item 7 / issue 12 "Bad telemetry": one bad sample (an XID of +Inf, a NaN, a
# utilization out of range) crashed every refresh, froze the old readings while the metrics
# said they were fresh, and kept an XID 79 GPU in service. Prometheus stores and serves such
# samples as they are (OpenMetrics allows NaN and ±Inf values): poison them into the history.
POISON = {  # (node, family, gpu) -> sample value written into every frame
    ("a-xid", "DCGM_FI_DEV_XID_ERRORS", 1): "+Inf",
    ("h-nan", "DCGM_FI_DEV_GPU_UTIL", 3): "NaN",
    ("h-nan", "DCGM_FI_DEV_XID_ERRORS", 4): "NaN",
    ("h-neg", "DCGM_FI_DEV_GPU_UTIL", 0): "-5",
    ("h-over", "DCGM_FI_DEV_GPU_UTIL", 0): "250",
}
POISONED_NODES = ["a-xid", "h-nan", "h-neg", "h-over", "h-ok"]


def poisoned_history(now: float) -> str:
    frames = [(t, [SimGpu(n, i, "NVIDIA A100-SXM4-80GB" if n == "a-xid" else H100_NAME,
                          util_percent=40, xid=79 if (n, i) == ("a-xid", 0) else 0)
                   for n in POISONED_NODES for i in range(8)])
              for t in range(int(now) - 300, int(now) - 4, 15)]
    text = render_openmetrics_history(frames, extra_labels={"job": "dcgm",
                                                            "instance": "dcgm:9400"})
    lines = []
    for line in text.splitlines():
        for (node_name, family, gpu), value in POISON.items():
            if line.startswith(f'{family}{{gpu="{gpu}",') and f'Hostname="{node_name}"' in line:
                series, _, ts = line.rsplit(" ", 2)
                line = f"{series} {value} {ts}"
        lines.append(line)
    return "\n".join(lines) + "\n"


async def test_a_bad_series_drops_only_its_own_gpu_and_is_counted(prometheus_factory, now):
    prom = prometheus_factory(history_openmetrics=poisoned_history(now))
    policy = parse_policy({})
    store = FleetStore()
    store.replace_all([node("a-xid", A100), *(node(n, H100) for n in POISONED_NODES[1:])], [])
    source = PrometheusSource.at(prom.url, policy.telemetry, policy.health, attempts=1)
    extender = Extender(PlacementView(policy, store), source)
    await extender.refresh()
    assert extender.metrics.refresh_errors._value.get() == 0
    assert extender.telemetry_age() < 30
    counts = {n: len(extender.view.telemetry.for_node(n)) for n in POISONED_NODES}
    assert counts == {"a-xid": 7, "h-nan": 6, "h-neg": 7, "h-over": 7, "h-ok": 8}
    async with TestClient(TestServer(create_app(extender))) as client:
        body = await post(client, "filter", {"Pod": training_pod(8), "NodeNames": ["a-xid"]})
        metrics = await (await client.get("/metrics")).text()
    # The real XID 79 on GPU 0 still takes a-xid out, although GPU 1's XID is +Inf.
    assert json.loads(body)["FailedNodes"] == {
        "a-xid": "pod needs 8 healthy free GPUs, node has 7 (unhealthy: gpu 0: XID 79)"}
    # The app's own background refresh may have run once more before /metrics was read: each
    # refresh drops the same series, so the counters are whole multiples of one refresh's.
    dropped = dict(re.findall(
        r'gpusteward_extender_telemetry_series_dropped_total\{reason="(\w+)"\} (\S+)', metrics))
    refreshes = float(dropped["not_finite"]) / 3
    assert refreshes in (1.0, 2.0)
    assert dropped == {"not_finite": f"{3 * refreshes}", "out_of_range": f"{2 * refreshes}"}
    assert "gpusteward_telemetry_stale_nodes 0.0" in metrics
