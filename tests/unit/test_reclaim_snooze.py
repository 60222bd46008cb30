"""Snooze (core/reclaim/snooze.py): values, caps, the weekly count, protected pods, ends."""

from __future__ import annotations

import msgspec
import pytest

from gpusteward.core.policy import PolicyError, parse_policy
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import (
    IDLE_SINCE,
    SNOOZE_UNTIL,
    Owner,
    SnoozeRecord,
)
from gpusteward.core.reclaim.snooze import WEEK, caps_for, kept, parse_until
from gpusteward.core.times import HOUR, stamp
from tests.unit.test_reclaim_decide import NOW, POLICY, gpu_pod, kinds, snapshot, warned


def snoozed(value: str, **kw):
    return warned("p", annotations={SNOOZE_UNTIL: value}, **kw)


def step(pods, records=(), now=NOW, policy=POLICY, owners=None):
    snap = msgspec.structs.replace(snapshot(pods, owners=owners, now=now),
                                   snoozes=tuple(records))
    return plan(snap, policy)


@pytest.mark.parametrize(
    ("value", "until"),
    [
        pytest.param("2h", NOW + 2 * HOUR, id="duration-from-first-sight"),
        pytest.param("1h30m", NOW + 1.5 * HOUR, id="go-style-duration"),
        pytest.param(stamp(NOW + HOUR), NOW + HOUR, id="rfc3339-utc"),
        pytest.param(stamp(NOW + HOUR).replace("Z", "+00:00"), NOW + HOUR, id="rfc3339-offset"),
    ],
)
def test_a_snooze_value_is_a_time_or_a_duration_counted_from_first_sight(value, until):
    assert parse_until(value, NOW) == until


@pytest.mark.parametrize(
    ("value", "why"),
    [
        pytest.param("tomorrow", "neither an RFC 3339 time", id="words"),
        pytest.param("", "neither", id="empty"),
        pytest.param("3600", "neither", id="bare-number-has-no-unit"),
        pytest.param("2026-11-30T18:00:00", "no time zone", id="no-zone"),
        pytest.param("-2h", "neither", id="negative"),
    ],
)
def test_a_malformed_snooze_says_why_and_snoozes_nothing(value, why):
    p = step([snoozed(value)])
    [record] = p.snoozes
    assert record.outcome == "malformed" and why in record.message
    assert p.verdicts[0].snoozed_until is None
    assert kinds(p) == [("reclaim", "p")]  # the warned, due pod is reclaimed as before


def test_a_snoozed_idle_pod_is_not_reclaimed_and_its_marks_are_cleared():
    p = step([snoozed("2h")])
    [record] = p.snoozes
    assert (record.outcome, record.until, record.workload) == ("snoozed", NOW + 2 * HOUR,
                                                               "ml/Pod/p")
    assert p.verdicts[0].snoozed_until == NOW + 2 * HOUR
    assert [(a.kind, a.reason) for a in p.actions] == [("clear", "snoozed")]


def test_a_recorded_snooze_holds_from_its_first_sight_and_ends_once():
    first = step([snoozed("2h")]).snoozes
    later = step([gpu_pod("p", annotations={SNOOZE_UNTIL: "2h"})], first, now=NOW + HOUR)
    assert later.snoozes == () and later.verdicts[0].snoozed_until == NOW + 2 * HOUR
    assert kinds(later) == []
    pod = gpu_pod("p", annotations={SNOOZE_UNTIL: "2h"})
    ended = step([pod], first, now=NOW + 2 * HOUR)
    [record] = ended.snoozes
    assert record.closed == "ended" and "snooze ended" in record.message
    assert kinds(ended) == [("mark", "p")]  # starts over: mark, then a fresh warning
    again = step([pod], [record], now=NOW + 3 * HOUR)
    assert again.snoozes == () and kinds(again) == [("mark", "p")]


def test_a_snooze_past_the_cap_is_cut_to_the_cap():
    policy = parse_policy({"reclaim": {"snooze": {"maxDuration": "4h"}}})
    p = step([snoozed(stamp(NOW + 24 * HOUR))], policy=policy)
    [record] = p.snoozes
    assert (record.outcome, record.until) == ("capped", NOW + 4 * HOUR)
    assert "cut to the policy's longest snooze of 4h" in record.message


def test_caps_come_from_the_class_then_the_team():
    policy = parse_policy({
        "reclaim": {"snooze": {"maxDuration": "8h", "maxPerWeek": 3}},
        "classes": {"batch": {"snooze": {"maxDuration": "2h"}}},
        "teams": {"ml": {"snooze": {"maxPerWeek": 1}}, "nlp": {"snooze": {"maxDuration": "1h"}}}})
    assert caps_for(gpu_pod("p"), "ml", policy) == (2 * HOUR, 1)
    assert caps_for(gpu_pod("p"), "nlp", policy) == (HOUR, 3)
    assert caps_for(gpu_pod("p"), "other", POLICY) == (8 * HOUR, 3)


def test_the_weekly_cap_refuses_another_snooze_of_the_same_workload():
    policy = parse_policy({"reclaim": {"snooze": {"maxPerWeek": 2}}})
    past = [SnoozeRecord("ml/Pod/p", v, "ml", NOW - d, NOW - d + HOUR, "snoozed", "",
                         closed="withdrawn") for v, d in (("1h", 2 * HOUR), ("2h", 3 * HOUR))]
    [record] = step([snoozed("3h")], past, policy=policy).snoozes
    assert record.outcome == "refused" and "2 snoozes of this workload" in record.message
    # A week later the old ones no longer count.
    [record] = step([snoozed("3h")], past, now=NOW + WEEK, policy=policy).snoozes
    assert record.outcome == "snoozed"


def test_a_changed_value_is_a_new_snooze_and_a_removed_one_is_withdrawn():
    first = step([snoozed("2h")]).snoozes
    changed = step([snoozed("3h")], first, now=NOW + 60).snoozes
    assert [(r.value, r.closed, r.outcome) for r in changed] == [
        ("2h", "withdrawn", "snoozed"), ("3h", "", "snoozed")]
    gone = step([warned("p")], first, now=NOW + 60)
    assert [(r.value, r.closed) for r in gone.snoozes] == [("2h", "withdrawn")]
    assert kinds(gone) == [("reclaim", "p")]


def test_a_snooze_already_past_is_ignored_with_a_reason():
    [record] = step([snoozed(stamp(NOW - 60))]).snoozes
    assert record.outcome == "expired" and "already past" in record.message


def test_a_snooze_on_a_protected_pod_says_it_is_not_needed():
    p = step([snoozed("2h", priority=2_000_000)])
    [record] = p.snoozes
    assert record.outcome == "protected" and "does not reclaim this pod" in record.message
    assert "priority" in record.message


def test_a_snooze_seen_while_the_pod_was_young_is_looked_at_again_when_it_is_not():
    young = gpu_pod("p", age=60, annotations={SNOOZE_UNTIL: "2h"})
    [record] = step([young]).snoozes
    assert record.outcome == "protected" and "younger" in record.message
    grown = gpu_pod("p", annotations={SNOOZE_UNTIL: "2h"})
    later = step([grown], [record], now=NOW + 60).snoozes
    assert [(r.outcome, r.closed) for r in later] == [("protected", "withdrawn"), ("snoozed", "")]
    assert later[1].until == NOW + 60 + 2 * HOUR


def test_a_snooze_on_the_top_level_owner_covers_all_its_pods():
    owner = Owner("Deployment", "ml", "serve", ("a", "b"), snooze="2h")
    pods = [warned("a"), warned("b")]
    p = step(pods, owners={"a": owner, "b": owner})
    [record] = p.snoozes
    assert record.workload == "ml/Deployment/serve"
    assert {v.snoozed_until for v in p.verdicts} == {NOW + 2 * HOUR}
    assert [a.kind for a in p.actions] == ["clear", "clear"]


def test_a_snoozed_pod_is_no_queue_victim():
    waiting = gpu_pod("urgent", node=None, gpus=8, priority=10, age=HOUR,
                      unschedulable_since=NOW - HOUR)
    victims = [gpu_pod("idle"), gpu_pod("other", gpus=7)]
    assert [a.pod.name for a in step([*victims, waiting]).actions if a.kind == "reclaim"] == [
        "idle", "other"]
    snoozed_one = gpu_pod("idle", annotations={SNOOZE_UNTIL: "2h", IDLE_SINCE: stamp(NOW)})
    p = step([snoozed_one, victims[1], waiting])
    assert not [a for a in p.actions if a.kind == "reclaim"]


def test_old_closed_records_are_dropped_open_ones_kept():
    old = SnoozeRecord("ml/Pod/p", "2h", "ml", NOW - WEEK - 1, NOW, "snoozed", "", "ended")
    live = SnoozeRecord("ml/Pod/q", "2h", "ml", NOW - WEEK - 1, NOW + 1, "snoozed", "")
    assert kept([old, live], NOW) == [live]


def test_stored_records_with_words_this_version_does_not_know_read_and_are_written_back():
    # As the snooze ConfigMap decodes them: old records, and a newer reclaimer's (or a hand
    # edit's) words, which neither hold nor count against the weekly cap.
    stored = (b'[{"workload":"ml/Pod/p","value":"2h","team":"ml","seen":%d,"until":%d,'
              b'"outcome":"snoozed","message":"","closed":""},' % (NOW, NOW + HOUR) +
              b'{"workload":"ml/Pod/q","value":"2h","team":"ml","seen":%d,"until":%d,'
              b'"outcome":"deferred","message":"","closed":"moved"}]' % (NOW, NOW + HOUR))
    old, new = msgspec.json.decode(stored, type=list[SnoozeRecord])
    assert old.holding and not new.holding
    assert (new.outcome, new.closed) == ("deferred", "moved")
    assert msgspec.json.decode(msgspec.json.encode([old, new])) == msgspec.json.decode(stored)


def test_snooze_caps_are_validated_with_their_paths():
    with pytest.raises(PolicyError) as e:
        parse_policy({"reclaim": {"snooze": {"maxDuration": "9d", "maxPerWeek": -1}},
                      "teams": {"ml": {"snooze": {"maxDuration": "soon"}}}})
    paths = {e.keys for e in e.value.errors}
    assert paths == {("reclaim", "snooze", "maxDuration"), ("reclaim", "snooze", "maxPerWeek"),
                     ("teams", "ml", "snooze", "maxDuration")}


def test_the_report_shows_a_snoozed_pod_as_snoozed():
    from gpusteward.core.report.sections import decisions

    snap = snapshot([snoozed("2h"), warned("q")])
    shown = decisions(snap, POLICY)
    assert shown["ml/p"].action == "snoozed"
    assert f"snoozed until {stamp(NOW + 2 * HOUR)}" in shown["ml/p"].why
    assert shown["ml/q"].action == "reclaim/evict"
