"""The fleet report's maths: usage per pod over the window, groups, totals, sections (explicit
`now`, a 10-minute window of 1-minute slots)."""

from __future__ import annotations

import json

import pytest

from gpusteward.core.health import Fault, Source, pod_faults
from gpusteward.core.model import RESERVED, Node, Pod, Taint, WithheldDevice
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.model import (
    COOLDOWN_UNTIL,
    QUEUE_BLOCKED,
    Evidence,
    Snapshot,
    VerdictState,
)
from gpusteward.core.report.aggregate import build_report
from gpusteward.core.report.facts import pod_usages
from gpusteward.core.report.model import DecisionState, ReportInput, Series, Window
from gpusteward.core.report.sections import decisions
from gpusteward.core.times import stamp
from gpusteward.report.html import to_html
from gpusteward.report.render import to_table
from tests.factories import H100, L4

NOW = 1_800_000_000.0
STEP = 60.0
WINDOW = Window(start=NOW - 600, end=NOW, step=STEP)
HOURS = 600 / 3600  # one GPU for the whole window
POLICY = parse_policy({
    "cardTiers": [{"name": "premium", "products": ["NVIDIA-H100*"], "costPerGpuHour": 3.0},
                  {"name": "economy", "products": ["NVIDIA-L4"]}],
    "classes": {"batch": {"preferredTiers": ["premium"]}},
    "teams": {"vision": {"quotaGpus": 1}},
})
NODES = (Node("h1", H100, 8), Node("l1", L4, 4))


def pod(name: str, gpus: int = 1, node: str | None = "h1", *, started: float = NOW - 3600,
        team: str = "vision", **kw) -> Pod:
    return Pod(namespace="ml", name=name, uid=name, gpus=gpus, node=node,
               phase="Running" if node else "Pending", created_at=started,
               labels={"gpusteward.io/team": team}, **kw)


def samples(name: str, values: list[float | None], gpu: str = "0", node: str = "h1",
            ns: str = "ml") -> Series:
    """One GPU's per-slot peaks, oldest slot first; None leaves the slot without a sample."""
    return Series(f"{ns}/{name}", node, gpu,
                  tuple((t, v) for t, v in zip(WINDOW.slots, values, strict=True)
                        if v is not None))


def report(pods: list[Pod], series: list[Series], *, by: str = "team",
           nodes: tuple[Node, ...] = NODES, evidence: dict[str, Evidence] | None = None,
           telemetry_ok: bool = True, range_ok: bool = True,
           faults: dict[str, Fault] | None = None):
    snap = Snapshot(now=NOW, pods=tuple(pods), nodes={n.name: n for n in nodes}, owners={},
                    namespace_labels={}, evidence={1800.0: evidence or {}},
                    telemetry_ok=telemetry_ok, telemetry_problem="" if telemetry_ok else "down",
                    tiers={"h1": "premium", "l1": "economy"}, faults=faults or {})
    inp = ReportInput(snap, WINDOW, tuple(series), range_ok=range_ok,
                      range_problem="" if range_ok else "prometheus down")
    return build_report(inp, POLICY, by=by)


ZERO, BUSY = [0.0] * 10, [80.0] * 10


@pytest.mark.parametrize(("values", "state", "idle_hours"), [
    pytest.param(ZERO, "idle", HOURS, id="idle-all-window"),
    pytest.param(BUSY, "busy", 0.0, id="busy-all-window"),
    pytest.param([0.0] * 9 + [80.0], "busy", 9 * HOURS / 10, id="one-busy-slot-makes-it-busy"),
    pytest.param([4.9] * 10, "idle", HOURS, id="just-below-threshold-is-idle"),
])
def test_a_pod_is_idle_or_busy_by_its_peak_and_idle_hours_count_idle_slots(
        values, state, idle_hours):
    r = report([pod("a")], [samples("a", values)])
    (group,) = r.groups
    assert (group.used, group.idle, group.unknown) == (
        (1.0, 0.0, 0.0) if state == "busy" else (0.0, 1.0, 0.0))
    assert group.allocated_gpu_hours == pytest.approx(HOURS)
    assert group.idle_gpu_hours == pytest.approx(idle_hours)


@pytest.mark.parametrize(("pods", "series", "idle_slots", "why"), [
    pytest.param([pod("a")], [], 0, "no GPU telemetry", id="no-series-at-all"),
    pytest.param([pod("a")], [samples("a", [0.0, 0.0] + [None] * 8)], 2, "coverage 20%",
                 id="too-few-samples"),
    pytest.param([pod("a", 2)], [samples("a", ZERO)], 0, "covers 1 of its 2 GPUs",
                 id="one-of-two-gpus-reported"),
])
def test_missing_telemetry_is_unknown_never_idle_or_busy(pods, series, idle_slots, why):
    r = report(pods, series)
    (group,) = r.groups
    assert (group.used, group.idle, group.unknown) == (0.0, 0.0, group.allocated)
    # Only slots measured idle on every GPU of the pod count as idle hours; the rest unknown.
    assert group.idle_gpu_hours == pytest.approx(group.allocated * idle_slots * HOURS / 10)
    assert group.unknown_gpu_hours + group.idle_gpu_hours == pytest.approx(
        group.allocated_gpu_hours)
    (u,) = pod_usages(ReportInput(Snapshot(NOW, tuple(pods), {n.name: n for n in NODES}, {}, {},
                                           {}, True), WINDOW, tuple(series)), POLICY)
    assert (u.state, why in u.why) == ("unknown", True)


def test_prometheus_down_makes_every_pod_unknown_and_the_reclaimer_halted():
    r = report([pod("a")], [], telemetry_ok=False, range_ok=False)
    assert not r.telemetry_ok and "prometheus down" in r.telemetry_problem
    assert (r.totals.unknown, r.totals.idle, r.totals.used) == (1.0, 0.0, 0.0)
    assert r.top_idle == ()


@pytest.mark.parametrize(("started", "allocated_s"), [
    pytest.param(NOW - 300, 300, id="started-on-a-slot-boundary"),
    pytest.param(NOW - 330, 330, id="started-mid-slot"),
    pytest.param(NOW - 3600, 600, id="started-before-the-window"),
])
def test_pods_started_inside_the_window_count_only_from_their_start(started, allocated_s):
    values = [None if t <= started else 0.0 for t in WINDOW.slots]
    r = report([pod("a", started=started)], [samples("a", values)])
    assert r.totals.allocated_gpu_hours == pytest.approx(allocated_s / 3600)
    assert r.totals.idle_gpu_hours == pytest.approx(allocated_s / 3600)
    assert r.totals.idle == 1.0
    points = r.timelines["team"]["vision"]
    assert [p.allocated for p in points if p.at <= started] == [0.0] * sum(
        t <= started for t in WINDOW.slots)


def test_shared_gpus_count_once_and_each_sharing_pod_sees_the_gpus_load():
    shared = Node("s1", H100, 8, labels={"nvidia.com/gpu.replicas": "2"})  # 4 physical GPUs
    pods = [pod("a", node="s1"), pod("b", node="s1"), pod("c", node="s1")]
    series = [samples("a", ZERO, gpu="GPU-1", node="s1"),
              samples("b", ZERO, gpu="GPU-1", node="s1"),
              samples("c", BUSY, gpu="GPU-2", node="s1")]
    r = report(pods, series, by="node", nodes=(shared,))
    (group,) = r.groups
    assert (group.allocatable, group.allocated, group.free) == (4.0, 1.5, 2.5)
    assert (group.idle, group.used) == (1.0, 0.5)
    assert group.idle_gpu_hours == pytest.approx(HOURS)  # one physical GPU idle, not two


def test_pods_gone_inside_the_window_count_for_gpu_hours_only():
    r = report([], [samples("done", [0.0] * 4 + [None] * 6)])
    (group,) = r.groups
    assert (group.name, group.allocated, group.idle) == ("ml", 0.0, 0.0)
    assert group.allocated_gpu_hours == pytest.approx(4 * STEP / 3600)
    assert group.idle_gpu_hours == pytest.approx(4 * STEP / 3600)


def test_card_groups_show_allocatable_free_ratios_and_idle_cost():
    r = report([pod("busy", 2), pod("idle"), pod("cheap", node="l1")],
               [samples("busy", BUSY), samples("busy", BUSY, gpu="1"), samples("idle", ZERO),
                samples("cheap", ZERO, node="l1")], by="card")
    h100, l4 = r.groups
    assert (h100.name, h100.allocatable, h100.allocated, h100.used, h100.idle, h100.free) == (
        H100, 8.0, 3.0, 2.0, 1.0, 5.0)
    assert h100.allocation_ratio == pytest.approx(3 / 8)
    assert h100.active_ratio == pytest.approx(2 / 3)
    assert h100.mean_util_percent == pytest.approx(160 / 3)
    assert h100.idle_cost == pytest.approx(HOURS * 3.0)
    assert (l4.name, l4.allocatable, l4.idle, l4.idle_cost) == (L4, 4.0, 1.0, None)
    assert (r.totals.allocatable, r.totals.allocated, r.totals.free) == (12.0, 4.0, 8.0)
    assert r.totals.idle_cost == pytest.approx(HOURS * 3.0)


def test_top_idle_pods_carry_the_reclaimers_own_decision():
    ev = {"ml/idle": Evidence(1800.0, 0.0, 1.0, 1), "ml/busy": Evidence(1800.0, 80.0, 1.0, 1)}
    r = report([pod("busy", team="other"), pod("idle", team="other")],
               [samples("busy", BUSY), samples("idle", [50.0] + [0.0] * 9)], evidence=ev)
    (top,) = r.top_idle
    assert (top.pod, top.owner, top.state) == ("idle", "Pod/idle", "busy")
    assert top.idle_since == WINDOW.slots[0]
    assert top.idle_gpu_hours == pytest.approx(9 * HOURS / 10)
    assert (top.reclaimer.state, top.reclaimer.action) == ("idle", "mark")
    assert "peak 0% < 5%" in top.reclaimer.why


def test_a_gang_is_one_top_idle_line_naming_its_idle_ranks():
    # A gang is judged and reclaimed whole (core/reclaim/gangs.py), so the report lists it as
    # one: a PodGroup (spec.schedulingGroup.podGroupName) of three with one idle rank, and a
    # wholly idle one of two; a plain idle pod beside them keeps its own line.
    idle = Evidence(1800.0, 0.0, 1.0, 1)
    busy = Evidence(1800.0, 80.0, 1.0, 1)
    pods = [pod(f"train-{i}", pod_group="train") for i in range(3)] + [
        pod(f"idle-{i}", pod_group="idle") for i in range(2)] + [pod("solo")]
    ev = {"ml/train-0": busy, "ml/train-1": idle, "ml/train-2": busy, "ml/idle-0": idle,
          "ml/idle-1": idle, "ml/solo": idle}
    r = report(pods, [samples("train-0", BUSY, gpu="0"), samples("train-1", ZERO, gpu="1"),
                      samples("train-2", BUSY, gpu="2"), samples("idle-0", ZERO, gpu="3"),
                      samples("idle-1", ZERO, gpu="4"),
                      samples("solo", ZERO, gpu="5")], evidence=ev)
    whole, solo, partly = r.top_idle
    assert (whole.gang, whole.pod, whole.pods, whole.idle_pods, whole.gpus, whole.state) == (
        "PodGroup ml/idle", "idle-0", 2, ("idle-0", "idle-1"), 2, "idle")
    assert whole.idle_gpu_hours == pytest.approx(2 * HOURS)
    assert whole.idle_cost == pytest.approx(3.0 * whole.idle_gpu_hours)
    assert whole.idle_since == WINDOW.start
    assert (solo.gang, solo.pod, solo.pods, solo.idle_pods) == ("", "solo", 1, ())
    # Partly idle: the gang is busy (not idle unless all are), its idle hours the idle rank's.
    assert (partly.gang, partly.pods, partly.idle_pods, partly.gpus, partly.state) == (
        "PodGroup ml/train", 3, ("train-1",), 3, "busy")
    assert (partly.idle_since, partly.idle_gpu_hours) == (None, pytest.approx(HOURS))
    # The line shows the furthest its pods' reclaim has come: the idle rank's mark.
    assert (partly.reclaimer.state, partly.reclaimer.action) == ("idle", "mark")
    table = to_table(r)
    assert "PodGroup ml/train (3 pods, idle: train-1)" in table
    assert "PodGroup ml/idle (2 pods, all idle)" in table
    assert "ml/train-1" not in table


def test_the_queue_says_why_nothing_is_freed_for_a_waiting_gang():
    # The reclaimer's note on a waiting gang's first pod (decide._short): the report reads it,
    # as it reads the cooldown note, and lists it under the queue.
    why = "3 of the 4 waiting pods of PodGroup ml/big could be placed (...): none freed"
    gang = [pod("big-0", node=None, pod_group="big", annotations={QUEUE_BLOCKED: why}),
            pod("big-1", node=None, pod_group="big")]
    r = report(gang, [])
    assert [(q.pod, q.not_freed) for q in r.queue] == [("big-0", why), ("big-1", "")]
    table = to_table(r)
    assert "Not freed for waiting gangs" in table and why in table
    assert why in to_html(r)
    assert "Not freed" not in to_table(report([pod("one", node=None)], []))


def test_the_queue_lists_pending_gpu_pods_by_team_and_class_with_their_wait():
    waiting = [pod("p1", 2, node=None, started=NOW - 120, unschedulable_since=NOW - 100),
               pod("p2", 1, node=None, started=NOW - 30)]
    r = report(waiting, [])
    assert [(q.pod, q.wait_seconds, q.unschedulable) for q in r.queue] == [
        ("p1", 120.0, True), ("p2", 30.0, False)]
    (g,) = r.queue_groups
    assert (g.team, g.cls, g.pods, g.gpus, g.longest_wait_seconds) == (
        "vision", "batch", 2, 3, 120.0)


def test_the_queue_says_what_is_reserved_for_whom_and_until_when():
    until = stamp(NOW + 60)
    held = pod("want", 4, node=None, started=NOW - 120, nominated_node="h1",
               annotations={RESERVED: json.dumps({"node": "h1", "gpus": 4, "priority": 0,
                                                  "until": until})})
    over = pod("late", 4, node=None, started=NOW - 60, annotations={RESERVED: json.dumps(
        {"node": "h1", "gpus": 4, "priority": 0, "until": stamp(NOW - 1)})})
    r = report([held, over], [])
    assert [(q.pod, q.reserved_node, q.reserved_until) for q in r.queue] == [
        ("want", "h1", until), ("late", "", "")]
    text = to_table(r)
    assert "Reserved for waiting pods" in text
    assert [line.split() for line in text.splitlines() if "ml/want" in line] == [
        ["ml/want", "vision", "4", "h1", until]]
    assert "ml/late" not in text
    assert "Reserved for waiting pods" in to_html(r)
    assert "Reserved for waiting pods" not in to_table(report([over], []))


def test_teams_against_quotas_split_idle_gpus_within_and_beyond_the_quota():
    r = report([pod("first", started=NOW - 7200), pod("second")],
               [samples("first", ZERO), samples("second", ZERO)])
    (vision,) = r.quotas
    assert (vision.quota, vision.used, vision.borrowed) == (1, 2.0, 1.0)
    assert (vision.idle_within_quota, vision.idle_borrowed) == (1.0, 1.0)


def test_grouping_by_an_unknown_dimension_is_refused():
    with pytest.raises(ValueError, match="--by"):
        report([], [], by="colour")


@pytest.mark.parametrize("broken", [float("nan"), float("inf"), float("-inf"), -5.0, 150.0])
def test_a_broken_reading_makes_the_pod_unknown_never_idle(broken):
    """The report judges a pod by the reclaimer's own rule (issue 13): a NaN slot is no sample,
    and a peak that is no reading leaves the pod unknown, wherever it falls in the window."""
    for values in ([broken] + ZERO[1:], ZERO[:-1] + [broken]):
        series = [samples("a", values)]
        (group,) = report([pod("a")], series).groups
        assert (group.idle, group.unknown) == (0.0, 1.0)
        assert group.unknown_gpu_hours == pytest.approx(HOURS / 10)  # the broken slot
        (u,) = pod_usages(ReportInput(Snapshot(NOW, (pod("a"),), {n.name: n for n in NODES},
                                               {}, {}, {}, True), WINDOW, tuple(series)), POLICY)
        assert u.state == "unknown" and "not a value in 0-100%" in u.why


def test_the_decision_column_has_a_word_for_every_verdict_and_for_a_halted_cycle():
    # The report shows the reclaimer's verdicts through its own vocabulary; a verdict state it
    # had no word for would fail the report, not just print oddly.
    assert {str(s) for s in VerdictState} <= {str(s) for s in DecisionState}
    snap = Snapshot(now=NOW, pods=(pod("a"),), nodes={n.name: n for n in NODES}, owners={},
                    namespace_labels={}, evidence={}, telemetry_ok=False,
                    telemetry_problem="prometheus down")
    (decision,) = decisions(snap, POLICY).values()
    assert (decision.state, decision.action) == ("halted", "none")
    assert "prometheus down" in decision.why


def test_the_decision_shows_the_cooldown_the_reclaimer_noted_on_the_pod():
    """The report reads no ledger; the reclaimer's note (COOLDOWN_UNTIL) says the workload is
    inside its reclaimCooldown, and the plan's own bookkeeping of that note is not shown."""
    ev = {"ml/a": Evidence(1800.0, 0.0, 1.0, 1), "ml/b": Evidence(1800.0, 0.0, 1.0, 1)}
    snap = Snapshot(now=NOW, pods=(
        pod("a", annotations={COOLDOWN_UNTIL: stamp(NOW + 60)}),
        pod("b", annotations={COOLDOWN_UNTIL: stamp(NOW - 60)})),
        nodes={n.name: n for n in NODES}, owners={}, namespace_labels={},
        evidence={1800.0: ev}, telemetry_ok=True, telemetry_problem="")
    found = decisions(snap, POLICY)
    assert (found["ml/a"].state, found["ml/a"].action, found["ml/a"].why) == (
        "protected", "none", f"inside reclaimCooldown until {stamp(NOW + 60)}")
    assert found["ml/b"].state == "idle" and found["ml/b"].action != "cool"


def test_faulty_gpus_are_neither_idle_waste_nor_free():
    # h1 has a pod on a GPU with an XID (idle by its readings); l1 is quarantined by NVSentinel
    # (its free GPUs are faulty, not free) and its device plugin reports one GPU unhealthy.
    xid = Fault(Source.XID, "XID 79 on GPU 0 within the health window")
    quarantined = Node("l1", L4, 3, resources={"nvidia.com/gpu": 3},
                       capacity={"nvidia.com/gpu": 4},
                       annotation_keys=frozenset({"quarantineHealthEvent"}))
    pods = [pod("broken"), pod("idle"), pod("on-l1", node="l1")]
    nodes = (NODES[0], quarantined)
    faults = pod_faults(pods, {n.name: n for n in nodes}, POLICY.health, {"ml/broken": xid})
    r = report(pods, [samples("broken", ZERO), samples("idle", ZERO, gpu="1"),
                      samples("on-l1", ZERO, node="l1")], by="card", nodes=nodes, faults=faults)
    h100, l4 = r.groups
    assert (h100.idle, h100.faulty, h100.free, h100.idle_gpu_hours) == (1.0, 1.0, 6.0,
                                                                        pytest.approx(HOURS))
    assert h100.idle_cost == pytest.approx(HOURS * 3.0)  # the healthy idle pod only
    # on-l1 is faulty (its node is quarantined); 2 free GPUs there are faulty, 1 unhealthy
    assert (l4.allocatable, l4.allocated, l4.idle, l4.faulty, l4.free) == (3.0, 1.0, 0.0, 4.0,
                                                                           0.0)
    assert [(f.pod, f.fault) for f in r.faulty] == [
        ("broken", str(xid)), ("on-l1", "node l1 annotated quarantineHealthEvent "
                                         "(node-annotation)")]
    assert "Pods on faulty GPUs" in to_table(r)


def test_free_dra_devices_tainted_by_a_health_key_are_faulty_not_free():
    # A DRA node's devices as core/drafleet.py joins them: one free device NVIDIA's DRA driver
    # tainted after XID 79, one withheld by an operator's maintenance taint (not a fault).
    xid = Taint("gpu.nvidia.com/xid", "79", "NoSchedule")
    maintenance = Taint("example.com/maintenance", "", "NoSchedule")
    dra = Node("d1", L4, 4, resources={"nvidia.com/gpu": 4},
               withheld=(WithheldDevice("nvidia.com/gpu", xid),
                         WithheldDevice("nvidia.com/gpu", maintenance)))
    pods = [pod("on-d1", node="d1")]
    r = report(pods, [samples("on-d1", ZERO, node="d1")], by="card", nodes=(NODES[0], dra))
    (l4,) = [g for g in r.groups if g.name == L4]
    assert (l4.allocatable, l4.allocated, l4.faulty, l4.free) == (4.0, 1.0, 1.0, 2.0)
    assert r.faulty == ()  # the pod's own device is untainted
