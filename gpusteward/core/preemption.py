"""Which of the scheduler's preemption candidates to keep: pure, so the table tests read it.

The scheduler proposes candidate nodes, each with the lower-priority victims it would delete and
the PodDisruptionBudgets that would break; it then picks one of the candidates an extender
returns by its own criteria (fewest PDB violations first). gpusteward only drops candidates:
the scheduler's victims and PDB counts pass through untouched, so nothing Kubernetes guarantees
changes. What is kept:

1. no candidate that would preempt a busy victim whose class `preemption.protectBusy` shields
   from the preemptor's class (the preemptor waits instead when none is left);
2. among the rest, only those with the fewest PDB violations (the scheduler's own first test,
   so idleness never costs a PDB);
3. among those, with `preferIdle`, only the best tier: all victims idle, else some idle, else
   none. A victim gpusteward has no evidence for counts as busy.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import add, eq, ge, mul, not_, sub

import msgspec

from gpusteward.core.policy import Preemption

IDLE, PARTLY_IDLE, BUSY = "idle", "partly-idle", "busy"
ANY = "*"


class Shield(msgspec.Struct, frozen=True):
    """The victim classes protectBusy shields from one preemptor class."""

    classes: frozenset[str] = frozenset()
    every: bool = False  # every class ("*" as the victim class)

    def __bool__(self) -> bool:
        return self.every or bool(self.classes)

    def covers(self, victim_class: str | None) -> bool:
        """None: a pod gpusteward does not know, left as the scheduler proposed."""
        return victim_class is not None and (self.every or victim_class in self.classes)


def shield_for(preemptor_class: str, policy: Preemption) -> Shield:
    shielded = {victim for victim, preemptors in policy.protect_busy.items()
                if preemptor_class in preemptors or ANY in preemptors}
    return Shield(frozenset(shielded - {ANY}), ANY in shielded)


class Candidates(msgspec.Struct):
    """The scheduler's candidate nodes as gpusteward judges their victims, one list per field
    and one row per node: a request may carry thousands, and whole-column operations run in C
    where a loop over row objects would cost more than the rest of the request."""

    nodes: list[str]
    victims: list[int]  # how many victims the scheduler proposes on the node
    idle: list[int]  # of them idle by their reclaim rule; no evidence counts as busy
    pdb_violations: list[int]
    shielded: list[bool] | None = None  # a busy victim is one the preemptor's Shield covers


class Choice(msgspec.Struct, frozen=True):
    kept: tuple[str, ...]  # node names, in the request's order
    tier: str | None  # the worst tier kept; None when nothing was
    vetoed: tuple[str, ...] = ()  # nodes dropped because protectBusy shields a victim
    dropped: tuple[str, ...] = ()  # nodes dropped for more PDB violations or a worse tier


_TIERS = (IDLE, PARTLY_IDLE, BUSY)


def tier_of(victims: int, idle: int) -> str:
    return _TIERS[tier_rank(victims, idle)]


def choose(c: Candidates, policy: Preemption) -> Choice:
    """Keep the candidates rules 1-3 of the module docstring allow."""
    vetoed: tuple[str, ...] = ()
    if c.shielded is not None and any(c.shielded):
        vetoed = tuple(compress(c.nodes, c.shielded))
        open_ = list(map(not_, c.shielded))
        c = Candidates(list(compress(c.nodes, open_)), list(compress(c.victims, open_)),
                       list(compress(c.idle, open_)), list(compress(c.pdb_violations, open_)))
    if not c.nodes:
        return Choice((), None, vetoed)
    if policy.prefer_idle and c.pdb_violations.count(c.pdb_violations[0]) == len(c.nodes) \
            and min(c.victims) > 0:
        return _best_tier(c, vetoed)
    # One sort key per row: PDB violations first (3 per violation), then the tier (0-2):
    # 2 - (any idle) - (all idle).
    keys = list(map(mul, c.pdb_violations, repeat(3)))
    if policy.prefer_idle:
        keys = list(map(sub, map(sub, map(add, keys, repeat(2)), map(bool, c.idle)),
                        map(ge, c.idle, c.victims)))
    best = min(keys)
    is_best = list(map(eq, keys, repeat(best)))
    kept = tuple(compress(c.nodes, is_best))
    dropped = tuple(compress(c.nodes, map(not_, is_best)))
    worst = best % 3 if policy.prefer_idle else max(
        map(tier_rank, compress(c.victims, is_best), compress(c.idle, is_best)))
    return Choice(kept, _TIERS[worst], vetoed, dropped)


def _best_tier(c: Candidates, vetoed: tuple[str, ...]) -> Choice:
    """The usual request (one PDB count for all, every node proposing a victim) ranked by tier
    alone: the sort keys above would all share their PDB part, so three column passes give the
    same choice as building them."""
    most_idle = max(c.idle)
    best: list[bool] | list[int] = []  # all idle (victims > 0, so some idle too)
    if most_idle >= min(c.victims):
        best = list(map(ge, c.idle, c.victims))
    if any(best):
        tier = IDLE
    elif most_idle > 0:
        best, tier = c.idle, PARTLY_IDLE
    else:
        return Choice(tuple(c.nodes), BUSY, vetoed)
    return Choice(tuple(compress(c.nodes, best)), tier, vetoed,
                  tuple(compress(c.nodes, map(not_, best))))


def tier_rank(victims: int, idle: int) -> int:
    return 2 - (idle > 0) - (idle >= victims)
