"""Reclaim decisions, rule by rule (docs/architecture.md, "Where each rule lives"), explicit
`now`."""

from __future__ import annotations

import pytest

from gpusteward.core.model import Node, Pod
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.decide import parse_stamp, plan
from gpusteward.core.reclaim.model import (
    IDLE_SINCE,
    OPT_OUT,
    RECLAIM_AT,
    Evidence,
    Owner,
    PastAction,
    Snapshot,
)
from gpusteward.core.reclaim.rules import rule_for, windows
from gpusteward.core.times import HOUR, stamp
from tests.factories import H100, L4

NOW = 1_800_000_000.0
WINDOW = 1800.0  # the policy default
POLICY = parse_policy({})


def gpu_pod(name: str, *, node: str | None = "n1", gpus: int = 1, priority: int = 0,
            ns: str = "ml", age: float = 2 * HOUR, annotations: dict | None = None,
            labels: dict | None = None, **kw) -> Pod:
    return Pod(namespace=ns, name=name, uid=name, gpus=gpus, node=node,
               phase="Running" if node else "Pending", priority=priority,
               created_at=NOW - age, annotations=annotations or {}, labels=labels or {}, **kw)


def idle(window: float = WINDOW, peak: float = 1.0, coverage: float = 1.0,
         gpus: int = 1) -> Evidence:
    return Evidence(window=window, peak_percent=peak, coverage=coverage, gpus_seen=gpus)


def snapshot(pods: list[Pod], evidence: dict[str, Evidence] | None = None, *,
             nodes: list[Node] | None = None, owners: dict[str, Owner] | None = None,
             extra_windows: dict[float, dict[str, Evidence]] | None = None,
             telemetry_ok: bool = True, recent: tuple[PastAction, ...] = (),
             now: float = NOW) -> Snapshot:
    ev = {WINDOW: evidence if evidence is not None else {p.key: idle(gpus=p.gpus) for p in pods}}
    ev.update(extra_windows or {})
    nodes = nodes or [Node("n1", H100, 8)]
    return Snapshot(now=now, pods=tuple(pods), nodes={n.name: n for n in nodes},
                    owners=owners or {}, namespace_labels={}, evidence=ev,
                    telemetry_ok=telemetry_ok, telemetry_problem="" if telemetry_ok else "down",
                    recent_actions=recent)


def kinds(p) -> list[tuple[str, str]]:
    return [(a.kind, a.pod.name) for a in p.actions]


def warned(name: str, due_in: float = -60, annotations: dict | None = None, **kw) -> Pod:
    """A pod already marked idle and warned; its deadline is due_in seconds from now."""
    marks = {IDLE_SINCE: stamp(NOW - HOUR), RECLAIM_AT: stamp(NOW + due_in)}
    return gpu_pod(name, annotations={**marks, **(annotations or {})}, **kw)


# --- rule 1: idle evidence --------------------------------------------------------------------

@pytest.mark.parametrize(
    ("evidence", "state"),
    [
        pytest.param(idle(peak=2.0), "idle", id="peak-below-threshold-is-idle"),
        pytest.param(idle(peak=5.0), "busy", id="peak-at-threshold-is-busy"),
        pytest.param(idle(peak=90.0), "busy", id="busy"),
        pytest.param(idle(coverage=0.5), "unknown", id="low-coverage-is-unknown-not-idle"),
        pytest.param(None, "unknown", id="missing-series-is-unknown-not-idle"),
        pytest.param(Evidence(window=WINDOW), "unknown", id="no-samples-is-unknown"),
        # NaN fails every comparison, so `peak >= threshold` alone judged it idle (issue 13).
        pytest.param(idle(peak=float("nan")), "unknown", id="nan-is-unknown-not-idle"),
        pytest.param(idle(peak=float("-inf")), "unknown", id="minus-inf-is-unknown-not-idle"),
        pytest.param(idle(peak=float("inf")), "unknown", id="plus-inf-is-unknown"),
        pytest.param(idle(peak=-3.0), "unknown", id="negative-is-unknown-not-idle"),
        pytest.param(idle(peak=250.0), "unknown", id="above-100-is-unknown"),
    ],
)
def test_idle_evidence_is_the_peak_over_the_window_with_enough_coverage(evidence, state):
    pod = gpu_pod("p")
    p = plan(snapshot([pod], {} if evidence is None else {pod.key: evidence}), POLICY)
    assert p.verdicts[0].state == state
    assert kinds(p) == ([("mark", "p")] if state == "idle" else [])


def test_a_pod_whose_gpus_are_only_partly_covered_is_unknown():
    pod = gpu_pod("p", gpus=2)
    p = plan(snapshot([pod], {pod.key: idle(gpus=1)}), POLICY)
    assert p.verdicts[0].state == "unknown"
    assert "covers 1 of its 2 GPUs" in p.verdicts[0].reasons[0]


def test_a_briefly_busy_pod_is_not_idle_because_the_peak_counts():
    pod = gpu_pod("p")
    assert plan(snapshot([pod], {pod.key: idle(peak=70)}), POLICY).verdicts[0].state == "busy"


# --- rule 2: no telemetry, no action ----------------------------------------------------------

def test_stale_or_unreachable_telemetry_means_no_action_this_cycle():
    p = plan(snapshot([warned("p")], telemetry_ok=False), POLICY)
    assert p.actions == () and p.halted.startswith("telemetry unavailable")


# --- rule 3: protections ----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("pod", "owner", "policy", "reason"),
    [
        pytest.param(warned("p", priority=1_000_000), None, POLICY, "priority",
                     id="protected-priority"),
        pytest.param(warned("p"), Owner("DaemonSet", "ml", "ds"), POLICY, "DaemonSet",
                     id="daemonset-pod"),
        pytest.param(warned("p", mirror=True), None, POLICY, "static", id="static-mirror-pod"),
        pytest.param(warned("p", deleting=True), None, POLICY, "terminating",
                     id="terminating-pod"),
        # The scheduler's preemption is taking it: one path per pod (docs/operations.md).
        pytest.param(warned("p", preempted=True), None, POLICY, "preempted by the scheduler",
                     id="being-preempted"),
        pytest.param(warned("p", ns="kube-system"), None, POLICY, "excluded",
                     id="excluded-namespace"),
        pytest.param(warned("p", labels={"tier": "prod"}), None,
                     parse_policy({"reclaim": {"excludePodLabels": {"tier": "prod"}}}),
                     "excludePodLabels", id="excluded-labels"),
        pytest.param(gpu_pod("p", annotations={OPT_OUT: "never"}), None, POLICY, "opted out",
                     id="opt-out-honoured"),
        pytest.param(gpu_pod("p", age=60), None, POLICY, "younger", id="too-young"),
        pytest.param(warned("p", priority_class="vip"), None,
                     parse_policy({"reclaim": {"priorityClasses": {"vip": {"protected": True}}}}),
                     "PriorityClass vip", id="protected-priority-class"),
    ],
)
def test_protected_pods_are_never_touched_and_say_why(pod, owner, policy, reason):
    owners = {pod.uid: owner} if owner else {}
    p = plan(snapshot([pod], owners=owners), policy)
    assert p.verdicts[0].state == "protected"
    assert any(reason in r for r in p.verdicts[0].reasons)
    assert not [a for a in p.actions if a.kind != "clear"]


def test_opt_out_is_ignored_where_the_policy_does_not_allow_it():
    pod = gpu_pod("p", annotations={OPT_OUT: "never"})
    p = plan(snapshot([pod]), parse_policy({"reclaim": {"allowOptOut": False}}))
    assert kinds(p) == [("mark", "p")]


def test_a_marked_pod_that_becomes_protected_has_its_marks_cleared():
    pod = warned("p", due_in=600, annotations={OPT_OUT: "never"})
    assert kinds(plan(snapshot([pod]), POLICY)) == [("clear", "p")]


# --- rule 4: staged and reversible ------------------------------------------------------------

def test_stages_mark_then_warn_then_reclaim_at_the_deadline():
    fresh = gpu_pod("p")
    assert kinds(plan(snapshot([fresh]), POLICY)) == [("mark", "p")]
    marked = gpu_pod("p", annotations={IDLE_SINCE: stamp(NOW - 60)})
    warn = plan(snapshot([marked]), POLICY).actions[0]
    assert warn.kind == "warn" and warn.reclaim_at == NOW + 900  # default grace 15m
    assert kinds(plan(snapshot([warned("p", due_in=+60)]), POLICY)) == []
    assert kinds(plan(snapshot([warned("p", due_in=-1)]), POLICY)) == [("reclaim", "p")]


def test_renewed_activity_clears_the_marks():
    pod = warned("p", due_in=-60)
    p = plan(snapshot([pod], {pod.key: idle(peak=60)}), POLICY)
    assert [(a.kind, a.reason) for a in p.actions] == [("clear", "active")]


def test_unknown_evidence_neither_advances_nor_clears():
    pod = warned("p", due_in=-60)
    assert plan(snapshot([pod], {pod.key: idle(coverage=0.1)}), POLICY).actions == ()


def test_stamps_round_trip():
    assert parse_stamp(stamp(NOW)) == NOW
    assert parse_stamp("garbage") is None


# --- rule 5: owner-aware action ---------------------------------------------------------------

@pytest.mark.parametrize(
    ("owner", "how"),
    [
        pytest.param(None, "evict", id="bare-pod-is-evicted"),
        pytest.param(Owner("Job", "ml", "j", ("p",)), "suspend", id="job-is-suspended"),
        pytest.param(Owner("Deployment", "ml", "d", ("p",)), "scale", id="deployment-scaled"),
        pytest.param(Owner("StatefulSet", "ml", "s", ("p",)), "scale", id="statefulset-scaled"),
        pytest.param(Owner("MPIJob", "ml", "m", ("p",), group="kubeflow.org"), "block",
                     id="unknown-owner-blocked-never-evicted"),
    ],
)
def test_the_action_depends_on_the_owner(owner, how):
    pod = warned("p")
    p = plan(snapshot([pod], owners={"p": owner} if owner else {}), POLICY)
    assert [(a.kind, a.how) for a in p.actions] == [("block" if how == "block" else "reclaim", how)]


def test_a_partly_idle_deployment_is_only_marked():
    a, b = warned("a"), gpu_pod("b")
    owner = Owner("Deployment", "ml", "serve", ("a", "b"))
    p = plan(snapshot([a, b], {a.key: idle(), b.key: idle(peak=80)},
                      owners={"a": owner, "b": owner}), POLICY)
    assert kinds(p) == []


def test_a_fully_idle_deployment_is_scaled_once():
    a, b = warned("a"), warned("b")
    owner = Owner("Deployment", "ml", "serve", ("a", "b"))
    p = plan(snapshot([a, b], owners={"a": owner, "b": owner}), POLICY)
    assert [(a.kind, a.how, a.owner.name) for a in p.actions] == [("reclaim", "scale", "serve")]


def test_owner_action_annotate_never_reclaims():
    policy = parse_policy({"reclaim": {"ownerActions": {"pod": "annotate"}}})
    assert kinds(plan(snapshot([warned("p")]), policy)) == []


# --- rule 6: team quotas ----------------------------------------------------------------------

QUOTA = parse_policy({"teams": {"vision": {"quotaGpus": 1}, "nlp": {"quotaGpus": 4}},
                      "reclaim": {"limits": {"maxPerCycle": 1}}})


def team_pod(name: str, team: str, age: float, **kw) -> Pod:
    return warned(name, labels={"gpusteward.io/team": team}, age=age, **kw)


def test_borrowed_gpus_beyond_the_quota_are_reclaimed_first():
    # vision holds 2 GPUs on a quota of 1: its newer pod is borrowed; nlp is within quota.
    pods = [team_pod("v-old", "vision", 5 * HOUR), team_pod("v-new", "vision", 3 * HOUR),
            team_pod("n-1", "nlp", 5 * HOUR)]
    long = float(QUOTA.reclaim.within_quota_window)
    ev = {p.key: idle(window=long) for p in pods}  # 1 GPU each
    p = plan(snapshot(pods, extra_windows={long: ev}), QUOTA)
    assert [(a.pod.name, a.reason) for a in p.actions] == [("v-new", "over-quota")]
    assert {v.pod: v.borrowed for v in p.verdicts} == {"ml/v-old": False, "ml/v-new": True,
                                                       "ml/n-1": False}


def test_within_quota_idle_gpus_wait_for_the_longer_window():
    pod = team_pod("n-1", "nlp", 5 * HOUR)
    long = float(QUOTA.reclaim.within_quota_window)
    busy_long_ago = {pod.key: idle(window=long, peak=80)}
    p = plan(snapshot([pod], extra_windows={long: busy_long_ago}), QUOTA)
    assert p.verdicts[0].state == "busy" and p.verdicts[0].rule.window == long
    assert windows(QUOTA, (pod,)) == {WINDOW, long}


# --- rule 7: queue enforcement ----------------------------------------------------------------

def pending(name: str, gpus: int, priority: int, *, waited: float = 600, **kw) -> Pod:
    return gpu_pod(name, node=None, gpus=gpus, priority=priority,
                   unschedulable_since=NOW - waited, **kw)


def queue_snapshot(extra: list[Pod]) -> Snapshot:
    pods = [gpu_pod("low", node="n1", gpus=4, priority=10),
            gpu_pod("high", node="n2", gpus=4, priority=5000),
            gpu_pod("busy-low", node="n2", gpus=4, priority=1), *extra]
    ev = {p.key: idle(gpus=p.gpus) for p in pods}
    ev["ml/busy-low"] = idle(peak=90, gpus=4)
    return snapshot(pods, ev, nodes=[Node("n1", H100, 4), Node("n2", H100, 8),
                                     Node("l4", L4, 8)])


def reclaimed(p) -> list[tuple[str, str]]:
    return [(a.pod.name, a.reason) for a in p.actions if a.kind == "reclaim"]


def test_a_pending_pod_reclaims_exactly_the_right_lower_priority_idle_pod():
    p = plan(queue_snapshot([pending("want", 4, 1000, annotations={
        "gpusteward.io/card-types": "NVIDIA-H100*"})]), POLICY)
    assert reclaimed(p) == [("low", "queue")]  # never "high": its priority is above the pod's


@pytest.mark.parametrize(
    ("waiting", "why"),
    [
        pytest.param(pending("w", 4, 1000, waited=10), "waited too little", id="not-waited-enough"),
        pytest.param(pending("w", 4, 1000, preemption_policy="Never"), "Never",
                     id="preemption-policy-never"),
        pytest.param(pending("w", 4, 1000, nominated_node="n1"), "the scheduler preempts for it",
                     id="nominated-by-scheduler-preemption"),
        pytest.param(pending("w", 4, 5), "all idle pods outrank it", id="priority-too-low"),
        pytest.param(pending("w", 4, 1000, annotations={"gpusteward.io/card-types":
                                                        "NVIDIA-L4"}), "fits l4 already",
                     id="fits-without-reclaim"),
        pytest.param(pending("w", 4, 1000, node_selector={"zone": "b"}), "no node matches",
                     id="node-selector-excludes"),
    ],
)
def test_queue_enforcement_only_when_it_helps(waiting, why):
    assert [r for r in reclaimed(plan(queue_snapshot([waiting]), POLICY)) if r[1] == "queue"] == []


def test_the_smallest_victim_set_is_chosen():
    pods = [gpu_pod("a1", node="n1", gpus=1), gpu_pod("a2", node="n1", gpus=1),
            gpu_pod("a3", node="n1", gpus=2), gpu_pod("b", node="n2", gpus=4),
            pending("want", 4, 100)]
    p = plan(snapshot(pods, nodes=[Node("n1", H100, 4), Node("n2", H100, 4)]), POLICY)
    assert reclaimed(p) == [("b", "queue")]  # one victim on n2 beats three on n1


def test_equal_priority_only_from_an_over_quota_team_for_an_under_quota_team():
    policy = parse_policy({"teams": {"vision": {"quotaGpus": 2}, "nlp": {"quotaGpus": 8}}})
    hog = gpu_pod("hog", node="n1", gpus=4, priority=100, labels={"gpusteward.io/team": "vision"})
    want = pending("want", 4, 100, labels={"gpusteward.io/team": "nlp"})
    p = plan(snapshot([hog, want], nodes=[Node("n1", H100, 4)]), policy)
    assert reclaimed(p) == [("hog", "queue")]
    fair = parse_policy({"teams": {"vision": {"quotaGpus": 8}, "nlp": {"quotaGpus": 8}}})
    assert reclaimed(plan(snapshot([hog, want], nodes=[Node("n1", H100, 4)]), fair)) == []


# --- rule 8: limits ---------------------------------------------------------------------------

def test_limits_per_cycle_hour_and_team_hold_back_reclaims_with_a_reason():
    pods = [warned(f"p{i}", labels={"gpusteward.io/team": "t"}) for i in range(4)]
    policy = parse_policy({"reclaim": {"limits": {"maxPerCycle": 2, "maxPerHour": 30,
                                                  "maxPerTeamPerHour": 30}}})
    p = plan(snapshot(pods), policy)
    assert len(reclaimed(p)) == 2 and [why for _, why in p.held_back] == ["limit: 2 per cycle"] * 2
    recent = tuple(PastAction(NOW - 60, "t") for _ in range(3))
    team_cap = parse_policy({"reclaim": {"limits": {"maxPerTeamPerHour": 3}}})
    assert reclaimed(plan(snapshot(pods, recent=recent), team_cap)) == []
    hour_cap = parse_policy({"reclaim": {"limits": {"maxPerHour": 3}}})
    assert reclaimed(plan(snapshot(pods, recent=recent), hour_cap)) == []
    old = tuple(PastAction(NOW - 2 * HOUR, "t") for _ in range(30))
    assert len(reclaimed(plan(snapshot(pods, recent=old), hour_cap))) == 3


def test_an_owner_already_being_reclaimed_gets_no_second_action():
    job = Owner("Job", "ml", "j", ("p",), in_progress=True)
    p = plan(snapshot([warned("p")], owners={"p": job}), POLICY)
    assert reclaimed(p) == [] and "already being reclaimed" in p.held_back[0][1]


# --- rule resolution --------------------------------------------------------------------------

def test_class_and_priority_class_override_the_idle_rule():
    policy = parse_policy({"classes": {"batch": {"idle": {"window": "10m"}}},
                           "reclaim": {"priorityClasses": {"low": {"idle": {"grace": "1m"}}}}})
    rule = rule_for(gpu_pod("p", priority_class="low"), policy)
    assert (rule.window, rule.grace, rule.threshold_percent) == (600, 60, 5.0)


@pytest.mark.parametrize("peak", [float("nan"), float("inf"), float("-inf"), -3.0, 101.0])
def test_a_broken_reading_never_advances_a_warned_pod_and_says_why(peak):
    pod = warned("p")
    p = plan(snapshot([pod], {pod.key: idle(peak=peak)}), POLICY)
    assert [a.kind for a in p.actions if a.kind in ("mark", "warn", "reclaim")] == []
    assert p.verdicts[0].state == "unknown"
    assert any("not a value in 0-100%" in r for r in p.verdicts[0].reasons)


def test_idle_mig_slices_are_not_reclaimed_for_a_pod_waiting_for_whole_gpus():
    """A MIG-mixed node offers nvidia.com/mig-<profile> and 0 nvidia.com/gpu (GFD's mixed
    strategy, k8s-device-plugin internal/lm/mig-strategy.go): freeing its slices cannot place a
    pod that asks for whole GPUs."""
    mig = Node("m1", "NVIDIA-A100-SXM4-80GB", 7,
               resources={"nvidia.com/gpu": 0, "nvidia.com/mig-1g.10gb": 7})
    slices = [gpu_pod(f"s{i}", node="m1", resources={"nvidia.com/mig-1g.10gb": 1})
              for i in range(7)]
    want = pending("want", 4, 100, resources={"nvidia.com/gpu": 4})
    assert reclaimed(plan(snapshot([*slices, want], nodes=[mig]), POLICY)) == []
    small = pending("small", 1, 100, resources={"nvidia.com/mig-1g.10gb": 1})
    assert reclaimed(plan(snapshot([*slices, small], nodes=[mig]), POLICY)) == [("s0", "queue")]
