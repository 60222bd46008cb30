"""One reclaim cycle: Snapshot -> Plan. Pure; `now` comes from the snapshot.

Stages live in pod annotations, so a restarted reclaimer picks up where it left off:
    idle (idle-since + GPUIdle) -> warned (reclaim-at + GPUIdleWarning) -> at the deadline, still
    idle: reclaimed. Renewed activity clears the marks (GPUActive).
Pending higher-priority pods may have idle victims reclaimed at once (queue.py). Limits cap the
reclaims of a cycle; marks and warnings are reversible metadata and are not limited.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import msgspec

from gpusteward.core.model import Pod
from gpusteward.core.owners import WHOLE_OWNER
from gpusteward.core.policy import OwnerSwitch, Policy
from gpusteward.core.reclaim import (
    demote,
    gangs,
    kinds,
    kueue,
    queue,
    reserve,
    selfservice,
    snooze,
)
from gpusteward.core.reclaim.model import (
    COOLDOWN_UNTIL,
    FAULT_NOTE,
    FAULTY_GPU,
    IDLE_SINCE,
    QUEUE_BLOCKED,
    RECLAIM_AT,
    RECLAIM_BLOCKED,
    Action,
    ActionKind,
    Evidence,
    How,
    Owner,
    Plan,
    Reason,
    Rule,
    Snapshot,
    Verdict,
    VerdictState,
)
from gpusteward.core.reclaim.quota import TeamUsage, borrowed, team, usage
from gpusteward.core.reclaim.room import Room
from gpusteward.core.reclaim.rules import (
    cooldown_end,
    judge,
    last_reclaims,
    protections,
    rule_for,
)
from gpusteward.core.sharing import pod_shares
from gpusteward.core.times import HOUR, parse_time, stamp

GROUP_ACTIONS = WHOLE_OWNER  # act on a whole workload: only when all its pods are idle
# Verdicts compared per pod, as module names: Python 3.11 looks every `Enum.MEMBER` up through
# EnumType.__getattr__ (~0.1 µs, twenty times a global), and `How(value)` costs microseconds.
_BUSY, _IDLE = VerdictState.BUSY, VerdictState.IDLE
_HOWS = {str(h): h for h in How}  # the policy's ownerActions words


def plan(snap: Snapshot, policy: Policy) -> Plan:
    # Restores give GPUs back within quota: telemetry has no say in them.
    shares = pod_shares(snap.pods, snap.nodes)  # what each running pod holds, for quotas
    back = tuple(selfservice.restores(snap.restore_asks, snap.pods, policy,
                                      snap.namespace_labels, shares))
    if not snap.telemetry_ok:
        return Plan((), (), halted=f"telemetry unavailable: {snap.telemetry_problem}",
                    restores=back)
    over = borrowed(snap.pods, policy, snap.namespace_labels, snap.tiers, shares)
    cooled = last_reclaims(snap.recent_actions)
    snoozed = _snoozes(snap, policy, cooled)
    verdicts: list[Verdict] = []
    staged: list[Action] = []
    cools: list[Action] = []  # a cooldown's note: no mark, so the stages' re-checks hold
    idle_now: dict[str, bool] = {}  # pod uid -> idle by its own (not within-quota) rule
    states: dict[str, VerdictState] = {}
    due: set[str] = set()
    for pod in snap.pods:
        if pod.node is None:
            continue
        v, action, idle, is_due = _judge_pod(pod, snap, policy, pod.uid in over,
                                             snoozed.until.get(pod.uid), cooled)
        verdicts.append(v)
        idle_now[pod.uid] = idle
        states[pod.uid] = v.state
        if is_due:
            due.add(pod.uid)
        elif action is not None:
            staged.append(action)
        cool = _cooling(pod, snap, policy, cooled)
        if cool is not None:
            cools.append(cool)
    by_uid = {p.uid: p for p in snap.pods}
    teams = usage(snap.pods, policy, snap.namespace_labels, shares)
    reclaims, reserves, noted = _queue_claims(snap, policy, by_uid, idle_now, teams)
    claimed = {a.pod.uid for a in reclaims}
    reclaims += [a for a in _due_reclaims(snap, policy, by_uid, due, over)
                 if a.pod.uid not in claimed]
    blocks = [a for a in reclaims if a.kind == ActionKind.BLOCK]  # an Event only: no limit
    unblocks = _stale_notes(snap, noted | {r.pod.uid for r in reserves})
    allowed, held = _limit([a for a in reclaims if a.kind == ActionKind.RECLAIM], snap, policy)
    released = list(reserve.releases(snap.pods, snap.now, float(policy.queue.reservation_ttl),
                                     lambda p: team(p, snap.namespace_labels)))
    undemoted = demote.undemotions((p for p in snap.pods if p.node is not None),
                                   lambda p: owner_of(p, snap), states,
                                   lambda p: team(p, snap.namespace_labels))
    return Plan(tuple(verdicts),
                # undemotions and cooldown notes first: the pod's marks a stage clears are
                # what their re-check compares, and they write none
                tuple(undemoted + cools + staged + blocks + unblocks +
                      _covered(reserves, allowed) + allowed + released),
                tuple(held), snoozes=snoozed.changed, restores=back)


def _covered(reserves: list[Action], allowed: list[Action]) -> list[Action]:
    """The reservations whose every victim is to be reclaimed this cycle, itself or as a peer
    of its workload (a limit may hold one back: then nothing is freed, nothing reserved). They
    go first: the pod is nominated before its GPUs are free, so that no other pod's scheduling
    attempt finds them free in between; a victim then not reclaimed releases it at once."""
    covered = {a.pod.uid for a in allowed} | {p.uid for a in allowed for p in a.peers}
    return [r for r in reserves if all(u in covered for u in r.after)]


def _snoozes(snap: Snapshot, policy: Policy, cooled: Mapping[str, float]) -> snooze.Review:
    return snooze.review(
        (p for p in snap.pods if p.node is not None), snap.snoozes, snap.now, policy,
        lambda p: owner_of(p, snap), lambda p: team(p, snap.namespace_labels),
        lambda p: _vetoes(p, owner_of(p, snap), snap, policy, cooled))


def _vetoes(pod: Pod, owner: Owner, snap: Snapshot, policy: Policy,
            cooled: Mapping[str, float]) -> tuple[str, ...]:
    """cooled: each workload's last reclaim the ledger remembers (reclaimCooldown)."""
    return tuple(protections(pod, owner, policy, snap.now, cooled.get(owner.key)))


def _cooling(pod: Pod, snap: Snapshot, policy: Policy,
             cooled: Mapping[str, float]) -> Action | None:
    """The pod's COOLDOWN_UNTIL brought in line with its workload's reclaimCooldown (written,
    changed or removed), for the extender's preempt verb; None when it already is."""
    end = cooldown_end(pod, policy, snap.now, cooled.get(owner_of(pod, snap).key))
    want = None if end is None else stamp(end)
    if pod.annotations.get(COOLDOWN_UNTIL) == want:
        return None
    why = (f"inside reclaimCooldown until {want}: neither reclaimed nor picked by the "
           "extender's preempt verb" if want else "reclaimCooldown over")
    return Action(ActionKind.COOL, pod, team(pod, snap.namespace_labels), Reason.PROTECTED,
                  why, until=end)


def _judge_pod(pod: Pod, snap: Snapshot, policy: Policy, is_borrowed: bool,
               snoozed_until: float | None,
               cooled: Mapping[str, float]) -> tuple[Verdict, Action | None, bool, bool]:
    """(audit verdict, stage action, idle by its own rule, due for reclaim)."""
    name = team(pod, snap.namespace_labels)
    owner = owner_of(pod, snap)
    rule = rule_for(pod, policy)
    vetoes = _vetoes(pod, owner, snap, policy, cooled)
    if vetoes:
        v = Verdict(pod.key, name, pod.gpus, VerdictState.PROTECTED, vetoes, rule=rule)
        clear = _clear(pod, name, Reason.PROTECTED, "; ".join(vetoes)) if _marked(pod) else None
        return v, clear, False, False
    fault = snap.faults.get(pod.key)
    if fault is not None:
        v, note = _faulty(pod, name, str(fault), rule)
        return v, note, False, False
    if FAULTY_GPU in pod.annotations:  # repaired: the idle clock starts afresh
        v = Verdict(pod.key, name, pod.gpus, VerdictState.UNKNOWN, ("GPU no longer faulty",),
                    rule=rule)
        return v, _clear(pod, name, Reason.HEALTHY, "its GPU is no longer faulty"), False, False
    own_state, _ = judge(_evidence(snap, rule, pod), rule, pod.gpus)
    rule = _effective(rule, policy, name, is_borrowed)
    evidence = _evidence(snap, rule, pod)
    state, why = judge(evidence, rule, pod.gpus)
    if snoozed_until is not None:
        # Snoozed: no stage advances, and earlier marks go, so a fresh warning follows the end.
        why = f"{why}; reclaim snoozed until {stamp(snoozed_until)}"
        verdict = Verdict(pod.key, name, pod.gpus, state, (why,), evidence, rule, is_borrowed,
                          snoozed_until)
        clear = _clear(pod, name, Reason.SNOOZED, why) if _marked(pod) else None
        return verdict, clear, False, False
    verdict = Verdict(pod.key, name, pod.gpus, state, (why,), evidence, rule, is_borrowed)
    action, is_due = _stage(pod, name, state, why, rule, snap.now)
    return verdict, action, own_state == _IDLE, is_due


def _faulty(pod: Pod, team_name: str, why: str, rule: Rule) -> tuple[Verdict, Action | None]:
    """A pod on a faulty GPU: neither idle nor busy. Its marks go, and a note says why, once
    (the annotation holds the reason, so an unchanged fault writes nothing)."""
    v = Verdict(pod.key, team_name, pod.gpus, VerdictState.FAULTY, (f"on a faulty GPU: {why}",),
                rule=rule)
    if pod.annotations.get(FAULTY_GPU) == why:
        return v, None
    return v, Action(ActionKind.FAULT, pod, team_name, Reason.FAULTY, FAULT_NOTE + why)


def _effective(rule: Rule, policy: Policy, team_name: str, is_borrowed: bool) -> Rule:
    """Idle GPUs inside a team's quota wait the policy's longer window."""
    spec = policy.teams.get(team_name)
    if spec is None or spec.quota_gpus is None or is_borrowed:
        return rule
    window = max(rule.window, float(policy.reclaim.within_quota_window))
    return msgspec.structs.replace(rule, window=window)


def _evidence(snap: Snapshot, rule: Rule, pod: Pod) -> Evidence | None:
    return snap.evidence.get(rule.window, {}).get(pod.key)


def owner_of(pod: Pod, snap: Snapshot) -> Owner:
    return snap.owners.get(pod.uid) or Owner("Pod", pod.namespace, pod.name, (pod.uid,))


def _stage(pod: Pod, team_name: str, state: VerdictState, why: str, rule: Rule,
           now: float) -> tuple[Action | None, bool]:
    if state == _BUSY:
        return (_clear(pod, team_name, Reason.ACTIVE, why) if _marked(pod) else None), False
    if state != _IDLE:
        return None, False  # unknown: neither advance nor clear; the evidence says nothing
    if IDLE_SINCE not in pod.annotations:
        return Action(ActionKind.MARK, pod, team_name, Reason.IDLE, f"GPUs idle: {why}"), False
    deadline = parse_stamp(pod.annotations.get(RECLAIM_AT))
    if deadline is None:
        at = now + rule.grace
        return Action(ActionKind.WARN, pod, team_name, Reason.IDLE,
                      f"GPUs idle: {why}; reclaim at {stamp(at)} unless they get busy",
                      reclaim_at=at), False
    return None, deadline <= now


def _clear(pod: Pod, team_name: str, reason: Reason, why: str) -> Action:
    return Action(ActionKind.CLEAR, pod, team_name, reason, f"marks cleared: {why}")


def _marked(pod: Pod) -> bool:
    a = pod.annotations
    return IDLE_SINCE in a or RECLAIM_AT in a or FAULTY_GPU in a


def how_to_reclaim(owner: Owner, policy: Policy) -> How:
    """The owner's own switch where it has one (core.reclaim.kinds), else the policy's action
    for the built-in kinds; an owner that must not be stopped is blocked."""
    if owner.blocked:
        return How.BLOCK
    if owner.how:
        return owner.how
    a = policy.reclaim.owner_actions
    action = {"Pod": a.pod, "Job": a.job, "Deployment": a.deployment,
              "StatefulSet": a.stateful_set}.get(owner.kind) or a.kinds.get(
        f"{owner.kind}.{owner.group}", a.unknown)
    if not isinstance(action, str):  # a policy switch the owner walk did not reach: no guess
        return How.BLOCK
    return _HOWS[action]


def _whole_owner(owner: Owner, uid: str, ok: Mapping[str, bool]) -> bool:
    """True when every GPU pod of the owner is ok (idle, or due)."""
    return all(ok.get(u, False) for u in owner.pods or (uid,))


def _due_reclaims(snap: Snapshot, policy: Policy, by_uid: dict[str, Pod], due: set[str],
                  over: set[str]) -> list[Action]:
    out: list[Action] = []
    running = gangs.running(snap.pods)
    for uid in sorted(due):
        pod = by_uid[uid]
        owner = owner_of(pod, snap)
        how = how_to_reclaim(owner, policy)
        if how == How.DEACTIVATE:
            how = demote.how_for(pod, policy)
        if how in GROUP_ACTIONS and not _whole_owner(owner, uid, dict.fromkeys(due, True)):
            continue  # partly idle workload: marks only
        if how == How.EVICT and (gang := gangs.gang_of(pod)) is not None:
            out += _gang_eviction(snap, policy, pod, gang, running[gang], due, over)
            continue
        blocked = _blocked_reason(owner, policy) if how == How.BLOCK else None
        if blocked:
            how = How.BLOCK
        if how == How.ANNOTATE or (how == How.BLOCK and pod.annotations.get(
                RECLAIM_BLOCKED) == blocked) or (
                how == How.DEMOTE and owner.demoted_at is not None):
            continue  # annotate only; blocked, and the pod says why; demoted: Kueue's to preempt
        reason = Reason.OVER_QUOTA if uid in over else Reason.IDLE
        message = (f"GPUs idle but not reclaimed: {blocked}"
                   if how == How.BLOCK else _reclaiming(pod, owner, how, policy))
        out.append(Action(ActionKind.BLOCK if how == How.BLOCK else ActionKind.RECLAIM, pod,
                          team(pod, snap.namespace_labels), reason, message, owner, how,
                          peers=_peers(owner, uid, how, by_uid)))
    return out


def _gang_eviction(snap: Snapshot, policy: Policy, pod: Pod, gang: str, members: list[Pod],
                   due: set[str], over: set[str]) -> list[Action]:
    """A due pod of a gang stopped by eviction: the whole gang's one reclaim, made from its
    first pod once every running pod is due (peers: the others); else a block on each due pod
    saying which ranks are due. Nothing for the gang's other pods."""
    name = team(pod, snap.namespace_labels)
    reason = Reason.OVER_QUOTA if any(m.uid in over for m in members) else Reason.IDLE
    other_way = [m for m in members if m.uid in due and _stop_of(m, snap, policy) != How.EVICT]
    if all(m.uid in due for m in members) and not other_way:
        if pod is not members[0]:
            return []
        gpus = sum(m.gpus for m in members)
        message = (f"reclaiming {gpus} idle GPU(s) by eviction of all {len(members)} pods of "
                   f"{gang}")
        return [Action(ActionKind.RECLAIM, pod, name, reason, message, gangs.owner(members),
                       How.EVICT, peers=tuple(members[1:]))]
    blocked = (gangs.not_all_evictable(gang, other_way) if other_way
               else gangs.partly_due(gang, members, due))
    if pod.annotations.get(RECLAIM_BLOCKED) == blocked:
        return []  # the pod says why already
    return [Action(ActionKind.BLOCK, pod, name, reason, f"GPUs idle but not reclaimed: {blocked}",
                   owner_of(pod, snap), How.BLOCK)]


def _stop_of(pod: Pod, snap: Snapshot, policy: Policy) -> How:
    how = how_to_reclaim(owner_of(pod, snap), policy)
    return demote.how_for(pod, policy) if how == How.DEACTIVATE else how


def _reclaiming(pod: Pod, owner: Owner, how: How, policy: Policy) -> str:
    if how == How.DEMOTE:
        boost = policy.reclaim.kueue.priority_boost
        return (f"demoting {owner.kind} {owner.name}, its {pod.gpus} GPU(s) idle, by a Kueue "
                f"priority boost of {boost}: it runs until Kueue needs its quota")
    return f"reclaiming {pod.gpus} idle GPU(s) by {how} of {owner.kind} {owner.name}"


def _queue_claims(snap: Snapshot, policy: Policy, by_uid: dict[str, Pod],
                  idle_now: dict[str, bool], teams: Mapping[str, TeamUsage]
                  ) -> tuple[list[Action], list[Action], set[str]]:
    """Idle owners reclaimed for pending pods on the nodes (queue.py), then for Kueue Workloads
    waiting for their ClusterQueue's quota (kueue.py); and for each pending pod, the reservation
    of what its claim frees (reserve.py; a Workload's quota is not a node's GPUs: none). And the
    pods whose queue note holds this cycle (written now or before)."""
    if not policy.queue.enabled:
        return [], [], set()
    noted: set[str] = set()
    candidates = []
    for uid, idle in idle_now.items():
        pod = by_uid[uid]
        owner = owner_of(pod, snap)
        how = how_to_reclaim(owner, policy)
        if idle and how not in (How.ANNOTATE, How.BLOCK) and not owner.in_progress and (
                how not in GROUP_ACTIONS or _whole_owner(owner, uid, idle_now)) and not (
                how == How.EVICT and gangs.gang_of(pod)):  # never one pod of a gang
            candidates.append(queue.Candidate(pod, team(pod, snap.namespace_labels)))
    free = Room.of(_free_gpus(snap), snap.nodes,
                   (p for p in snap.pods if p.node and not p.deleting))
    victims = queue.VictimPool(candidates)
    actions: list[Action] = []
    reserves: list[Action] = []
    ttl = float(policy.queue.reservation_ttl)
    waiting = queue.waiting(snap.pods, snap.now, float(policy.queue.min_wait))
    members: dict[str, list[Pod]] = {}
    bound = gangs.running(snap.pods) if snap.min_counts else {}
    for p in waiting:
        if (g := gangs.gang_of(p)) is not None:
            members.setdefault(g, []).append(p)
    for pending in waiting:
        name = team(pending, snap.namespace_labels)
        gang = gangs.gang_of(pending)
        if gang is None:
            c = queue.claim(pending, snap.nodes, free, victims, teams, name)
            claims = [] if c is None else [c]
            if c is not None:
                queue.take(c, free, victims)
        elif pending is members[gang][0]:  # the whole gang, once
            whole = queue.gang_claim(members[gang], snap.nodes, free, victims, teams, name,
                                     _need(snap, gang, members[gang], bound))
            if isinstance(whole, queue.GangShort):
                why = _short_note(gang, whole)
                if why is not None:
                    noted.add(pending.uid)
                    if pending.annotations.get(QUEUE_BLOCKED) != why:  # written once
                        actions.append(Action(ActionKind.BLOCK, pending, name, Reason.QUEUE,
                                              f"GPUs not freed: {why}", how=How.BLOCK))
                continue
            claims = list(whole.claims)
            free, victims = whole.free, whole.victims
        else:
            continue
        for c in claims:
            actions += [_claimed(snap, policy, by_uid, v, c.pending, f"on {c.node} ", gang or "")
                        for v in c.victims]
            reserves.append(reserve.reserve(c.pending, c.node, [v.pod for v in c.victims],
                                            name, snap.now, ttl))
    if snap.kueue is not None:
        left = [c for node in victims.by_node.values() for c in node]
        for k in kueue.claims(snap.kueue, snap.now, float(policy.queue.min_wait), left,
                              lambda c: _workload(owner_of(c.pod, snap)), teams,
                              lambda p: team(p, snap.namespace_labels)):
            actions += [_claimed(snap, policy, by_uid, v, k.pending,
                                 f"in ClusterQueue {k.cluster_queue} ") for v in k.victims]
    return actions, reserves, noted


def _need(snap: Snapshot, gang: str, waiting: list[Pod],
          bound: Mapping[str, list[Pod]]) -> int:
    """How many of a gang's waiting pods must fit at once: its PodGroup's minCount less its
    pods bound already (``bound``: gangs.running; the scheduler's GangScheduling places the
    group once that many fit); all of them where no minCount is known."""
    least = snap.min_counts.get(gang)
    if least is None:
        return len(waiting)
    return max(0, min(len(waiting), least - len(bound.get(gang, ()))))


def _short_note(gang: str, short: queue.GangShort) -> str | None:
    """The note on a waiting gang's first pod, when idle GPUs could place part of it: why none
    are freed. None where idle GPUs would help none of it: it waits like any pod, unnoted."""
    if not short.gpus:
        return None
    return gangs.short_of(gang, short.placeable, short.members, short.gpus)


def _stale_notes(snap: Snapshot, holding: set[str]) -> list[Action]:
    """A queue note that no longer holds goes: the gang was placed (its note stayed on the pod,
    now bound), another of its pods is first now, idle GPUs no longer help it, queue
    enforcement was turned off; not on a pod reserved for this cycle (the reservation takes
    the note off itself)."""
    return [Action(ActionKind.UNBLOCK, p, team(p, snap.namespace_labels), Reason.QUEUE,
                   f"queue note no longer holds: {p.annotations[QUEUE_BLOCKED]}")
            for p in snap.pods if QUEUE_BLOCKED in p.annotations and p.uid not in holding]


def _claimed(snap: Snapshot, policy: Policy, by_uid: dict[str, Pod], v: queue.Candidate,
             pending: Pod, where: str, gang: str = "") -> Action:
    owner = owner_of(v.pod, snap)
    how = how_to_reclaim(owner, policy)
    of = f" of {gang}" if gang else ""
    return Action(ActionKind.RECLAIM, v.pod, v.team, Reason.QUEUE,
                  f"reclaiming {v.pod.gpus} idle GPU(s) {where}for pending {pending.key}{of} "
                  f"(priority {pending.priority} > {v.pod.priority})", owner, how,
                  peers=_peers(owner, v.pod.uid, how, by_uid), for_gang=gang)


def _workload(owner: Owner) -> str | None:
    """The Kueue Workload (namespace/name) an owner is stopped through, if any."""
    via = owner.via
    return f"{owner.namespace}/{via.name}" if via is not None and via.kind == "Workload" else None


def _blocked_reason(owner: Owner, policy: Policy) -> str:
    name = f"{owner.kind}.{owner.group}"
    if not owner.blocked and isinstance(policy.reclaim.owner_actions.kinds.get(name), OwnerSwitch):
        # how_to_reclaim blocks it because the walk did not read the object this cycle
        return f"{name} has a switch in the policy but could not be read this cycle"
    return owner.blocked or kinds.DEFAULT.unsupported(owner.group, owner.kind) or (
        f"no way to stop a {owner.kind} without its controller undoing it")


def _peers(owner: Owner, uid: str, how: How, by_uid: Mapping[str, Pod]) -> tuple[Pod, ...]:
    """The workload's other GPU pods, whose state a suspension or scale-down also rests on."""
    if how not in GROUP_ACTIONS:
        return ()
    return tuple(by_uid[u] for u in owner.pods if u != uid and u in by_uid)


def _free_gpus(snap: Snapshot) -> dict[str, int]:
    """Free GPUs per node; GPUs of terminating pods count as free (they are on their way), GPUs
    reserved for a waiting pod do not (they are that pod's: reserve.py)."""
    used: dict[str, int] = {}
    for p in snap.pods:
        if p.node and not p.deleting:
            used[p.node] = used.get(p.node, 0) + p.gpus
        elif p.node is None and (r := reserve.held(p, snap.now)) is not None:
            used[r.node] = used.get(r.node, 0) + r.gpus
    return {n: max(0, node.gpus - used.get(n, 0)) for n, node in snap.nodes.items()}


_ORDER = {Reason.QUEUE: 0, Reason.OVER_QUOTA: 1, Reason.IDLE: 2}


def _limit(reclaims: list[Action], snap: Snapshot,
           policy: Policy) -> tuple[list[Action], list[tuple[Action, str]]]:
    lim = policy.reclaim.limits
    hour = [a for a in snap.recent_actions if snap.now - a.at < HOUR]
    per_team: dict[str, int] = {}
    for past in hour:
        per_team[past.team] = per_team.get(past.team, 0) + 1
    allowed: list[Action] = []
    held: list[tuple[Action, str]] = []
    owners: set[str] = set()
    ordered = sorted(reclaims, key=lambda a: (_ORDER[a.reason], a.pod.priority, a.pod.uid))
    gangs_of: dict[str, list[Action]] = {}
    for a in ordered:
        if a.for_gang:
            gangs_of.setdefault(a.for_gang, []).append(a)
    for a in ordered:
        assert a.owner is not None
        if a.owner.key in owners:
            continue  # one action per owner: the first one covers the workload
        unit = [u for u in gangs_of.pop(a.for_gang, [])
                if u.owner is not None and u.owner.key not in owners] if a.for_gang else [a]
        if not unit:
            continue  # a later action of a gang already decided
        n, teams = len(unit), Counter(u.team for u in unit)
        need = f" (a waiting gang needs {n})" if a.for_gang else ""
        if busy := next((u.owner for u in unit if u.owner and u.owner.in_progress), None):
            why = f"{busy.kind} {busy.name} already being reclaimed{need}"
        elif len(allowed) + n > lim.max_per_cycle:
            why = f"limit: {lim.max_per_cycle} per cycle{need}"
        elif len(hour) + len(allowed) + n > lim.max_per_hour:
            why = f"limit: {lim.max_per_hour} per hour{need}"
        elif any(per_team.get(t, 0) + k > lim.max_per_team_per_hour for t, k in teams.items()):
            why = f"limit: {lim.max_per_team_per_hour} per team per hour{need}"
        else:
            why = ""
            allowed += unit
            for t, k in teams.items():
                per_team[t] = per_team.get(t, 0) + k
        held += [(u, why) for u in unit] if why else []
        owners.update(u.owner.key for u in unit if u.owner is not None)
    return allowed, held


def parse_stamp(text: str | None) -> float | None:
    """A mark's time; None when absent or unreadable (a hand-edited mark counts as none)."""
    try:
        return parse_time(text)
    except ValueError:
        return None
