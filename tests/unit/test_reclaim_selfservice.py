"""Self-service restore (core/reclaim/selfservice.py): within the team's quota or refused."""

from __future__ import annotations

import msgspec

from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import RestoreAsk
from tests.unit.test_reclaim_decide import gpu_pod, snapshot

POLICY = parse_policy({"teams": {"ml": {"quotaGpus": 4}}})


def answers(asks, pods, policy=POLICY):
    snap = msgspec.structs.replace(snapshot(pods), restore_asks=tuple(asks))
    return [(a.name, why) for a, why in plan(snap, policy).restores]


def test_a_restore_within_the_quota_goes_ahead():
    assert answers([RestoreAsk("Deployment", "ml", "serve", "ml", 2)],
                   [gpu_pod("a", gpus=2)]) == [("serve", "")]


def test_a_restore_over_the_quota_is_refused_and_says_how_much():
    [(name, why)] = answers([RestoreAsk("Job", "ml", "train", "ml", 3)], [gpu_pod("a", gpus=2)])
    assert name == "train"
    assert "team ml holds 2 of its 4 GPUs and Job train needs 3 more" in why
    assert "set gpusteward.io/restore=true again" in why


def test_pending_pods_and_earlier_grants_count_against_the_quota():
    pods = [gpu_pod("a", gpus=1), gpu_pod("waiting", node=None, gpus=1)]
    asks = [RestoreAsk("Deployment", "ml", "b", "ml", 2),
            RestoreAsk("Deployment", "ml", "c", "ml", 1)]
    assert [bool(why) for _, why in answers(asks, pods)] == [False, True]


def test_a_team_without_a_quota_is_never_refused():
    assert answers([RestoreAsk("Job", "x", "big", "x", 64)], [gpu_pod("a", ns="x")]) == [
        ("big", "")]


def test_a_restore_does_not_wait_for_telemetry():
    snap = msgspec.structs.replace(snapshot([gpu_pod("a")], telemetry_ok=False),
                                   restore_asks=(RestoreAsk("Job", "ml", "train", "ml", 1),))
    decided = plan(snap, POLICY)
    assert decided.halted and [(a.name, why) for a, why in decided.restores] == [("train", "")]
