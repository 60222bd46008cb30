"""The report's pod-level sections: top idle pods with the reclaimer's decision, the queue, and
teams against their quotas (pure)."""

from __future__ import annotations

from collections import defaultdict

import msgspec

from gpusteward.core.model import class_of
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim import gangs, reserve
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import QUEUE_BLOCKED, ActionKind, Plan, Snapshot
from gpusteward.core.reclaim.quota import borrowed, team
from gpusteward.core.reclaim.rules import cooling_until
from gpusteward.core.report.model import (
    Decision,
    DecisionState,
    IdlePod,
    PodUsage,
    QueuedPod,
    QueueGroup,
    Step,
    TeamQuota,
    UsageState,
)
from gpusteward.core.sharing import pod_shares
from gpusteward.core.times import stamp


def decisions(snap: Snapshot, policy: Policy) -> dict[str, Decision]:
    """pod key -> what the reclaimer would do this cycle: the same pure `plan`, observe mode
    (nothing is written; the report only reads the plan)."""
    decided = plan(snap, policy)
    if decided.halted:
        return {p.key: Decision(DecisionState.HALTED, Step.NONE, decided.halted)
                for p in snap.pods}
    out = {v.pod: Decision(DecisionState(v.state), Step.NONE, "; ".join(v.reasons))
           for v in decided.verdicts}
    for action, why in decided.held_back:
        out[action.pod.key] = Decision(out[action.pod.key].state, Step.HELD, why)
    for a in decided.actions:
        if a.kind == ActionKind.COOL:  # the cooldown note: read below, from the pod
            continue
        if a.kind == ActionKind.UNBLOCK:  # a stale queue note goes: no decision about the pod
            continue
        kind = f"reclaim/{a.how}" if a.kind == ActionKind.RECLAIM else a.kind
        out[a.pod.key] = Decision(_state(decided, a.pod.key), kind, a.message)
    for v in decided.verdicts:
        if v.snoozed_until is not None:  # the owner's snooze, not the cleared marks, is news
            out[v.pod] = Decision(DecisionState(v.state), Step.SNOOZED, "; ".join(v.reasons))
    for pod in snap.pods:
        # The report reads no ledger: the reclaimer's note on the pod says what it holds back.
        end = cooling_until(pod)
        seen = out.get(pod.key)
        if end is not None and end > snap.now and seen is not None and (
                seen.state != DecisionState.PROTECTED):
            out[pod.key] = Decision(DecisionState.PROTECTED, Step.NONE,
                                    f"inside reclaimCooldown until {stamp(end)}")
    return out


def _state(decided: Plan, key: str) -> DecisionState:
    return next((DecisionState(v.state) for v in decided.verdicts if v.pod == key),
                DecisionState.UNKNOWN)


def top_idle(usages: list[PodUsage], snap: Snapshot, policy: Policy,
             top: int) -> tuple[IdlePod, ...]:
    """Pods present now with idle GPU-hours in the window, most idle GPU-hours first; a gang's
    pods as one line, with which of them are idle (a gang is judged and reclaimed whole)."""
    gang = {p.key: g for p in snap.pods if (g := gangs.gang_of(p)) is not None}
    lines: dict[str, list[PodUsage]] = defaultdict(list)
    for u in usages:
        if u.state != UsageState.GONE:
            lines[gang.get(u.key, u.key)].append(u)
    ranked = sorted((sorted(m, key=lambda u: u.key) for m in lines.values()
                     if sum(u.idle_hours for u in m) > 0),
                    key=lambda m: (-sum(u.idle_hours for u in m), m[0].key))[:top]
    if not ranked:
        return ()
    decided = decisions(snap, policy)
    missing = Decision(DecisionState.UNKNOWN, Step.NONE, "not in the reclaimer's snapshot")
    out = []
    for members in ranked:
        u = members[0]
        line = IdlePod(
            namespace=u.namespace, pod=u.name, owner=u.owner, team=u.team, card=u.card,
            gpus=u.gpus, state=u.state, idle_since=u.idle_since, idle_gpu_hours=u.idle_hours,
            idle_cost=u.idle_cost, reclaimer=decided.get(u.key, missing))
        out.append(line if u.key not in gang else _gang_line(
            line, gang[u.key], members, [decided.get(m.key, missing) for m in members]))
    return tuple(out)


# The member decision a gang's line shows: the furthest its reclaim has come.
_FURTHEST = {str(k): i for i, k in enumerate(
    (ActionKind.RECLAIM, ActionKind.BLOCK, Step.HELD, ActionKind.WARN, ActionKind.MARK))}


def _gang_line(first: IdlePod, name: str, members: list[PodUsage],
               said: list[Decision]) -> IdlePod:
    idle = tuple(m.name for m in members if m.state == UsageState.IDLE)
    whole = len(idle) == len(members)
    # Not idle unless all are: the worst member's state stands for the gang's.
    state = first.state if whole else next(
        s for s in (UsageState.FAULTY, UsageState.BUSY, UsageState.UNKNOWN)
        if any(m.state == s for m in members))
    since = [m.idle_since for m in members]
    costs = [m.idle_cost for m in members if m.idle_cost is not None]
    shown = min(said, key=lambda d: _FURTHEST.get(d.action.split("/")[0], len(_FURTHEST)))
    return msgspec.structs.replace(
        first, gang=name, pods=len(members), idle_pods=idle, state=state,
        card=",".join(sorted({m.card for m in members})),
        gpus=sum(m.gpus for m in members),
        idle_since=None if not whole or None in since else max(s for s in since if s is not None),
        idle_gpu_hours=sum(m.idle_hours for m in members),
        idle_cost=sum(costs) if costs else None, reclaimer=shown)


def queue(snap: Snapshot, policy: Policy) -> tuple[QueuedPod, ...]:
    """Pending GPU pods, longest waiting first."""
    pending = [p for p in snap.pods if p.node is None and not p.deleting and p.gpus > 0]
    out = []
    for p in pending:
        held = reserve.held(p, snap.now)
        out.append(QueuedPod(
            namespace=p.namespace, pod=p.name, team=team(p, snap.namespace_labels),
            cls=class_of(p.labels, p.annotations, policy.default_class), gpus=p.gpus,
            priority=p.priority, wait_seconds=max(0.0, snap.now - p.created_at),
            unschedulable=p.unschedulable_since is not None,
            reserved_node=held.node if held else "", reserved_until=held.until if held else "",
            not_freed=p.annotations.get(QUEUE_BLOCKED, "")))
    return tuple(sorted(out, key=lambda q: (-q.wait_seconds, q.namespace, q.pod)))


def queue_groups(pods: tuple[QueuedPod, ...]) -> tuple[QueueGroup, ...]:
    acc: dict[tuple[str, str], list[QueuedPod]] = defaultdict(list)
    for q in pods:
        acc[(q.team, q.cls)].append(q)
    return tuple(QueueGroup(t, c, len(m), sum(q.gpus for q in m),
                            max(q.wait_seconds for q in m)) for (t, c), m in sorted(acc.items()))


def quotas(usages: list[PodUsage], snap: Snapshot, policy: Policy) -> tuple[TeamQuota, ...]:
    """Every team with a quota or with GPUs: used, borrowed beyond quota, idle within quota."""
    over_uids = borrowed(snap.pods, policy, snap.namespace_labels, snap.tiers,
                         pod_shares(snap.pods, snap.nodes))
    over = {p.key for p in snap.pods if p.uid in over_uids}
    present = [u for u in usages if u.state != UsageState.GONE]
    names = sorted(set(policy.teams) | {u.team for u in present})
    out = []
    for name in names:
        mine = [u for u in present if u.team == name]
        spec = policy.teams.get(name)
        out.append(TeamQuota(
            team=name, quota=None if spec is None else spec.quota_gpus,
            used=float(sum(u.gpus for u in mine)),
            borrowed=float(sum(u.gpus for u in mine if u.key in over)),
            idle_within_quota=float(sum(u.gpus for u in mine
                                        if u.state == UsageState.IDLE and u.key not in over)),
            idle_borrowed=float(sum(u.gpus for u in mine
                                    if u.state == UsageState.IDLE and u.key in over))))
    return tuple(out)
