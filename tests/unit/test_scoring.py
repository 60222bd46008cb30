"""The placement formula: filter reasons and scores, as named table cases."""

from __future__ import annotations

import pytest

from gpusteward.core.policy import Health, Placement, Weights
from gpusteward.core.scoring import (
    NEUTRAL,
    ClassRule,
    Demand,
    card_term,
    coolness_term,
    filter_node,
    health_term,
    packing_term,
    raw_score,
    score_node,
    to_priority,
)
from tests.factories import A10, A100, H100, L4, NOW, node, pod, readings, state

BINPACK = ClassRule(("premium", "standard"), Placement.BINPACK, Weights())
SPREAD = ClassRule(("economy", "standard"), Placement.SPREAD, Weights())
ONLY_COOLNESS = ClassRule((), Placement.BINPACK, Weights(card=0, coolness=1, packing=0, health=0))


def demand(gpus: int = 1, cards: tuple[str, ...] = (), cls: str = "training") -> Demand:
    return Demand(gpus=gpus, card_patterns=cards, class_name=cls)


@pytest.mark.parametrize(
    ("product", "patterns", "ok", "resolvable"),
    [
        pytest.param(H100, ("NVIDIA-H100*",), True, True, id="glob-matches-family"),
        pytest.param(A100, ("NVIDIA-A10",), False, False, id="A10-never-matches-A100"),
        pytest.param(A10, ("NVIDIA-A10",), True, True, id="A10-matches-itself-exactly"),
        pytest.param(A100, ("NVIDIA-A100-SXM4-80GB",), True, True, id="exact-name"),
        pytest.param(L4, ("NVIDIA-H100*", "NVIDIA-A100*"), False, False, id="card-not-accepted"),
        pytest.param(H100, (), True, True, id="no-card-preference-accepts-all"),
        pytest.param(None, ("NVIDIA-H100*",), False, False, id="node-without-product-label"),
    ],
)
def test_filter_rejects_cards_the_pod_does_not_accept(product, patterns, ok, resolvable):
    verdict = filter_node(state(node(product=product)), demand(cards=patterns))
    assert (verdict.ok, verdict.resolvable) == (ok, resolvable)
    if not ok:
        assert verdict.reason


def test_card_rejection_names_the_card_and_the_wanted_patterns():
    verdict = filter_node(state(node(product=L4)), demand(cards=("NVIDIA-H100*",)))
    assert verdict.reason == "card NVIDIA-L4 not accepted (pod wants NVIDIA-H100*)"


@pytest.mark.parametrize(
    ("allocated", "xid", "wanted", "ok", "resolvable"),
    [
        pytest.param(6, {}, 2, True, True, id="exactly-enough-free"),
        pytest.param(7, {}, 2, False, True, id="too-few-free-is-resolvable"),
        pytest.param(6, {7: 79}, 2, False, True, id="free-gpu-with-xid-does-not-count"),
        pytest.param(6, {7: 13}, 2, True, True, id="application-xid-is-ignored"),
        pytest.param(0, {}, 9, False, False, id="more-than-the-node-has-is-unresolvable"),
    ],
)
def test_filter_counts_only_healthy_free_gpus(allocated, xid, wanted, ok, resolvable):
    pods = [pod(f"p{i}", gpus=1) for i in range(allocated)]
    attributed = {i: f"ml/p{i}" for i in range(allocated)}
    s = state(pods=pods, gpu_readings=readings(xid=xid, pods=attributed))
    verdict = filter_node(s, demand(gpus=wanted))
    assert (verdict.ok, verdict.resolvable) == (ok, resolvable)


def test_unhealthy_reason_names_the_gpu_and_the_fault():
    s = state(pods=[pod(f"p{i}") for i in range(7)], gpu_readings=readings(xid={7: 79}))
    verdict = filter_node(s, demand())
    assert "gpu 7: XID 79" in verdict.reason


def test_hot_gpu_is_unhealthy():
    s = state(gpu_readings=readings(utils=[0.0], temp=95.0), n=node(gpus=1))
    assert not filter_node(s, demand()).ok


def test_stale_telemetry_never_fails_scheduling():
    stale = readings(xid={i: 79 for i in range(8)}, at=NOW - 600)
    verdict = filter_node(state(gpu_readings=stale), demand())
    assert verdict.ok


def test_pods_without_gpus_pass_everywhere_with_equal_scores():
    no_gpu = Demand(0, (), "batch")
    assert filter_node(state(node(gpus=0)), no_gpu).ok
    assert score_node(state(), no_gpu, BINPACK) == score_node(state(node(product=L4)), no_gpu,
                                                              BINPACK)


@pytest.mark.parametrize(
    ("product", "patterns", "expected"),
    [
        pytest.param(H100, ("NVIDIA-H100*", "NVIDIA-A100*"), 1.0, id="first-choice"),
        pytest.param(A100, ("NVIDIA-H100*", "NVIDIA-A100*"), 0.5, id="second-of-two"),
        pytest.param(L4, ("NVIDIA-H100*", "NVIDIA-A100*", "NVIDIA-L4"), 1 / 3, id="third-of-three"),
    ],
)
def test_card_term_follows_the_pod_preference_order(product, patterns, expected):
    assert card_term(state(node(product=product)), demand(cards=patterns), BINPACK) == (
        pytest.approx(expected))


@pytest.mark.parametrize(
    ("tier", "rule", "expected"),
    [
        pytest.param("premium", BINPACK, 1.0, id="class-first-tier"),
        pytest.param("standard", BINPACK, 0.5, id="class-second-tier"),
        pytest.param("economy", BINPACK, 0.0, id="tier-the-class-does-not-prefer"),
        pytest.param("premium", ONLY_COOLNESS, NEUTRAL, id="class-without-preference"),
    ],
)
def test_card_term_falls_back_to_class_tiers(tier, rule, expected):
    assert card_term(state(tier=tier), demand(), rule) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("utils", "expected"),
    [
        pytest.param([0.0] * 4, 1.0, id="idle-node-is-cool"),
        pytest.param([1.0] * 4, 0.0, id="busy-node-is-hot"),
        pytest.param([1.0, 1.0, 0.0, 0.0], 0.5, id="half-busy"),
    ],
)
def test_coolness_is_one_minus_mean_utilization(utils, expected):
    s = state(node(gpus=4), gpu_readings=readings(utils=utils))
    assert coolness_term(s) == pytest.approx(expected)


def test_cooler_node_scores_higher():
    cool = state(node("cool", gpus=4), gpu_readings=readings("cool", [0.1] * 4))
    hot = state(node("hot", gpus=4), gpu_readings=readings("hot", [0.9] * 4))
    assert score_node(cool, demand(), ONLY_COOLNESS) > score_node(hot, demand(), ONLY_COOLNESS)


@pytest.mark.parametrize(
    ("readings_at", "expected"),
    [
        pytest.param(NOW - 600, NEUTRAL, id="stale-telemetry-is-neutral"),
        pytest.param(None, NEUTRAL, id="missing-telemetry-is-neutral"),
    ],
)
def test_unknown_load_and_health_are_neutral(readings_at, expected):
    gpu_readings = None if readings_at is None else readings(utils=[1.0] * 8, at=readings_at)
    s = state(gpu_readings=gpu_readings)
    assert coolness_term(s) == expected
    assert health_term(s) == expected


def test_pods_bound_after_the_sample_count_as_busy():
    """Burst correction: 4 of 8 idle GPUs just went to a new pod the sample has not seen."""
    fresh = pod("new", gpus=4, bound_at=NOW - 1)
    s = state(pods=[fresh], gpu_readings=readings(at=NOW - 5))
    assert coolness_term(s) == pytest.approx(0.5)


def test_pods_bound_before_the_sample_are_measured_not_guessed():
    old = pod("old", gpus=4, bound_at=NOW - 60)
    s = state(pods=[old], gpu_readings=readings(at=NOW - 5), warmup=30)
    assert coolness_term(s) == pytest.approx(1.0)


def test_a_pod_in_its_warmup_counts_as_busy_though_a_sample_covers_it():
    """Its 4 GPUs read 50 % while it loads: counted as 100 %, and not on top of the 50 %."""
    young = pod("young", gpus=4, bound_at=NOW - 10)
    sample = readings(utils=[0.5] * 4 + [0.0] * 4, at=NOW - 5,
                      pods={i: young.key for i in range(4)})
    assert coolness_term(state(pods=[young], gpu_readings=sample, warmup=30)) == pytest.approx(0.5)
    # Without the warm-up, the sample that covers it is believed.
    assert coolness_term(state(pods=[young], gpu_readings=sample)) == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("placement", "allocated", "expected"),
    [
        pytest.param(Placement.BINPACK, 6, 7 / 8, id="binpack-prefers-full-nodes"),
        pytest.param(Placement.BINPACK, 0, 1 / 8, id="binpack-empty-node-scores-low"),
        pytest.param(Placement.SPREAD, 6, 1 / 8, id="spread-avoids-full-nodes"),
        pytest.param(Placement.SPREAD, 0, 7 / 8, id="spread-prefers-empty-nodes"),
    ],
)
def test_packing_term(placement, allocated, expected):
    s = state(pods=[pod(f"p{i}") for i in range(allocated)])
    assert packing_term(s, demand(), placement) == pytest.approx(expected)


def test_binpack_and_spread_disagree_on_the_same_nodes():
    full = state(node("full"), pods=[pod(f"p{i}", node="full") for i in range(6)],
                 gpu_readings=readings("full"))
    empty = state(node("empty"), gpu_readings=readings("empty"))
    pack = ClassRule((), Placement.BINPACK, Weights(card=0, coolness=0, packing=1, health=0))
    spread = ClassRule((), Placement.SPREAD, Weights(card=0, coolness=0, packing=1, health=0))
    assert score_node(full, demand(), pack) > score_node(empty, demand(), pack)
    assert score_node(full, demand(), spread) < score_node(empty, demand(), spread)


def test_health_term_counts_faulty_gpus():
    s = state(gpu_readings=readings(xid={0: 79, 1: 48}))
    assert health_term(s) == pytest.approx(6 / 8)


def test_score_is_the_weighted_mean_of_the_terms():
    s = state(tier="standard", pods=[pod(f"p{i}") for i in range(3)],
              gpu_readings=readings(utils=[0.5] * 8))
    # card 0.5 (standard is 2nd of 2), coolness 0.5, packing 4/8, health 1.0
    expected = (3 * 0.5 + 2 * 0.5 + 1 * 0.5 + 2 * 1.0) / 8
    assert raw_score(s, demand(), BINPACK) == pytest.approx(expected)
    assert score_node(s, demand(), BINPACK) == 6


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(0.0, 0, id="zero"),
        pytest.param(1.0, 10, id="one"),
        pytest.param(0.449, 4, id="rounds-down"),
        pytest.param(0.45, 5, id="half-rounds-up"),
        pytest.param(1.7, 10, id="clamped-high"),
        pytest.param(-0.3, 0, id="clamped-low"),
    ],
)
def test_priority_is_an_integer_from_0_to_10(raw, expected):
    assert to_priority(raw) == expected


def test_health_policy_threshold_is_respected():
    s = state(node(gpus=1), gpu_readings=readings(utils=[0.0], temp=85.0),
              health=Health(max_temperature_c=80))
    assert not filter_node(s, demand()).ok
