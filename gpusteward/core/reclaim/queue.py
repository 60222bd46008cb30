"""Queue enforcement: free idle GPUs early for higher-priority pods waiting in the queue.

A pending GPU pod that the scheduler found unschedulable, waiting at least `queue.minWait` and
allowed to preempt, may have idle pods reclaimed for it — only pods of strictly lower priority
(or of equal priority from an over-quota team while the waiting team is under its quota), only on
a node where it then fits (card, GPUs, node selector, taints), and as few as possible.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from gpusteward.core.cards import CARD_TYPES_ANNOTATION, parse_card_types, preference_rank
from gpusteward.core.model import Node, Pod
from gpusteward.core.reclaim.quota import TeamUsage


class Candidate(msgspec.Struct, frozen=True):
    """An idle pod whose whole owner may be reclaimed, so its GPUs can be freed."""

    pod: Pod
    team: str


class Claim(msgspec.Struct, frozen=True):
    pending: Pod
    node: str
    victims: tuple[Candidate, ...]


def waiting(pods: Iterable[Pod], now: float, min_wait: float) -> list[Pod]:
    """Pending GPU pods the scheduler gave up on for now, highest priority (then oldest) first."""
    out = [p for p in pods if p.node is None and not p.deleting and p.gpus > 0
           and p.unschedulable_since is not None and now - p.unschedulable_since >= min_wait
           and p.preemption_policy != "Never"]
    return sorted(out, key=lambda p: (-p.priority, p.unschedulable_since or 0, p.uid))


def fits(pending: Pod, node: Node) -> bool:
    """Everything but capacity: card type, node selector, taints."""
    try:
        patterns = parse_card_types(pending.annotations.get(CARD_TYPES_ANNOTATION))
    except ValueError:
        return False
    if patterns and preference_rank(node.product, patterns) is None:
        return False
    if node.unschedulable or node.gpus < pending.gpus:
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


def claim(pending: Pod, nodes: Mapping[str, Node], free: Mapping[str, int],
          candidates: Iterable[Candidate], teams: Mapping[str, TeamUsage],
          pending_team: str) -> Claim | None:
    """The smallest set of victims on one node that lets `pending` fit there, if any.

    free: GPUs free on each node, counting GPUs of terminating pods as already free.
    Fewest victims wins, then fewest GPUs freed, then the lowest-priority victims.
    """
    own = teams.get(pending_team) or TeamUsage(pending_team)
    by_node: dict[str, list[Candidate]] = {}
    for c in candidates:
        vteam = teams.get(c.team) or TeamUsage(c.team)
        if c.pod.node and may_displace(pending, own, c, vteam):
            by_node.setdefault(c.pod.node, []).append(c)
    best: tuple[tuple[int, int, int, str], Claim] | None = None
    for name, node in nodes.items():
        if not fits(pending, node):
            continue
        need = pending.gpus - free.get(name, 0)
        if need <= 0:
            return None  # it fits without reclaiming anything: waiting for another reason
        chosen = _fewest(by_node.get(name, []), need)
        if chosen is None:
            continue
        rank = (len(chosen), sum(c.pod.gpus for c in chosen),
                max(c.pod.priority for c in chosen), name)
        if best is None or rank < best[0]:
            best = (rank, Claim(pending, name, tuple(chosen)))
    return None if best is None else best[1]


def _fewest(candidates: list[Candidate], need: int) -> list[Candidate] | None:
    """Largest first gives the fewest victims; among equal sizes, lowest priority first."""
    chosen, freed = [], 0
    for c in sorted(candidates, key=lambda c: (-c.pod.gpus, c.pod.priority, c.pod.uid)):
        if freed >= need:
            break
        chosen.append(c)
        freed += c.pod.gpus
    return chosen if freed >= need else None
