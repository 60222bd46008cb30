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

from collections.abc import Sequence

import msgspec

from gpusteward.core.policy import Preemption

IDLE, PARTLY_IDLE, BUSY = "idle", "partly-idle", "busy"
_RANK = {IDLE: 0, PARTLY_IDLE: 1, BUSY: 2}
ANY = "*"


class Victim(msgspec.Struct, frozen=True):
    """One victim as gpusteward judges it. class_name None: a pod it does not know."""

    uid: str
    idle: bool = False
    class_name: str | None = None


class Candidate(msgspec.Struct, frozen=True):
    node: str
    victims: tuple[Victim, ...]
    pdb_violations: int = 0


class Choice(msgspec.Struct, frozen=True):
    kept: tuple[str, ...]  # node names, in the request's order
    tier: str | None  # the tier of what was kept; None when nothing was
    vetoed: tuple[str, ...] = ()  # nodes dropped because protectBusy shields a victim
    dropped: tuple[str, ...] = ()  # nodes dropped for more PDB violations or a worse tier


def tier_of(victims: Sequence[Victim]) -> str:
    idle = sum(v.idle for v in victims)
    return IDLE if idle == len(victims) else PARTLY_IDLE if idle else BUSY


def shielded(preemptor_class: str, victim: Victim, policy: Preemption) -> bool:
    """Whether protectBusy forbids this preemptor to take this (busy or unknown) victim."""
    if victim.idle or victim.class_name is None:
        return False  # idle, or a pod gpusteward does not know: left as the scheduler proposed
    preemptors = [*policy.protect_busy.get(victim.class_name, ()),
                  *policy.protect_busy.get(ANY, ())]
    return preemptor_class in preemptors or ANY in preemptors


def choose(preemptor_class: str, candidates: Sequence[Candidate],
           policy: Preemption) -> Choice:
    """Keep the candidates rules 1-3 of the module docstring allow; tier: the worst kept."""
    vetoed = tuple(c.node for c in candidates
                   if any(shielded(preemptor_class, v, policy) for v in c.victims))
    shut = set(vetoed)
    open_ = [c for c in candidates if c.node not in shut]
    if not open_:
        return Choice((), None, vetoed)
    fewest = min(c.pdb_violations for c in open_)
    tiers = {c.node: tier_of(c.victims) for c in open_ if c.pdb_violations == fewest}
    if policy.prefer_idle:
        best = min(tiers.values(), key=_RANK.__getitem__)
        tiers = {n: t for n, t in tiers.items() if t == best}
    kept = set(tiers)
    return Choice(tuple(tiers), max(tiers.values(), key=_RANK.__getitem__), vetoed,
                  tuple(c.node for c in open_ if c.node not in kept))
