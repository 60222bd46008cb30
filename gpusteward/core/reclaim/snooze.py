"""Snooze: a workload's owner postpones reclaim with ``gpusteward.io/reclaim-snooze-until`` on
the pod or on its top-level owner (Deployment, StatefulSet, Job). Pure.

The value is an RFC 3339 time with a zone (``2026-11-30T18:00:00Z``) or a duration (``4h``,
``90m``, ``1h30m``: the policy's own duration text). A duration counts from the first cycle
that sees the value; that moment is recorded (a SnoozeRecord), so restarts and failovers do not
move it. A changed value is a new snooze. The policy caps each one (longest snooze, snoozes per
workload in any 7 days); the cap counts from the first sighting too.

While a snooze holds, the workload's pods are neither marked, warned nor reclaimed (the queue
does not take them either) and earlier marks are cleared: when it ends, a pod that is still
idle starts over with a fresh warning and its full grace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import NamedTuple

import msgspec

from gpusteward.core.model import Pod, class_of
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.model import (
    HONOURED,
    SNOOZE_UNTIL,
    Closed,
    Owner,
    SnoozeOutcome,
    SnoozeRecord,
)
from gpusteward.core.times import DAY, stamp
from gpusteward.core.typedconfig import Duration, duration_text

WEEK = 7 * DAY


class Caps(NamedTuple):
    longest: float
    per_week: int


class Review(NamedTuple):
    until: dict[str, float]  # pod uid -> snoozed until
    changed: tuple[SnoozeRecord, ...]  # records new or changed this cycle


def caps_for(pod: Pod, team_name: str, policy: Policy) -> Caps:
    """reclaim.snooze, overridden by the pod's class, then by its team."""
    levels = [policy.reclaim.snooze]
    cls = policy.classes.get(class_of(pod.labels, pod.annotations, policy.default_class))
    if cls is not None:
        levels.append(cls.snooze)
    team = policy.teams.get(team_name)
    if team is not None:
        levels.append(team.snooze)
    longest = next(c.max_duration for c in reversed(levels) if c.max_duration is not None)
    per_week = next(c.max_per_week for c in reversed(levels) if c.max_per_week is not None)
    return Caps(float(longest), per_week)


def parse_until(value: str, seen: float) -> float:
    """The time a snooze value asks for; ValueError with the reason when it is neither form."""
    text = value.strip()
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        try:
            return seen + Duration.parse(text)
        except ValueError:
            raise ValueError(f"{SNOOZE_UNTIL}={value!r} is neither an RFC 3339 time "
                             "(2026-11-30T18:00:00Z) nor a duration (4h, 90m, 1h30m)") from None
    if at.tzinfo is None:
        raise ValueError(f"{SNOOZE_UNTIL}={value!r} has no time zone: end it with Z or an "
                         "offset such as +01:00")
    return at.timestamp()


def review(pods: Iterable[Pod], records: Iterable[SnoozeRecord], now: float, policy: Policy,
           owner_of: Callable[[Pod], Owner], team_of: Callable[[Pod], str],
           vetoes: Callable[[Pod], tuple[str, ...]]) -> Review:
    """Which pods are snoozed now, and the records that change (new, ended, withdrawn)."""
    asked: dict[str, tuple[str, list[Pod]]] = {}  # workload -> (value, its bound pods)
    present: set[str] = set()
    for pod in pods:
        owner = owner_of(pod)
        present |= {_pod_key(pod), owner.key}
        where, value = _carrier(pod, owner)
        if value is not None:
            asked.setdefault(where, (value, []))[1].append(pod)
    latest: dict[str, SnoozeRecord] = {}
    for seen in records:
        if seen.workload not in latest or seen.seen >= latest[seen.workload].seen:
            latest[seen.workload] = seen
    history = list(records)
    until: dict[str, float] = {}
    changed: list[SnoozeRecord] = []
    for workload in sorted(present):
        value, members = asked.get(workload, (None, []))
        r: SnoozeRecord | None = latest.get(workload)
        if r is not None and r.value != value and r.closed != Closed.WITHDRAWN:
            # Taken away or replaced: it no longer holds (quietly: the owner did it).
            changed.append(msgspec.structs.replace(r, closed=Closed.WITHDRAWN))
            r = None
        if value is None:
            continue
        if r is not None and r.outcome == SnoozeOutcome.PROTECTED and not all(map(vetoes, members)):
            # Protections such as a young pod's lapse: the snooze is looked at anew.
            changed.append(msgspec.structs.replace(r, closed=Closed.WITHDRAWN))
            r = None
        if r is None or r.closed == Closed.WITHDRAWN:
            r = _first_sight(workload, value, members, history, now, policy, team_of, vetoes)
            changed.append(r)
        if r.holding and r.until <= now:
            r = msgspec.structs.replace(r, closed=Closed.ENDED, message=(
                f"snooze ended at {stamp(r.until)}: idle GPUs are marked, warned and "
                "reclaimed again"))
            changed.append(r)
        if r.holding:
            until.update((p.uid, r.until) for p in members)
    return Review(until, tuple(changed))


def _first_sight(workload: str, value: str, members: list[Pod], history: list[SnoozeRecord],
                 now: float, policy: Policy, team_of: Callable[[Pod], str],
                 vetoes: Callable[[Pod], tuple[str, ...]]) -> SnoozeRecord:
    first = members[0]
    team = team_of(first)

    def record(outcome: SnoozeOutcome, message: str, until: float = now) -> SnoozeRecord:
        return SnoozeRecord(workload, value, team, now, until, outcome, message)

    protected = [vetoes(p) for p in members]
    if all(protected):
        return record(SnoozeOutcome.PROTECTED, f"{SNOOZE_UNTIL} not needed: gpusteward does "
                      f"not reclaim this pod ({'; '.join(protected[0])})")
    try:
        asked = parse_until(value, now)
    except ValueError as e:
        return record(SnoozeOutcome.MALFORMED, f"{e}; nothing is snoozed")
    caps = caps_for(first, team, policy)
    if caps.longest <= 0:
        return record(SnoozeOutcome.REFUSED, "snooze not honoured: the policy allows none for "
                      f"team {team} and this pod's class")
    week = [r for r in history if r.workload == workload and r.outcome in HONOURED
            and now - r.seen < WEEK]
    if len(week) >= caps.per_week:
        return record(SnoozeOutcome.REFUSED, f"snooze not honoured: {len(week)} snoozes of this "
                      f"workload in the last 7 days, the policy allows {caps.per_week}")
    if asked <= now:
        return record(SnoozeOutcome.EXPIRED,
                      f"snooze until {stamp(asked)} is already past: ignored")
    if asked - now > caps.longest:
        cut = now + caps.longest
        return record(SnoozeOutcome.CAPPED, f"reclaim snoozed until {stamp(cut)}, cut to the "
                      f"policy's longest snooze of {duration_text(caps.longest)} (asked: "
                      f"{stamp(asked)})", cut)
    return record(SnoozeOutcome.SNOOZED, f"reclaim snoozed until {stamp(asked)}", asked)


def _pod_key(pod: Pod) -> str:
    return f"{pod.namespace}/Pod/{pod.name}"


def _carrier(pod: Pod, owner: Owner) -> tuple[str, str | None]:
    """(workload key, value): the pod's own annotation first, else its top-level owner's."""
    if SNOOZE_UNTIL in pod.annotations:
        return _pod_key(pod), pod.annotations[SNOOZE_UNTIL]
    return owner.key, owner.snooze


def kept(records: Iterable[SnoozeRecord], now: float) -> list[SnoozeRecord]:
    """What is worth keeping: open records, and the last 7 days' for the weekly cap."""
    return [r for r in records if not r.closed or now - r.seen < WEEK]
