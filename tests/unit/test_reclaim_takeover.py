"""What a new leader fences first (core.reclaim.takeover): the owner of every reclaim another
leader began — the reason written on a pod — and did not finish, once per owner; nothing where a
pod-level fence is enough or the owner is already stopped."""

from __future__ import annotations

import pytest

from gpusteward.core.reclaim.model import RECLAIM_REASON, Owner
from gpusteward.core.reclaim.takeover import fences
from gpusteward.reclaimer.loop import WRITES
from tests.unit.test_reclaim_decide import gpu_pod, snapshot

BEGUN = {RECLAIM_REASON: "idle: peak 0% < 5% over 1800s"}


def fenced(pods, owners) -> list[str]:
    return [a.owner.key for a in fences(snapshot(pods, owners=owners))]


@pytest.mark.parametrize(("owner", "expected"), [
    pytest.param(Owner("Job", "ml", "train"), ["ml/Job/train"], id="job-suspend-begun"),
    pytest.param(Owner("Deployment", "ml", "serve"), ["ml/Deployment/serve"],
                 id="scale-down-begun"),
    pytest.param(Owner("Notebook", "ml", "nb", group="kubeflow.org", how="stop"),
                 ["ml/Notebook/nb"], id="owner-switch-begun"),
    pytest.param(Owner("Job", "ml", "train", in_progress=True), [], id="already-stopped"),
    pytest.param(Owner("Pod", "ml", "p"), [], id="a-bare-pod-is-fenced-on-itself"),
])
def test_a_begun_reclaim_fences_the_object_its_stop_writes(owner, expected):
    pod = gpu_pod("p", annotations=BEGUN)
    assert fenced([pod], {pod.uid: owner}) == expected


def test_each_owner_is_fenced_once_and_pods_with_no_reclaim_begun_not_at_all():
    owner = Owner("Deployment", "ml", "serve")
    a, b = gpu_pod("a", annotations=BEGUN), gpu_pod("b", annotations=BEGUN)
    quiet = gpu_pod("c")
    assert fenced([a, b, quiet], {a.uid: owner, b.uid: owner,
                                  quiet.uid: Owner("Job", "ml", "other")}) == [
        "ml/Deployment/serve"]


def test_only_enforce_mode_lets_a_fence_through():
    assert [m for m, kinds in WRITES.items() if "fence" in kinds] == ["enforce"]
