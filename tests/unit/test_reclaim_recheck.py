"""What an action is re-checked against just before it is carried out, the eviction grace, and
the replica count restore accepts."""

from __future__ import annotations

import pytest

from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.model import IDLE_SINCE, RECLAIM_AT
from gpusteward.core.reclaim.recheck import changed, eviction_grace
from gpusteward.reclaimer.restore import plain_count
from tests.unit.test_reclaim_decide import gpu_pod

MARKS = {IDLE_SINCE: "2027-01-15T08:00:00Z", RECLAIM_AT: "2027-01-15T08:15:00Z"}
DECIDED = gpu_pod("p", annotations=MARKS)


@pytest.mark.parametrize(("uid", "annotations", "deleting", "why"), [
    pytest.param("p", MARKS, False, None, id="unchanged-goes-ahead"),
    pytest.param("p", {**MARKS, "other": "x"}, False, None, id="unrelated-annotation-ignored"),
    pytest.param("p2", MARKS, False, "was replaced", id="same-name-new-uid"),
    pytest.param("p", MARKS, True, "terminating", id="terminating"),
    pytest.param("p", {}, False, "idle-since is None", id="marks-cleared-by-another-replica"),
    pytest.param("p", {**MARKS, RECLAIM_AT: "2027-01-15T09:00:00Z"}, False,
                 "reclaim-at is '2027-01-15T09:00:00Z'", id="deadline-moved"),
])
def test_an_action_goes_ahead_only_on_the_pod_it_was_decided_on(uid, annotations, deleting,
                                                                  why):
    found = changed(DECIDED, uid, annotations, deleting)
    assert found is None if why is None else why in found


POLICY = parse_policy({"reclaim": {"evictionGrace": "30s"},
                       "classes": {"batch": {}, "experiment": {"evictionGraceCap": "2m"}}})


@pytest.mark.parametrize(("cls", "own", "grace"), [
    pytest.param(None, 600, 600, id="checkpointing-trainer-keeps-its-10-minutes"),
    pytest.param(None, 5, 30, id="policy-grace-is-the-floor"),
    pytest.param(None, None, 30, id="unset-is-the-api-default-30s"),
    pytest.param("experiment", 600, 120, id="class-cap-bounds-a-long-grace"),
    pytest.param("experiment", 60, 60, id="cap-above-own-grace-changes-nothing"),
])
def test_the_pods_own_grace_is_the_floor_unless_its_class_caps_it(cls, own, grace):
    pod = gpu_pod("p", labels={"gpusteward.io/class": cls} if cls else {})
    assert eviction_grace(pod, own, POLICY) == grace


def test_a_zero_cap_is_refused_by_policy_check():
    from gpusteward.core.policy import PolicyError
    with pytest.raises(PolicyError, match="classes.batch.evictionGraceCap"):
        parse_policy({"classes": {"batch": {"evictionGraceCap": "0s"}}})


@pytest.mark.parametrize(("text", "count"), [
    ("3", 3), ("12", 12), ("0", 0),
    ("٣", None), ("+3", None), (" 3", None), ("3\n", None), ("3.0", None), ("-1", None),
    ("", None), (None, None), ("1" * 10, None), ("３", None),
])
def test_restore_reads_only_a_plain_ascii_count(text, count):
    assert plain_count(text) == count
