"""What-if history read from a real Prometheus: kube-state-metrics' pod series (as the sandbox's
stand-in renders them, gpusteward.sandbox.ksm) and dcgm-exporter series (stored as a Prometheus
Operator ServiceMonitor with honorLabels: false stores them), backfilled with promtool, then
replayed with the reclaimer's own plan().

Upstream shapes: kube-state-metrics docs/metrics/workload/pod-metrics.md (names, labels) and
internal/store/pod.go (values); dcgm-exporter's labels as in tests/component/
test_extender_telemetry.py.
"""

from __future__ import annotations

import json
import time

import pytest

from gpusteward.adapters.history import HistoryReader, queries
from gpusteward.adapters.historyfold import NoHistory
from gpusteward.adapters.promclient import PrometheusClient, is_left_closed
from gpusteward.core.dcgm import PodRef, label_set
from gpusteward.core.policy import parse_policy
from gpusteward.core.whatif.replay import replay
from gpusteward.sandbox.ksm import JOB, pod_families
from gpusteward.sandbox.simgpu import SimGpu, render_openmetrics_history
from tests.support.prometheus import servicemonitor

H100 = "NVIDIA H100 80GB HBM3"
SCRAPE, STEP = 30.0, 60.0
MINUTES = 60
POLICY = parse_policy({"telemetry": {"scrapeInterval": "30s"}, "reclaim": {
    "interval": "60s", "minPodAge": "1s", "idle": {"window": "300s", "grace": "300s"}}})


def k8s_pod(name: str, gpus: int, node: str | None, created: float, **meta) -> dict:
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                            time.gmtime(created)),
                         "labels": {"gpusteward.io/team": "vision", "app": name}, **meta},
            "spec": {"nodeName": node or "", "containers": [{"name": "main", "resources": {
                "requests": {"cpu": "500m", "nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running" if node else "Pending"}}


class Cluster:
    """The scripted history: what ran where, and how busy, minute by minute."""

    def __init__(self, start: float):
        self.start = start

    def minute(self, t: float) -> float:
        return (t - self.start) / 60

    def pods(self, t: float) -> list[dict]:
        m, created = self.minute(t), self.start - 600
        out = [k8s_pod("idle", 2, "h1", created), k8s_pod("busy", 1, "h1", created),
               k8s_pod("back", 1, "h2", created)]
        if m < 40:  # waits for GPUs until minute 40
            out.append(k8s_pod("queued", 2, None, created))
        else:
            out.append(k8s_pod("queued", 2, "h2", created))
        return out

    def gpus(self, t: float) -> list[SimGpu]:
        m = self.minute(t)
        back = 0.0 if 10 <= m < 16 else 70.0  # idle 6 minutes, then busy again (grace: 5)
        out = [SimGpu("h1", 0, H100, 0.0, pod=PodRef("ml", "idle", "main")),
               SimGpu("h1", 1, H100, 0.0, pod=PodRef("ml", "idle", "main")),
               SimGpu("h1", 2, H100, 85.0, pod=PodRef("ml", "busy", "main")),
               SimGpu("h2", 0, H100, back, pod=PodRef("ml", "back", "main"))]
        if m >= 40:
            out += [SimGpu("h2", i, H100, 90.0, pod=PodRef("ml", "queued", "main"))
                    for i in (1, 2)]
        return out


def ksm_openmetrics(frames: list[tuple[float, list[dict]]]) -> str:
    """The stand-in's families at each frame, as Prometheus stores them from its scrape
    (honor_labels: true: the pod's own namespace/pod stay; job and instance are added)."""
    target = (("instance", "kube-state-metrics:8080"), ("job", JOB))
    by_family: dict[str, dict[str, list[str]]] = {}
    for ts, pods in frames:
        for family in pod_families(pods, ("gpusteward.io/team",)):
            series = by_family.setdefault(family.name, {})
            for s in family.samples:
                name = family.name + label_set(s.labels + target)
                series.setdefault(name, []).append(f"{name} {s.value} {ts:.3f}")
    lines = []
    for family, series in by_family.items():
        lines += [f"# TYPE {family} gauge", *(x for ss in series.values() for x in ss)]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def end() -> float:
    return float(int(time.time() // 60 * 60) - 60)


@pytest.fixture(scope="module")
def prometheus(module_prometheus_factory, end):  # read only
    start = end - MINUTES * 60
    cluster = Cluster(start)
    times = [start + i * SCRAPE for i in range(int(MINUTES * 60 / SCRAPE) + 1)]
    dcgm = render_openmetrics_history([(t, cluster.gpus(t)) for t in times],
                                      scrape=servicemonitor(False))
    ksm = ksm_openmetrics([(t, cluster.pods(t)) for t in times])
    history = dcgm.replace("# EOF\n", "") + ksm + "# EOF\n"
    return module_prometheus_factory(history_openmetrics=history)


async def read(prometheus, start: float, end: float, chunk: float = 1800):
    source = PrometheusClient(prometheus.url, POLICY.telemetry)
    history = await HistoryReader(source, POLICY, chunk=chunk).read(start, end)
    return history, source.queries_run


async def test_the_replay_reclaims_the_idle_pod_at_mark_warn_and_grace(prometheus, end):
    start = end - MINUTES * 60
    history, _ = await read(prometheus, start, end)
    out = replay(history, POLICY, "short")
    (r,) = [r for r in out.reclaimed if r.pod == "ml/idle"]
    # idle from the start, sampled every 30 s from `start` on, each cycle counting the samples in
    # (t - 60 s, t] on either Prometheus major: cycle 0 has 1 sample, the others 2; at cycle 4
    # the window (cycles 0-4) holds 9 of 10 (minCoverage 0.8), so marked at 4, warned at 5,
    # reclaimed at 5 + 5 (grace 300 s). (Counted left-closed, as 2.x's [60s] alone counts,
    # the samples at cycle boundaries counted twice and it read 4 of 5 a cycle early.)
    assert r.at == start + 10 * STEP
    assert r.gpus == 2 and r.team == "vision" and r.card == H100 and r.how == "evict"
    assert r.gpu_hours == pytest.approx(2 * (end - r.at) / 3600, rel=0.02)
    assert {x.pod for x in out.reclaimed} == {"ml/idle"}  # busy, back and queued kept


async def test_a_workload_busy_again_within_the_grace_is_a_comeback(prometheus, end):
    history, _ = await read(prometheus, end - MINUTES * 60, end)
    out = replay(history, POLICY)
    (c,) = out.comebacks
    assert c.pod == "ml/back" and c.peak_percent == 70.0
    assert c.back_at - c.idle_at < 300


async def test_the_waiting_pod_would_have_started_on_the_reclaimed_gpus(prometheus, end):
    start = end - MINUTES * 60
    history, _ = await read(prometheus, start, end)
    out = replay(history, POLICY)
    (e,) = out.earlier
    assert e.gpus == 2  # one request, though its series before and after binding differ
    assert e.pod == "ml/queued" and e.could_start_at == start + 10 * STEP  # the reclaim
    assert e.started_at == pytest.approx(start + 40 * 60, abs=STEP)


async def test_queries_are_per_chunk_not_per_pod_or_step(prometheus, end):
    _, asked = await read(prometheus, end - MINUTES * 60, end, chunk=1800)
    chunks = 3  # 61 cycles (both ends included), 30 to a chunk
    assert asked == 1 + chunks * len(queries(POLICY, STEP, 1800))  # 1: is_left_closed


async def test_the_probe_tells_left_closed_windows_from_left_open_ones(prometheus,
                                                                     prometheus_major):
    # 2.x's windows include a sample at their start, 3.x's (subqueries from 3.0.1) do not
    source = PrometheusClient(prometheus.url, POLICY.telemetry)
    assert await is_left_closed(source) is (prometheus_major == "2")


async def test_a_window_without_history_says_what_is_missing(prometheus, end):
    with pytest.raises(NoHistory, match="no kube-state-metrics pod history"):
        await read(prometheus, end - 30 * 86400, end - 29 * 86400)


def whatif(prometheus, tmp_path, *args: str) -> int:
    from gpusteward.cli import main

    policy = tmp_path / "short.yaml"
    policy.write_text(POLICY_YAML)
    return main(["whatif", "--policy", str(policy), "--prometheus-url", prometheus.url, *args])


POLICY_YAML = """\
telemetry: {scrapeInterval: 30s}
reclaim: {interval: 60s, minPodAge: 1s, idle: {window: 300s, grace: 300s}}
"""


def test_the_command_prints_each_policy_side_by_side(prometheus, end, tmp_path, capsys):
    longer = tmp_path / "longer.yaml"
    longer.write_text(POLICY_YAML.replace("window: 300s", "window: 1200s"))
    assert whatif(prometheus, tmp_path, "--policy", str(longer), "--window", "1h", "--end",
                  time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end)), "--format",
                  "json") == 0
    short, long = json.loads(capsys.readouterr().out)["policies"]
    assert short["reclaimed"][0]["pod"] == "ml/idle"
    assert 0 < long["gpuHours"] < short["gpuHours"]
    assert short["gpuHoursByTeam"] == {"vision": short["gpuHours"]}


def test_a_window_without_history_is_one_line_and_exit_1(prometheus, tmp_path, capsys):
    assert whatif(prometheus, tmp_path, "--window", "1h", "--end", "2020-01-01T00:00:00Z") == 1
    err = capsys.readouterr().err
    assert err.startswith("gpusteward whatif: no kube-state-metrics pod history")
    assert err.count("\n") == 1


@pytest.mark.parametrize(("fmt", "expect"), [
    pytest.param("table", ["GPU-hours freed", "ml/idle", "What the history lacked"], id="table"),
    pytest.param("csv", ["policy,event,pod,team,card,gpus,at,until,gpu_hours,detail",
                         ",reclaimed,ml/idle,vision,NVIDIA H100 80GB HBM3,2,"], id="csv"),
    pytest.param("html", ["<!doctype html>", "<td>ml/idle</td>", "What the history lacked"],
                 id="html"),
])
def test_every_format_shows_the_reclaim(prometheus, end, tmp_path, capsys, fmt, expect):
    assert whatif(prometheus, tmp_path, "--window", "1h", "--end",
                  time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end)), "--format", fmt) == 0
    out = capsys.readouterr().out
    assert all(e in out for e in expect), out[:2000]
