"""Folding a pod's per-GPU evidence series (the Prometheus HTTP API's vector shape:
https://prometheus.io/docs/prometheus/latest/querying/api/#instant-vectors, where NaN and
infinities are the strings "NaN", "+Inf" and "-Inf") into one Evidence per pod."""

from __future__ import annotations

import pytest

from gpusteward.adapters.snapshot import per_pod
from gpusteward.core.attribution import Attribution
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.rules import judge, rule_for
from tests.factories import pod

T = 1_800_000_000.0
# The pod holds its two GPUs on n1, as the API server would show it.
WHO = Attribution.of(["Hostname"], "auto", ["n1"], [pod("p", gpus=2)])


def series(gpu: str, value: str) -> dict:
    return {"metric": {"UUID": f"GPU-{gpu}", "gpu": gpu, "Hostname": "n1", "namespace": "ml",
                       "pod": "p"}, "value": [T, value]}


@pytest.mark.parametrize("broken", ["NaN", "+Inf", "-Inf", "-4", "101"])
@pytest.mark.parametrize("first", [True, False], ids=["broken-gpu-first", "broken-gpu-last"])
def test_one_broken_gpu_makes_the_pod_unknown_wherever_it_stands(broken, first):
    # max() keeps or drops a NaN depending on its place: with the idle GPU listed first the pod
    # used to read 2 % and be judged idle.
    peaks = [series("0", "2"), series("1", broken)]
    counts = [series("0", "60"), series("1", "60")]
    evidence = per_pod(1800, peaks if first else peaks[::-1], counts, expected=60, who=WHO)["ml/p"]
    assert not 0 <= evidence.peak_percent <= 100
    state, why = judge(evidence, rule_for(pod("p", gpus=2), parse_policy({})), 2)
    assert state == "unknown" and "not a value in 0-100%" in why


def test_valid_readings_fold_to_their_peak():
    evidence = per_pod(1800, [series("0", "2"), series("1", "40")],
                       [series("0", "60"), series("1", "30")], expected=60, who=WHO)["ml/p"]
    assert (evidence.peak_percent, evidence.coverage, evidence.gpus_seen) == (40.0, 0.5, 2)


def newest(times: dict[str, float]) -> dict:
    """Each GPU's newest sample time, keyed by its series' labels as the freshness query
    answers (``adapters.snapshot.newest_query``)."""
    return {tuple(sorted(series(gpu, "0")["metric"].items())): t for gpu, t in times.items()}


def judged(times: dict[str, float], now: float) -> tuple[str, str]:
    peaks, counts = [series("0", "2"), series("1", "1")], [series("0", "60"), series("1", "60")]
    evidence = per_pod(1800, peaks, counts, 60, WHO, newest(times), now)["ml/p"]
    policy = parse_policy({"telemetry": {"scrapeInterval": "30s"}})
    return judge(evidence, rule_for(pod("p", gpus=2), policy), 2)


@pytest.mark.parametrize(("times", "state"), [
    pytest.param({"0": T - 30, "1": T - 15}, "idle", id="both-gpus-sampled-a-scrape-ago"),
    pytest.param({"0": T - 90, "1": T}, "idle", id="three-scrapes-old-is-still-fresh"),
    pytest.param({"0": T - 91, "1": T}, "unknown", id="one-gpu-past-three-scrapes"),
    pytest.param({"1": T}, "unknown", id="one-gpu-with-no-recent-sample"),
])
def test_full_coverage_is_no_evidence_when_one_gpu_stopped_being_sampled(times, state):
    # Coverage 100 % and a 2 % peak: only the GPU's newest sample says its exporter stopped.
    got, why = judged(times, now=T)
    assert got == state, why
    if state == "unknown":
        assert "does not reach the present" in why


def test_the_freshness_limit_is_never_longer_than_stale_after():
    policy = parse_policy({"telemetry": {"scrapeInterval": "5m", "staleAfter": "2m"}})
    assert rule_for(pod("p"), policy).fresh_within == 120
