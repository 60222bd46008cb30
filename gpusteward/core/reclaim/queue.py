"""Queue enforcement: free idle GPUs early for higher-priority pods waiting in the queue.

A pending GPU pod that the scheduler found unschedulable, waiting at least `queue.minWait` and
allowed to preempt, may have idle pods reclaimed for it — only pods of strictly lower priority
(or of equal priority from an over-quota team while the waiting team is under its quota), only on
a node where it then fits (card, GPUs, node selector, taints), and as few as possible. A pod
nominated to a node already (the scheduler's own preemption is freeing it, or a reservation
holds what gpusteward freed: reserve.py) gets nothing more: one path per pod.

The waiting pods of one gang (gangs.py) are claimed for together, all it needs or none
(gang_claim): the scheduler places a gang whole (a PodGroup: its minCount) or not at all.

Capacity is room.Room: units of allocatable, and on a HAMi node each device's cores and memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

import msgspec

from gpusteward.core.cards import CARD_TYPES_ANNOTATION, parse_card_types, preference_rank
from gpusteward.core.model import RESERVED, Node, Pod
from gpusteward.core.reclaim.quota import TeamUsage
from gpusteward.core.reclaim.room import Room


class Candidate(msgspec.Struct, frozen=True):
    """An idle pod whose whole owner may be reclaimed, so its GPUs can be freed."""

    pod: Pod
    team: str


class Claim(msgspec.Struct, frozen=True):
    pending: Pod
    node: str
    victims: tuple[Candidate, ...]


def waiting(pods: Iterable[Pod], now: float, min_wait: float) -> list[Pod]:
    """Pending GPU pods the scheduler gave up on for now, highest priority (then oldest) first;
    not one nominated (a preemption made room for it) or holding a reservation (reserve.py)."""
    out = [p for p in pods if p.node is None and not p.deleting and p.gpus > 0
           and p.unschedulable_since is not None and now - p.unschedulable_since >= min_wait
           and p.preemption_policy != "Never" and p.nominated_node is None
           and RESERVED not in p.annotations]
    return sorted(out, key=lambda p: (-p.priority, p.unschedulable_since or 0, p.uid))


class VictimPool:
    """Reclaimable idle pods by node, each node's in the order ``claim`` takes them: largest
    first (fewest victims), then lowest priority. Built once per cycle, so each pending pod
    scans only the head of each node's list instead of every candidate."""

    def __init__(self, candidates: Iterable[Candidate]) -> None:
        self.by_node: dict[str, list[Candidate]] = {}
        for c in sorted(candidates, key=lambda c: (-c.pod.gpus, c.pod.priority, c.pod.uid)):
            if c.pod.node:
                self.by_node.setdefault(c.pod.node, []).append(c)

    def on(self, node: str) -> list[Candidate]:
        return self.by_node.get(node, [])

    def take(self, claim: Claim) -> None:
        taken = {v.pod.uid for v in claim.victims}
        self.by_node[claim.node] = [c for c in self.on(claim.node) if c.pod.uid not in taken]

    def copy(self) -> VictimPool:
        out = VictimPool(())
        out.by_node = dict(self.by_node)  # take() replaces a node's list, never edits it
        return out


def fits(pending: Pod, node: Node, patterns: Sequence[str] = ()) -> bool:
    """Everything but capacity: card type (``patterns``: the pod's, parsed), the GPU resources
    it asks for (a MIG slice is no whole GPU), node selector, taints."""
    if patterns and preference_rank(node.product, patterns) is None:
        return False
    if node.unschedulable or node.gpus < pending.gpus:
        return False
    if pending.vgpu_asks and not node.vgpus:  # HAMi places it on a node HAMi registered only
        return False
    if node.resources and any(node.resources.get(r, 0) < n for r, n in pending.resources.items()):
        return False
    if any(node.labels.get(k) != v for k, v in pending.node_selector.items()):
        return False
    hard = [t for t in node.taints if t.effect in ("NoSchedule", "NoExecute")]
    return all(any(tol.tolerates(t) for tol in pending.tolerations) for t in hard)


def may_displace(pending: Pod, pending_team: TeamUsage, victim: Candidate,
                 victim_team: TeamUsage) -> bool:
    if victim.pod.priority < pending.priority:
        return True
    return (victim.pod.priority == pending.priority and victim_team.over
            and pending_team.under_after(pending.gpus))


def claim(pending: Pod, nodes: Mapping[str, Node], free: Room, victims: VictimPool,
          teams: Mapping[str, TeamUsage], pending_team: str) -> Claim | None:
    """The smallest set of victims on one node that lets `pending` fit there, if any.

    free: what is free on each node, counting terminating pods' GPUs as already free.
    Fewest victims wins, then fewest GPUs freed, then the lowest-priority victims.
    """
    try:
        patterns = parse_card_types(pending.annotations.get(CARD_TYPES_ANNOTATION))
    except ValueError:
        return None
    if _room(pending, nodes, free, patterns) is not None:
        return None  # it fits without reclaiming anything: waiting for another reason
    own = teams.get(pending_team) or TeamUsage(pending_team)

    def allowed(c: Candidate) -> bool:
        return may_displace(pending, own, c, teams.get(c.team) or TeamUsage(c.team))

    best: tuple[tuple[int, int, int, str], Claim] | None = None
    for name, node in nodes.items():
        ordered = victims.on(name)
        if not ordered or not fits(pending, node, patterns):
            continue
        chosen = _fewest(ordered, _enough(free, pending, name), allowed)
        if chosen is None:
            continue
        rank = (len(chosen), sum(c.pod.gpus for c in chosen),
                max(c.pod.priority for c in chosen), name)
        if best is None or rank < best[0]:
            best = (rank, Claim(pending, name, tuple(chosen)))
    return None if best is None else best[1]


class GangClaim(NamedTuple):
    """Claims that let every waiting pod of one gang fit at once, and the free GPUs and victims
    left once they are made (the gang's pods that fit in free GPUs take those)."""

    claims: tuple[Claim, ...]
    free: Room
    victims: VictimPool


class GangShort(NamedTuple):
    """A waiting gang not all of whose pods can be placed: how many could (in free GPUs or on
    victims), and the idle GPUs it would have taken to place those."""

    placeable: int
    members: int
    gpus: int


def gang_claim(members: Sequence[Pod], nodes: Mapping[str, Node], free: Room,
               victims: VictimPool, teams: Mapping[str, TeamUsage],
               pending_team: str, need: int | None = None) -> GangClaim | GangShort:
    """``need`` (default: all) of a waiting gang's pods placed, by free GPUs or by victims, or
    what falls short: kube-scheduler places a gang all or nothing (its GangScheduling plugin
    waits for minCount pods to fit at once), so freeing GPUs for fewer helps none of them and
    costs the victims their work."""
    need = len(members) if need is None else need
    left, pool, claims, placeable = free.copy(), victims.copy(), [], 0
    for pod in members:
        if placeable >= need:
            break
        try:
            room = _room(pod, nodes, left, parse_card_types(
                pod.annotations.get(CARD_TYPES_ANNOTATION)))
        except ValueError:
            continue  # a pod the scheduler cannot place either
        if room is not None:
            left.take(pod, room, ())
            placeable += 1
            continue
        c = claim(pod, nodes, left, pool, teams, pending_team)
        if c is not None:
            take(c, left, pool)
            claims.append(c)
            placeable += 1
    if placeable < need:
        return GangShort(placeable, need, sum(v.pod.gpus for c in claims for v in c.victims))
    return GangClaim(tuple(claims), left, pool)


def take(c: Claim, free: Room, victims: VictimPool) -> None:
    """Make the claim on the cycle's state: its victims taken, its node's room counted with
    what they free and without what the pending pod takes."""
    victims.take(c)
    free.take(c.pending, c.node, [v.pod for v in c.victims])


def _room(pending: Pod, nodes: Mapping[str, Node], free: Room,
          patterns: Sequence[str]) -> str | None:
    """A node where ``pending`` fits in what is free, if any. The cheap test first: fits() is
    the cost when thousands of nodes meet hundreds of pods."""
    return next((name for name, node in nodes.items()
                 if free.free(name) >= pending.gpus and fits(pending, node, patterns)
                 and free.fits(pending, name)), None)


def _enough(free: Room, pending: Pod, node: str) -> Callable[[list[Candidate]], bool]:
    return lambda chosen: free.fits(pending, node, [c.pod for c in chosen])


def _fewest(ordered: list[Candidate], enough: Callable[[list[Candidate]], bool],
            allowed: Callable[[Candidate], bool]) -> list[Candidate] | None:
    """Greedy over a node's victims in VictimPool order, skipping those `pending` may not take,
    until ``enough`` of them are chosen."""
    chosen: list[Candidate] = []
    for c in ordered:
        if enough(chosen):
            return chosen
        if allowed(c):
            chosen.append(c)
    return chosen if enough(chosen) else None
