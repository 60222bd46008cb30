"""A fleet whose dcgm-exporter is upgraded from 4.8 to 4.9 mid-history, read from a real
Prometheus: every GPU's last 30 minutes hold the legacy series (percent, MiB, ``Hostname``) for
their first half and DCGM 4.7's (ratio, bytes, ``hostname``) for the rest, from a new exporter
pod (the DaemonSet's next revision), as a Prometheus Operator ServiceMonitor stores them.

Sources: DCGM's field table (dcgm_fields.h: DCGM_FI_DEV_GPU_UTIL 203 in percent,
DCGM_FI_DEV_GPU_UTIL_RATIO 1613 in 0-1), go-dcgm's alias table of deprecated names
(pkg/dcgm/fields.go), dcgm-exporter's 4.8.3 (``hostname``) and 4.9 (DCGM 4.7 names) releases.
A GPU busy only after the switch, read as a percent, would look idle: the one mistake the
reclaimer must never make."""

from __future__ import annotations

import dataclasses
import time

import pytest

from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.snapshot import SnapshotReader
from gpusteward.adapters.telemetry import PrometheusSource
from gpusteward.core.attribution import Attribution
from gpusteward.core.dcgm import DCGM47, ENGINE_ACTIVE, GPU_UTIL, LEGACY, Field, Generation, PodRef
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.rules import judge, rule_for
from gpusteward.report.usage import series, utilization_query
from gpusteward.sandbox.scrape import DCGM_EXPORTER
from gpusteward.sandbox.simgpu import (
    Share,
    SimGpu,
    join_openmetrics,
    render_openmetrics_history,
)
from tests.support.prometheus import servicemonitor
from tests.unit.test_reclaim_decide import gpu_pod

STEP = 15.0
POLICY = parse_policy({"telemetry": {"scrapeInterval": "15s"}})
# Profiles (before the switch, after it) in percent; the switch is 15 minutes ago.
PODS = {
    "idle-across": (1, 2),
    "busy-after": (0, 90),  # read as a percent, 0.9 would be idle
    "busy-before": (95, 0),
    "idle-legacy": (3, None),  # on n2, whose exporter is not upgraded
    "idle-new": (None, 4),  # on n3, upgraded before the window
}
NODES = {"idle-legacy": "n2", "idle-new": "n3", "busy-mislabelled": "n4"}
ROLLED = dataclasses.replace(DCGM_EXPORTER, revision="2")  # the upgraded DaemonSet's pods
# The design must not depend on guessing 4.9's counters (issue 26): an exporter (or a recording
# rule) printing the legacy percent name with DCGM 4.7's 0-1 value, beside engine activity.
MISLABELLED = Generation((
    Field(GPU_UTIL, "GPU utilization (in %).", lambda g: f"{g.util_percent / 100:f}"),
    Field(ENGINE_ACTIVE, "Ratio of time the graphics engine is active.",
          lambda g: f"{g.util_percent / 100:f}"),
), LEGACY.node_label, LEGACY.driver_label)
# A name like utilization's that no concept is read under (a future rename, a custom field).
UNHEARD = Generation((Field("DCGM_FI_DEV_GPU_UTIL_PERCENT", "GPU utilization (in %).",
                            lambda g: f"{g.util_percent:.0f}"),),
                     LEGACY.node_label, LEGACY.driver_label)


def _gpus(t: float, switch: float, after: bool) -> list[SimGpu]:
    out = []
    for i, (pod, (before, later)) in enumerate(PODS.items()):
        util = later if after else before
        upgraded = later if before is None else before if later is None else None
        if util is None or (upgraded is None and (t >= switch) != after):
            continue  # no series under this name (then), or a node not upgraded mid-window
        out.append(SimGpu(NODES.get(pod, "n1"), i, "NVIDIA H100 80GB HBM3", util_percent=util,
                          fb_used_mib=1024 * (i + 1), temp_c=40 + i, pod=PodRef("ml", pod, "main")))
    return out


def never_upgraded(now: float) -> str:
    """The same GPUs and uses, all under the legacy names from one exporter revision."""
    times = [now - 40 * 60 + k * STEP for k in range(int(40 * 60 / STEP))]
    switch = now - 15 * 60
    return render_openmetrics_history(
        [(t, _gpus(t, switch, after=False) + _gpus(t, switch, after=True)) for t in times],
        scrape=servicemonitor(False), generation=LEGACY, node_label=LEGACY.node_label)


def mislabelled_only(times: list[float], honor: bool) -> str:
    """A busy GPU (90 %) whose exporter prints the legacy percent name with a 0-1 value."""
    return render_openmetrics_history(
        [(t, [SimGpu("n4", 0, "NVIDIA H100 80GB HBM3", util_percent=90,
                     pod=PodRef("ml", "busy-mislabelled", "main"))]) for t in times],
        scrape=servicemonitor(honor, ROLLED), generation=MISLABELLED,
        node_label=LEGACY.node_label)


def history(now: float, honor: bool) -> str:
    switch, times = now - 15 * 60, [now - 40 * 60 + k * STEP for k in range(int(40 * 60 / STEP))]
    legacy = render_openmetrics_history(
        [(t, _gpus(t, switch, after=False)) for t in times], scrape=servicemonitor(honor),
        generation=LEGACY, node_label=LEGACY.node_label)
    upgraded = render_openmetrics_history(
        [(t, _gpus(t, switch, after=True)) for t in times], scrape=servicemonitor(honor, ROLLED),
        generation=DCGM47, node_label=DCGM47.node_label)
    mislabelled = mislabelled_only(times, honor)
    # A time-sliced GPU under --kubernetes-virtual-gpus: one copy per pod, each its own use.
    shared = render_openmetrics_history(
        [(t, [SimGpu("n6", 0, "NVIDIA H100 80GB HBM3", shares=(
            Share(PodRef("ml", "share-busy", "main"), "0", 80),
            Share(PodRef("ml", "share-idle", "main"), "1", 0)))]) for t in times],
        scrape=servicemonitor(honor, ROLLED), generation=DCGM47, node_label=DCGM47.node_label)
    unheard = render_openmetrics_history(
        [(t, [SimGpu("n5", 0, "NVIDIA H100 80GB HBM3", util_percent=0,
                     pod=PodRef("ml", "unheard", "main"))]) for t in times],
        scrape=servicemonitor(honor), generation=UNHEARD, node_label=LEGACY.node_label)
    return join_openmetrics(legacy, upgraded, mislabelled, unheard, shared)


@pytest.fixture(scope="module")
def now() -> float:
    return time.time()


@pytest.fixture(scope="module", params=[False, True], ids=["honorLabels-false", "honorLabels-true"])
def prometheus(request, module_prometheus_factory, now):  # read only
    return module_prometheus_factory(history_openmetrics=history(now, request.param))


def reader(url: str) -> SnapshotReader:
    return SnapshotReader(None, PrometheusClient(url, POLICY.telemetry), POLICY)


def pods() -> tuple:
    return tuple(gpu_pod(p, node=NODES.get(p, "n1")) for p in [*PODS, "busy-mislabelled"])


@pytest.mark.parametrize(("pod", "state"), [
    pytest.param("idle-across", "idle", id="idle-on-both-names-is-idle"),
    pytest.param("busy-after", "busy", id="busy-after-the-switch-is-busy"),
    pytest.param("busy-before", "busy", id="busy-before-the-switch-is-busy"),
    pytest.param("idle-legacy", "idle", id="a-4.8-node-alone"),
    pytest.param("idle-new", "idle", id="a-4.9-node-alone"),
])
async def test_a_gpu_is_judged_on_both_names_across_the_switch(prometheus, now, pod, state):
    evidence, ok, problem = await reader(prometheus.url).evidence(pods(), now)
    assert ok, problem
    ev = evidence[1800.0][f"ml/{pod}"]
    assert judge(ev, rule_for(gpu_pod(pod), POLICY), 1)[0] == state, ev


async def test_per_pod_copies_of_a_shared_gpu_work_under_the_new_names(prometheus, now):
    shared = (gpu_pod("share-busy", node="n6"), gpu_pod("share-idle", node="n6"))
    evidence, ok, problem = await reader(prometheus.url).evidence(shared, now)
    assert ok, problem
    busy, idle = evidence[1800.0]["ml/share-busy"], evidence[1800.0]["ml/share-idle"]
    assert busy.peak_percent == pytest.approx(80.0) and idle.peak_percent == 0.0
    assert judge(idle, rule_for(shared[1], POLICY), 1)[0] == "idle"


async def test_a_ratio_under_a_percent_name_is_doubted_never_idle(prometheus, now):
    snapshots = reader(prometheus.url)
    evidence, ok, _ = await snapshots.evidence(pods(), now)
    ev = evidence[1800.0]["ml/busy-mislabelled"]
    state, why = judge(ev, rule_for(gpu_pod("busy-mislabelled"), POLICY), 1)
    assert state == "unknown", (ev, why)  # read as a percent it would peak at 0.9 %: idle
    assert snapshots.doubted == 1
    assert judge(evidence[1800.0]["ml/idle-legacy"], rule_for(gpu_pod("x"), POLICY), 1)[0] \
        == "idle"  # a real percent at 3 % beside no engine activity is not doubted


async def test_a_fleet_on_one_ratio_under_a_percent_name_is_doubted_too(prometheus_factory, now):
    """No other name present: the queries come unmarked, and the doubt still applies."""
    times = [now - 40 * 60 + k * STEP for k in range(int(40 * 60 / STEP))]
    alone = prometheus_factory(history_openmetrics=mislabelled_only(times, False))
    snapshots = reader(alone.url)
    evidence, ok, problem = await snapshots.evidence((gpu_pod("busy-mislabelled", node="n4"),),
                                                     now)
    assert ok, problem
    ev = evidence[1800.0]["ml/busy-mislabelled"]
    assert judge(ev, rule_for(gpu_pod("busy-mislabelled"), POLICY), 1)[0] == "unknown", ev
    assert snapshots.doubted == 1


async def test_coverage_and_age_join_the_two_series(prometheus, now):
    evidence, _, _ = await reader(prometheus.url).evidence(pods(), now)
    across = evidence[1800.0]["ml/idle-across"]
    assert across.coverage >= 0.95  # half a window under each name, summed
    assert across.age <= 2 * STEP  # the new series reaches the present; the old one stopped
    assert across.peak_percent == pytest.approx(2.0)  # the ratio 0.02 in percent
    assert evidence[1800.0]["ml/busy-after"].peak_percent == pytest.approx(90.0)


async def test_the_extender_reads_both_generations_in_its_units(prometheus, now):
    source = PrometheusSource.at(prometheus.url, POLICY.telemetry, POLICY.health, clock=lambda: now)
    readings = {(n, r.pod): r for n, rs in (await source.fetch()).nodes.items() for r in rs}
    new, legacy = readings[("n3", "ml/idle-new")], readings[("n2", "ml/idle-legacy")]
    assert new.util == pytest.approx(0.04) and legacy.util == pytest.approx(0.03)
    assert new.fb_used_mib == pytest.approx(5 * 1024) and legacy.fb_used_mib == 4 * 1024
    assert (new.temp_c, legacy.temp_c) == (44, 43)
    assert readings[("n1", "ml/busy-after")].util == pytest.approx(0.9)
    assert source.last_dropped == {}


async def test_an_xid_under_both_names_in_its_window_is_one_reading(prometheus_factory, now):
    """A GPU's sticky XID gauge (dcgm-exporter keeps the last XID: NVIDIA/dcgm-exporter#500)
    is in the health window under DCGM_FI_DEV_XID_ERRORS (``Hostname``) until the switch and
    DCGM_FI_DEV_XID_ERROR (``hostname``) after it: one GPU, one XID, no duplicate. (The
    switch is past instant queries' 5-minute lookback: a backfilled history has no staleness
    markers, which a live scrape writes when the old exporter's target goes.)"""
    times = [now - 20 * 60 + k * STEP for k in range(int(20 * 60 / STEP))]
    switch = now - 6 * 60  # within the 10-minute XID window

    def faulty(t: float) -> list[SimGpu]:
        return [SimGpu("n7", 0, "NVIDIA H100 80GB HBM3", util_percent=0, xid=48,
                       pod=PodRef("ml", "faulty", "main"))]

    before = render_openmetrics_history(
        [(t, faulty(t)) for t in times if t < switch], scrape=servicemonitor(False),
        generation=LEGACY, node_label=LEGACY.node_label)
    after = render_openmetrics_history(
        [(t, faulty(t)) for t in times if t >= switch], scrape=servicemonitor(False, ROLLED),
        generation=DCGM47, node_label=DCGM47.node_label)
    both = prometheus_factory(history_openmetrics=join_openmetrics(before, after))
    source = PrometheusSource.at(both.url, POLICY.telemetry, POLICY.health, clock=lambda: now)
    readings = [r for rs in (await source.fetch()).nodes.values() for r in rs]
    assert [(r.node, r.gpu, r.xid) for r in readings] == [("n7", "0", 48)]
    assert source.last_dropped == {}


async def test_a_series_under_an_unknown_name_is_ignored_and_counted(prometheus, now):
    source = PrometheusSource.at(prometheus.url, POLICY.telemetry, POLICY.health, clock=lambda: now)
    nodes = (await source.fetch()).nodes
    assert "n5" not in nodes  # no reading: unknown, never idle
    assert source.unknown_names == ["DCGM_FI_DEV_GPU_UTIL_PERCENT"]
    evidence, _, _ = await reader(prometheus.url).evidence((gpu_pod("unheard", node="n5"),), now)
    assert "ml/unheard" not in evidence[1800.0]


async def test_the_report_reads_one_series_per_gpu_across_the_switch(prometheus, now):
    source = PrometheusClient(prometheus.url, POLICY.telemetry)
    rows = await source.query_range(utilization_query(60.0, STEP, source.vocabulary),
                                    now - 1800, now - 60, 60.0)
    who = Attribution.of(POLICY.telemetry.node_labels, POLICY.telemetry.honor_labels,
                         ["n1", "n2", "n3"], pods())
    by_pod = {s.pod: s for s in series(rows, who)}
    busy = [v for _, v in by_pod["ml/busy-after"].points]
    assert len(busy) >= 28 and max(busy) == pytest.approx(90.0)  # percent on both sides
    assert max(v for _, v in by_pod["ml/busy-before"].points) == pytest.approx(95.0)


async def test_the_reports_figures_are_unchanged_by_the_switch(prometheus, now,
                                                                prometheus_factory):
    """The same fleet never upgraded gives the same per-pod series, slot by slot."""
    legacy = prometheus_factory(history_openmetrics=never_upgraded(now))
    who = Attribution.of(POLICY.telemetry.node_labels, POLICY.telemetry.honor_labels,
                         ["n1", "n2", "n3"], pods())
    figures = []
    for server in (prometheus, legacy):
        source = PrometheusClient(server.url, POLICY.telemetry)
        rows = await source.query_range(utilization_query(60.0, STEP, source.vocabulary),
                                        now - 1800, now - 60, 60.0)
        figures.append({s.pod: [(t, round(v, 6)) for t, v in s.points]
                        for s in series(rows, who) if s.pod.removeprefix("ml/") in PODS})
    upgraded, never = figures
    assert set(never) == {f"ml/{p}" for p in PODS}
    assert upgraded == never
