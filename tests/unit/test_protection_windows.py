"""Protection windows (docs/policy.md, "Protection windows"): minRuntime and reclaimCooldown in
the reclaimer's decision, its ledger, the preempt verb and the what-if replay."""

from __future__ import annotations

import json

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from gpusteward.core.fleet import FleetStore
from gpusteward.core.kubewire import WirePod, to_pod
from gpusteward.core.model import Node
from gpusteward.core.policy import PolicyError, parse_policy
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import (
    COOLDOWN_UNTIL,
    Evidence,
    Owner,
    PastAction,
    VerdictState,
)
from gpusteward.core.reclaim.rules import remembered, shelter_of
from gpusteward.core.times import HOUR, stamp
from gpusteward.core.whatif import replay as replay_module
from gpusteward.core.whatif.replay import replay
from gpusteward.extender.preempt import Preempter
from gpusteward.extender.preemptwire import decode_preemption_args
from gpusteward.sandbox.ksm import pod_families
from tests.unit.test_reclaim_decide import NOW, gpu_pod, kinds, pending, snapshot, warned
from tests.unit.test_reclaim_loop import Ledger, reclaimer
from tests.unit.test_whatif_replay import IDLE, history, record, t
from tests.unit.test_whatif_replay import policy as replay_policy

NOTEBOOK = {"gpusteward.io/class": "experiment"}


def windows_policy(**experiment):
    return parse_policy({"reclaim": {"reclaimCooldown": "10m"},
                         "classes": {"batch": {}, "experiment": {"preferredTiers": ["standard"],
                                                                 **experiment}}})


def test_a_class_inherits_the_reclaim_windows_unless_it_sets_its_own():
    p = windows_policy(minRuntime="1h")
    assert shelter_of("experiment", p) == (3600.0, 600.0)
    assert shelter_of("batch", p) == (0.0, 600.0)
    assert remembered(p) == HOUR  # a 10-minute cooldown: the limits' hour is the longer
    assert remembered(windows_policy(reclaimCooldown="6h")) == 6 * HOUR


def test_windows_beyond_a_day_are_refused_naming_the_field():
    with pytest.raises(PolicyError) as e:
        parse_policy({"classes": {"batch": {}, "experiment": {"minRuntime": "2d"}},
                      "reclaim": {"reclaimCooldown": "-1s"}})
    text = str(e.value)
    assert "classes.experiment.minRuntime" in text and "reclaim.reclaimCooldown" in text


# --- minRuntime in the reclaimer --------------------------------------------------------------

def verdict(p, name: str):
    return next(v for v in p.verdicts if v.pod == f"ml/{name}")


def test_an_idle_pod_inside_its_minruntime_is_protected_and_counted_from_its_start():
    pol = windows_policy(minRuntime="1h")
    # Created two hours ago but started (status.startTime) 50 minutes ago: the run counts.
    young = gpu_pod("nb", labels=NOTEBOOK, started_at=NOW - 3000)
    p = plan(snapshot([young]), pol)
    v = verdict(p, "nb")
    assert v.state == VerdictState.PROTECTED
    assert v.reasons == (f"inside minRuntime: running 3000s of 3600s, until "
                         f"{stamp(NOW + 600)}",)
    assert kinds(p) == []
    # A batch pod (no minRuntime of its own, none inherited) started as late is marked.
    assert kinds(plan(snapshot([gpu_pod("b", started_at=NOW - 3000)]), pol)) == [("mark", "b")]


def test_the_window_closing_lets_the_usual_stages_follow():
    pol = windows_policy(minRuntime="1h")
    pod = gpu_pod("nb", labels=NOTEBOOK, started_at=NOW - 3600)
    assert kinds(plan(snapshot([pod]), pol)) == [("mark", "nb")]


def test_without_a_start_time_the_binding_then_the_creation_counts():
    pol = windows_policy(minRuntime="1h")
    bound = gpu_pod("nb", labels=NOTEBOOK, bound_at=NOW - 60)  # created 2 h ago
    assert verdict(plan(snapshot([bound]), pol), "nb").state == VerdictState.PROTECTED
    assert kinds(plan(snapshot([gpu_pod("nb", labels=NOTEBOOK)]), pol)) == [("mark", "nb")]


def test_a_marked_pod_whose_window_opens_has_its_marks_cleared_with_the_reason():
    pol = windows_policy(minRuntime="1h")
    marked = gpu_pod("nb", labels=NOTEBOOK, started_at=NOW - 60,
                     annotations={"gpusteward.io/idle-since": stamp(NOW - 600)})
    (clear,) = plan(snapshot([marked]), pol).actions
    assert clear.kind == "clear" and "inside minRuntime" in clear.message


def test_the_queue_claims_no_pod_inside_its_minruntime():
    pol = windows_policy(minRuntime="1h")
    young = gpu_pod("nb", gpus=4, priority=10, labels=NOTEBOOK, started_at=NOW - 60)
    old = gpu_pod("old", gpus=4, priority=10, node="n2")
    want = pending("want", 4, 1000)
    nodes = [Node("n1", "NVIDIA-H100-80GB-HBM3", 4), Node("n2", "NVIDIA-H100-80GB-HBM3", 4)]
    p = plan(snapshot([young, want], nodes=nodes), pol)
    assert [a.pod.name for a in p.actions if a.kind == "reclaim"] == []
    # The same waiting pod takes the idle pod past its window instead.
    p = plan(snapshot([young, old, want], nodes=nodes), pol)
    assert [(a.pod.name, a.reason) for a in p.actions if a.kind == "reclaim"] == [
        ("old", "queue")]


# --- reclaimCooldown in the reclaimer ---------------------------------------------------------

JOB = Owner("Job", "ml", "train", ("train-1",), how="suspend")


def test_a_workload_back_inside_its_cooldown_is_not_reclaimed_again():
    pol = windows_policy()  # reclaimCooldown 10m for every class
    due = gpu_pod("train-1", annotations={"gpusteward.io/idle-since": stamp(NOW - HOUR),
                                          "gpusteward.io/reclaim-at": stamp(NOW - 60)})
    before = PastAction(NOW - 300, "default", "ml/train-0", owner=JOB.key)
    p = plan(snapshot([due], owners={"train-1": JOB}, recent=(before,)), pol)
    # the cooldown's end is noted on the pod first, for the extender's preempt verb
    assert [(a.kind, a.until) for a in p.actions] == [("cool", NOW + 300), ("clear", None)]
    assert verdict(p, "train-1").reasons == (
        f"inside reclaimCooldown: Job train was reclaimed at {stamp(NOW - 300)}, "
        f"not again until {stamp(NOW + 300)}",)
    # Past the cooldown (or another workload's reclaim, or an entry of an older version
    # without an owner): reclaimed as usual.
    for past in (PastAction(NOW - 600, "default", "ml/train-0", owner=JOB.key),
                 PastAction(NOW - 300, "default", "ml/other", owner="ml/Job/other"),
                 PastAction(NOW - 300, "default", "ml/train-0")):
        p = plan(snapshot([due], owners={"train-1": JOB}, recent=(past,)), pol)
        assert [(a.kind, a.how) for a in p.actions] == [("reclaim", "suspend")], past


def test_the_cooldown_note_is_written_once_and_removed_when_the_cooldown_ends():
    pol = windows_policy()
    before = PastAction(NOW - 300, "default", "ml/train-0", owner=JOB.key)
    noted = gpu_pod("train-1", annotations={COOLDOWN_UNTIL: stamp(NOW + 300)})
    p = plan(snapshot([noted], owners={"train-1": JOB}, recent=(before,)), pol)
    assert "cool" not in [a.kind for a in p.actions]  # already says so
    p = plan(snapshot([noted], owners={"train-1": JOB}, recent=(before,), now=NOW + 301), pol)
    assert [(a.kind, a.until) for a in p.actions if a.kind == "cool"] == [("cool", None)]


# --- the reclaimer's ledger remembers a reclaim for the longest cooldown ----------------------

async def test_the_ledger_keeps_a_reclaim_for_the_cooldown_with_its_workload():
    pol = parse_policy({"reclaim": {"mode": "enforce", "reclaimCooldown": "3h"}})
    old = [PastAction(NOW - 2 * HOUR, "t", "ml/a", owner="ml/Job/a"),
           PastAction(NOW - 4 * HOUR, "t", "ml/b", owner="ml/Job/b")]
    ledger = Ledger(old)
    rec = reclaimer([warned("due")], ledger=ledger, policy=pol)
    await rec.cycle()
    # 2 h old: kept for the 3 h cooldown (past the limits' hour); 4 h old: forgotten. The new
    # reclaim names its workload.
    assert ledger.entries == [old[0], PastAction(NOW, "ml", "ml/due", owner="ml/Pod/due")]
    assert rec.reader.recent == [old[0]]


# --- the preempt verb -------------------------------------------------------------------------

class NoEvidence:
    async def evidence(self, pods, now):
        return {1800.0: {p.key: Evidence(1800.0, 0.0, 1.0, p.gpus) for p in pods}}, True, ""


def preempter(pol, *pods):
    fleet = FleetStore()
    fleet.replace_all([], list(pods))
    return Preempter(pol, fleet, NoEvidence(), CollectorRegistry(), clock=lambda: NOW)


def ask(*nodes: tuple[str, str]) -> bytes:
    urgent = {"metadata": {"name": "urgent", "namespace": "ml", "uid": "pre"},
              "spec": {"containers": []}}
    return json.dumps({"Pod": urgent, "NodeNameToMetaVictims": {
        n: {"Pods": [{"UID": u}], "NumPDBViolations": 0} for n, u in nodes}}).encode()


def kept(p: Preempter, body: bytes) -> list[str]:
    return list(json.loads(p.answer(decode_preemption_args(body)).body)["NodeNameToMetaVictims"])


async def test_the_verb_vetoes_a_victim_inside_its_minruntime_until_the_window_closes():
    pol = windows_policy(minRuntime="1h")
    young = gpu_pod("nb", node="h1", labels=NOTEBOOK, started_at=NOW - 600)
    old = gpu_pod("old", node="h2", labels=NOTEBOOK, started_at=NOW - 2 * HOUR)
    p = preempter(pol, young, old)
    await p.refresh()
    # Both idle: without the window the scheduler may take either.
    assert kept(p, ask(("h1", "nb"), ("h2", "old"))) == ["h2"]
    assert kept(p, ask(("h1", "nb"))) == []  # the preemptor waits
    p.clock = lambda: NOW + 3000  # the window has closed
    assert kept(p, ask(("h1", "nb"), ("h2", "old"))) == ["h1", "h2"]


async def test_a_pod_bound_since_the_last_refresh_is_judged_from_the_watch():
    pol = windows_policy(minRuntime="1h")
    p = preempter(pol, gpu_pod("old", node="h2", started_at=NOW - 2 * HOUR))
    await p.refresh()
    p.fleet.upsert_pod(gpu_pod("nb", node="h1", labels=NOTEBOOK, started_at=NOW - 5))
    assert kept(p, ask(("h1", "nb"), ("h2", "old"))) == ["h2"]


async def test_the_verb_vetoes_a_victim_whose_workload_is_inside_its_cooldown():
    """The reclaimer notes the cooldown on the pod (COOLDOWN_UNTIL): the verb reads no
    ledger, only the pods its watch holds."""
    cooled = gpu_pod("nb", node="h1", annotations={COOLDOWN_UNTIL: stamp(NOW + 300)})
    p = preempter(parse_policy({}), cooled, gpu_pod("old", node="h2"))
    await p.refresh()
    assert kept(p, ask(("h1", "nb"), ("h2", "old"))) == ["h2"]
    p.clock = lambda: NOW + 301  # the cooldown is over
    assert kept(p, ask(("h1", "nb"), ("h2", "old"))) == ["h1", "h2"]


async def test_without_any_minruntime_the_verb_shelters_nothing():
    p = preempter(parse_policy({}), gpu_pod("nb", node="h1", started_at=NOW - 5),
                  gpu_pod("old", node="h2"))
    await p.refresh()
    assert kept(p, ask(("h1", "nb"), ("h2", "old"))) == ["h1", "h2"]


# --- the start time, from the API server and from kube-state-metrics --------------------------

def test_the_start_time_is_read_from_the_pod_status():
    wire = msgspec.json.decode(json.dumps({
        "metadata": {"name": "p", "namespace": "ml", "uid": "u",
                     "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {
            "limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running", "startTime": "2026-12-01T10:05:00Z"}}), type=WirePod)
    pod = to_pod(wire, ["nvidia.com/gpu"])
    assert pod.run_start == pod.created_at + 300


def test_the_ksm_stand_in_serves_the_start_time_once_the_kubelet_set_it():
    pods = [{"metadata": {"name": "a", "namespace": "ml", "uid": "ua"},
             "status": {"startTime": "2026-12-01T10:05:00Z"}},
            {"metadata": {"name": "b", "namespace": "ml", "uid": "ub"}, "status": {}}]
    (started,) = [f for f in pod_families(pods) if f.name == "kube_pod_start_time"]
    assert [(dict(s.labels)["pod"], s.value) for s in started.samples] == [("a", "1796119500")]


# --- the what-if replay -----------------------------------------------------------------------

def test_the_replay_holds_a_pod_inside_its_minruntime_and_marks_it_when_it_closes():
    pol = replay_policy(minRuntime="20m")
    out = replay(history(record("nb", IDLE, first=0)), pol)
    (w,) = out.warned
    # Recorded running from step 0: marked at step 20 (the window's end), warned at 21.
    assert w.at == t(21)
    assert replay(history(record("nb", IDLE, first=0)), pol, every_step=True) == out


def test_the_replay_keeps_a_recreated_pod_inside_its_cooldown():
    pol = replay_policy(reclaimCooldown="30m")
    first = record("nb", IDLE, first=0, last=12)
    again = msgspec.structs.replace(record("nb", IDLE, first=14), pod=msgspec.structs.replace(
        record("nb", IDLE, first=14).pod, uid="nb-2"))
    out = replay(history(first, again), pol)
    (r1, r2) = out.reclaimed
    # The first: marked at step 3, warned at 4, reclaimed at 9 (grace 300 s). The re-created
    # pod would be warned at 15 and reclaimed at 20 (below); inside the cooldown it waits for
    # its end (step 39: marked), is warned at 40 and reclaimed at 45.
    assert (r1.at, r2.at) == (t(9), t(45))
    assert [w.at for w in out.warned] == [t(4), t(40)]
    assert replay(history(first, again), pol, every_step=True) == out
    without = replay(history(first, again), replay_policy())
    assert [r.at for r in without.reclaimed] == [t(9), t(20)]


def test_the_replay_notes_the_cooldown_once_and_skips_the_quiet_steps(monkeypatch):
    """The cooldown's note is carried onto the replayed pod as the actor writes it: planned
    again each step, it would count as a change and keep the fast replay from skipping."""
    pol = replay_policy(reclaimCooldown="30m")
    first = record("nb", IDLE, first=0, last=12)
    again = msgspec.structs.replace(record("nb", IDLE, first=14), pod=msgspec.structs.replace(
        record("nb", IDLE, first=14).pod, uid="nb-2"))
    calls = []

    def counted(snap, policy):
        calls.append(snap.now)
        return plan(snap, policy)

    monkeypatch.setattr(replay_module, "plan", counted)
    replay(history(first, again), pol)
    # noted at step 14, the next step planned once more; then quiet until the cooldown ends
    # (step 39: the note removed, the pod marked)
    assert [at for at in calls if t(16) <= at < t(39)] == []
    assert t(39) in calls
