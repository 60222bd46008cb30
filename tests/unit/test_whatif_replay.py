"""What-if replay: the reclaimer's own plan() stepped through a recorded history.

Histories are built on the reclaimer's grid by hand (one value per cycle per GPU), so each
expected time follows from the policy: marked at the first cycle whose window is all idle,
warned the next cycle, reclaimed at the first cycle at or after warn + grace.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from gpusteward.core.model import Node, OwnerRef, Pod
from gpusteward.core.policy import Policy, parse_policy
from gpusteward.core.reclaim.model import Owner
from gpusteward.core.whatif.evidence import PodEvidence, sliding_max, sliding_sum
from gpusteward.core.whatif.history import NO_SAMPLE, GpuUse, Grid, History, PodRecord, Span
from gpusteward.core.whatif.replay import replay

START, STEP, STEPS = 1_800_000_000.0, 60.0, 60
SCRAPE = 30.0  # two samples per cycle


def policy(window: int = 300, grace: int = 300, **reclaim):
    return parse_policy({"telemetry": {"scrapeInterval": "30s"}, "reclaim": {
        "interval": "60s", "minPodAge": "1s",
        "idle": {"window": f"{window}s", "grace": f"{grace}s"}, **reclaim}})


def use(utils: list[float | None]) -> GpuUse:
    """Per-cycle utilization; None: no sample in that cycle."""
    return GpuUse([NO_SAMPLE if u is None else u for u in utils],
                  [0.0 if u is None else STEP / SCRAPE for u in utils])


def record(name: str, utils: list[float | None], *, gpus: int = 1, first: int = 0,
           last: int = STEPS - 1, node: str = "n1", pending: Span | None = None,
           owner: OwnerRef | None = None, **kw) -> PodRecord:
    kw.setdefault("labels", {"gpusteward.io/team": "vision"})
    pod = Pod(namespace="ml", name=name, uid=name, gpus=gpus, node=node,
              created_at=START - 3600, owners=(owner,) if owner else (), **kw)
    return PodRecord(pod, "NVIDIA H100 80GB HBM3", Span(first, last), pending,
                     tuple(use(utils) for _ in range(gpus)))


def history(*records: PodRecord, owners: dict | None = None, telemetry=(),
            steps: int = STEPS) -> History:
    return History(Grid(START, STEP, steps), records, {"n1": Node("n1", "H100", 8)},
                   owners or {}, SCRAPE, telemetry)


def t(i: int) -> float:
    return START + i * STEP


IDLE = [0.0] * STEPS
BUSY = [80.0] * STEPS


@pytest.mark.parametrize("k", [1, 2, 5, 7, 60], ids=lambda k: f"k={k}")
def test_sliding_figures_equal_the_window_computed_directly(k):
    rng = random.Random(k)
    values = [rng.choice([NO_SAMPLE, 0.0, 3.0, 90.0, float("inf")]) for _ in range(53)]
    assert list(sliding_max(values, k)) == [max(values[max(0, i - k + 1):i + 1])
                                            for i in range(len(values))]
    assert list(sliding_sum([1.0, 2.0] * 20, k)) == [
        sum(([1.0, 2.0] * 20)[max(0, i - k + 1):i + 1]) for i in range(40)]


def test_evidence_folds_gpus_like_the_live_reclaimer_highest_peak_worst_coverage():
    gpus = [use([10.0] * 10), use([50.0] * 5 + [None] * 5)]
    ev = PodEvidence(gpus, window=300, step=STEP, scrape_interval=SCRAPE).at(9)
    assert ev is not None
    assert ev.peak_percent == 10.0  # the second GPU has no sample in the last 5 cycles
    assert ev.gpus_seen == 1
    early = PodEvidence(gpus, 300, STEP, SCRAPE).at(4)
    assert early is not None and early.peak_percent == 50.0 and early.gpus_seen == 2
    assert early.coverage == pytest.approx(1.0)


def test_an_idle_pod_is_marked_warned_and_reclaimed_at_warn_plus_grace():
    out = replay(history(record("idle", IDLE, gpus=2)), policy(), "p")
    # window 300 s = 5 cycles: idle evidence from cycle 0 on (coverage 1 needs cycle 4 with the
    # default minCoverage 0.8: 4 of 5 cycles).
    (w,) = out.warned
    (r,) = out.reclaimed
    assert r.at == w.reclaim_at == w.at + 300
    assert r.pod == "ml/idle" and r.how == "evict" and r.gpus == 2
    assert r.gpu_hours == pytest.approx(2 * (t(STEPS - 1) - r.at) / 3600)
    assert out.hours_by("team") == {"vision": pytest.approx(r.gpu_hours)}
    assert out.hours_by("card") == {"NVIDIA H100 80GB HBM3": pytest.approx(r.gpu_hours)}


def test_a_busy_pod_is_never_warned():
    out = replay(history(record("busy", BUSY)), policy())
    assert out.warned == () and out.reclaimed == ()


def test_a_pod_busy_again_within_the_grace_is_a_false_positive_risk_not_a_reclaim():
    utils = [0.0] * 12 + [90.0] * (STEPS - 12)
    out = replay(history(record("nb", utils)), policy(grace=600))
    assert out.reclaimed == ()
    (c,) = out.comebacks
    assert c.pod == "ml/nb" and c.back_at == t(12) and c.peak_percent == 90.0
    assert c.idle_at < c.back_at


def test_busy_again_only_after_its_deadline_is_no_comeback_within_the_grace():
    # warned at cycle 4 (deadline 9); no samples from 5 to 15 (unknown: held, not reclaimed);
    # busy from 16 on
    out = replay(history(record("held", [0.0] * 5 + [None] * 11 + [90.0] * 44)), policy())
    assert len(out.warned) == 1 and out.reclaimed == () and out.comebacks == ()


def test_a_longer_window_frees_fewer_gpu_hours():
    pods = history(record("a", IDLE, gpus=4), record("b", [50.0] * 20 + [0.0] * 40))
    short, long = replay(pods, policy(window=300)), replay(pods, policy(window=1500))
    assert 0 < long.gpu_hours < short.gpu_hours


def test_protected_pods_stay_untouched_in_the_replay_as_live():
    out = replay(history(record("vip", IDLE, priority=2_000_000_000)), policy())
    assert out.warned == () and out.reclaimed == ()


def test_missing_telemetry_halts_those_cycles_and_nothing_is_reclaimed():
    out = replay(history(record("idle", IDLE), telemetry=[False] * STEPS), policy())
    assert out.halted_steps == STEPS and out.reclaimed == ()


def test_a_pod_without_any_gpu_series_is_never_judged():
    blind = msgspec.structs.replace(record("blind", IDLE), gpus=())
    assert replay(history(blind), policy()).warned == ()


def test_a_gap_in_a_pods_samples_is_unknown_never_idle():
    out = replay(history(record("gappy", [0.0, None, None, None] * 15)), policy())
    assert out.warned == ()


GANG = {"gpusteward.io/team": "vision", "kueue.x-k8s.io/pod-group-name": "train"}


def test_a_gang_is_replayed_whole_or_not_at_all():
    # The live rule (core/reclaim/gangs.py): a gang stopped by eviction goes whole once all its
    # pods are due, in one decision, and not at all while one is busy; the replay, which shows
    # plan() only the pods that may change, must still show it the busy rank.
    out = replay(history(record("a", IDLE, labels=GANG), record("b", IDLE, labels=GANG)),
                 policy())
    assert [(r.pod, r.how, r.at) for r in out.reclaimed] == [
        ("ml/a", "evict", t(9)), ("ml/b", "evict (with its workload)", t(9))]
    out = replay(history(record("a", IDLE, labels=GANG), record("b", BUSY, labels=GANG)),
                 policy())
    assert [w.pod for w in out.warned] == ["ml/a"] and out.reclaimed == ()


def test_a_scaled_down_deployment_keeps_its_later_pods_down_and_counts_their_hours():
    rs = OwnerRef("ReplicaSet", "web-5d8f", "rs-uid", controller=True)
    first = record("web-1", IDLE[:30], last=29, owner=rs)
    later = record("web-2", IDLE, first=35, owner=rs)
    owners = {"web-1": Owner("Deployment", "ml", "web", ("web-1",)),
              "web-2": Owner("Deployment", "ml", "web", ("web-2",))}
    out = replay(history(first, later, owners=owners), policy())
    hows = {r.pod: r.how for r in out.reclaimed}
    assert hows == {"ml/web-1": "scale", "ml/web-2": "kept down"}
    kept = next(r for r in out.reclaimed if r.pod == "ml/web-2")
    assert kept.at == t(35)


def test_a_pod_gone_within_a_cycle_of_its_deadline_counts_as_reclaimed_there():
    # marked at cycle 3 (4 of 5 cycles sampled: minCoverage 0.8), warned at 4, deadline 9; the
    # record ends at cycle 8, as when a reclaimer acting live took it a little earlier than
    # this replay's grid says.
    out = replay(history(record("taken", IDLE[:9], last=8)), policy())
    (r,) = out.reclaimed
    assert r.at == t(9) and r.to_window_end and r.until == t(STEPS - 1)
    assert any("before their deadline" in g for g in out.gaps)


def test_a_pod_gone_long_before_its_deadline_is_not_counted():
    # warned at cycle 4 with a 600 s grace (deadline 14); the record ends at cycle 6
    out = replay(history(record("left", IDLE[:7], last=6)), policy(grace=600))
    assert len(out.warned) == 1 and out.reclaimed == ()
    assert not any("before their deadline" in g for g in out.gaps)


@pytest.mark.parametrize(("ends_after", "to_end"), [
    pytest.param(1, True, id="gone-a-cycle-later"),
    pytest.param(2, True, id="gone-after-a-cycle-and-an-eviction-grace"),
    pytest.param(3, False, id="ran-on-well-after"),
])
def test_a_pod_that_goes_right_after_its_replayed_reclaim_counts_to_the_window_end(
        ends_after, to_end):
    # the replay reclaims at cycle 9; 60 s cycles: one cycle + 30 s grace = 2 cycles
    out = replay(history(record("taken", IDLE[:9 + ends_after + 1], last=9 + ends_after)),
                 policy())
    (r,) = out.reclaimed
    assert r.at == t(9) and r.to_window_end is to_end
    assert r.until == (t(STEPS - 1) if to_end else t(9 + ends_after))


def test_a_pending_pod_would_have_started_on_the_gpus_a_reclaim_freed():
    idle = record("idle", IDLE, gpus=2)
    waiting = record("train", BUSY, gpus=2, first=30, pending=Span(5, 29))
    out = replay(history(idle, waiting), policy())
    (e,) = out.earlier
    (r,) = out.reclaimed
    assert e.pod == "ml/train" and e.could_start_at == r.at and e.started_at == t(30)
    assert e.earlier_s == t(30) - r.at


def random_history(seed: int) -> History:
    """Pods coming and going, pending first, busy and idle in stretches, gaps in samples,
    Deployments of two pods, one telemetry outage."""
    rng = random.Random(seed)
    steps = 240
    records, owners = [], {}
    for n in range(14):
        first = rng.randrange(-20, steps - 20)
        last = min(steps + 5, first + rng.randrange(20, 200))
        pending = Span(first - rng.randrange(1, 15), first - 1) if rng.random() < 0.5 else None
        utils: list[float | None] = []
        while len(utils) < steps:
            value = rng.choice([0.0, 0.0, 1.0, 40.0, 90.0, None])
            utils += [value] * rng.randrange(1, 25)
        gpus = rng.choice([1, 1, 2, 4])
        labels = {"gpusteward.io/team": rng.choice(["a", "b"])}
        if n % 3 == 0:  # gangs of bare pods (a Kueue pod group's label), judged whole
            labels["kueue.x-k8s.io/pod-group-name"] = f"g{n % 2}"
        rec = record(f"p{n}", utils[:steps], gpus=gpus, first=first, last=last, pending=pending,
                     labels=labels, priority=rng.choice([0, 0, 100]))
        if n % 4 == 2:  # an XID on its GPUs now and then (its own draws: the rest unchanged)
            xids = random.Random(seed * 100 + n)
            rec = msgspec.structs.replace(rec, faults=tuple(sorted(
                (xids.randrange(max(0, first), min(steps, last + 1)), "XID 79")
                for _ in range(xids.randrange(1, 3)))))
        records.append(rec)
        if n % 5 == 1:
            owners[rec.pod.uid] = Owner("Deployment", "ml", f"d{n // 10}")
    members = tuple(uid for uid in owners)
    owners = {uid: Owner(o.kind, o.namespace, o.name, members) for uid, o in owners.items()}
    telemetry = [not 100 <= i < 104 for i in range(steps)]
    return History(Grid(START, STEP, steps), tuple(records), {"n1": Node("n1", "H100", 8)},
                   owners, SCRAPE, telemetry)


RECLAIMS = {"defaults-shortened": {}, "tight-limits": {"limits": {"maxPerCycle": 1,
                                                                  "maxPerHour": 3}},
            "older-longer": {"minPodAge": "20m", "idle": {"window": "600s", "grace": "120s",
                                                          "minCoverage": 0.5}},
            "windows": {"minRuntime": "15m", "reclaimCooldown": "40m"}}
EXTRAS = {"no-queue": {"queue": {"enabled": False}},
          "queue": {"queue": {"enabled": True, "minWait": "60s"}},
          "team-quota": {"teams": {"a": {"quotaGpus": 2}},
                         "reclaim": {"withinQuotaWindow": "900s"}}}


def random_policy(reclaim: dict, extra: dict) -> Policy:
    return parse_policy({"telemetry": {"scrapeInterval": "30s"}, **extra, "reclaim": {
        "interval": "60s", "minPodAge": "1s", "idle": {"window": "300s", "grace": "300s"},
        **extra.get("reclaim", {}), **reclaim}})


@pytest.mark.parametrize("reclaim", RECLAIMS.values(), ids=RECLAIMS)
@pytest.mark.parametrize("extra", EXTRAS.values(), ids=EXTRAS)
@pytest.mark.parametrize("seed", range(4), ids=lambda s: f"seed{s}")
def test_skipping_quiet_cycles_and_pods_changes_nothing(reclaim, extra, seed):
    pol = random_policy(reclaim, extra)
    h = random_history(seed)
    fast, full = replay(h, pol), replay(h, pol, every_step=True)
    assert full.warned or full.reclaimed  # the history exercises the reclaimer
    assert fast == full


def test_the_random_histories_exercise_queue_and_quota_reclaims_too():
    """The histories above reach every reclaim reason, so their equality means something for
    each (computed here, not gathered from the other test: it may be deselected)."""
    reasons = {r.reason for seed in range(4) for reclaim in RECLAIMS.values()
               for extra in EXTRAS.values()
               for r in replay(random_history(seed), random_policy(reclaim, extra)).reclaimed}
    assert {"idle", "queue", "over-quota"} <= reasons, reasons


def test_figures_kept_only_for_a_pods_own_time_replay_the_same():
    utils = [None] * 10 + [0.0] * 30 + [None] * 20
    whole = record("p", utils, gpus=2, first=10, last=39)
    own = msgspec.structs.replace(whole, offset=10, gpus=tuple(
        GpuUse(g.peaks[10:40], g.samples[10:40]) for g in whole.gpus))
    a, b = replay(history(whole), policy()), replay(history(own), policy())
    assert a.reclaimed and a == b


def test_a_pod_on_a_gpu_whose_xid_count_rose_is_faulty_for_the_xid_window_not_idle():
    # An XID at cycle 2 holds its GPU faulty for health.xidWindow (600 s: cycles 2..11), as
    # the live fault queries would find it each cycle; the idle neighbour goes as usual.
    xid = (2, "XID 79 on GPU GPU-1 (DCGM_EXP_XID_ERRORS_TOTAL rose)")
    broken = msgspec.structs.replace(record("broken", IDLE), faults=(xid,))
    out = replay(history(broken, record("beside", IDLE)), policy(), "p")
    warned = {w.pod: w for w in out.warned}
    reclaimed = {r.pod: r for r in out.reclaimed}
    assert set(reclaimed) == {"ml/broken", "ml/beside"}
    (alone,) = replay(history(record("beside", IDLE)), policy(), "p").reclaimed
    assert reclaimed["ml/beside"].at == alone.at
    # Once the window passes it is judged afresh: marked, warned, reclaimed a grace later.
    assert warned["ml/broken"].at > t(11)
    assert reclaimed["ml/broken"].at == warned["ml/broken"].at + 300
    # An XID again before the first window ends keeps it faulty: never reclaimed.
    again = msgspec.structs.replace(broken, faults=tuple((i, xid[1]) for i in range(2, 60, 9)))
    held = replay(history(again, record("beside", IDLE)), policy(), "p")
    assert [r.pod for r in held.reclaimed] == ["ml/beside"]
    assert [w.pod for w in held.warned] == ["ml/beside"]
