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
