"""Which of the scheduler's preemption candidates to keep: pure, so the table tests read it.
``choose_plainly`` states the rule row by row; ``choose``, what requests run, is the same rule
on packed columns, held equal to it by a test.

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

from collections.abc import Iterable
from enum import StrEnum
from itertools import compress, repeat
from operator import add, eq, ge, mul, not_, sub
from typing import NamedTuple

import msgspec

from gpusteward.core.policy import Preemption


class Tier(StrEnum):
    """How idle a candidate's victims are (rule 3; the ``kept`` label of the answers metric)."""

    IDLE = "idle"  # all of them
    PARTLY_IDLE = "partly-idle"  # some
    BUSY = "busy"  # none


# As module names: every request reads them, and an `Enum.MEMBER` lookup costs ~0.1 µs.
IDLE, PARTLY_IDLE, BUSY = Tier.IDLE, Tier.PARTLY_IDLE, Tier.BUSY
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
    """The scheduler's candidate nodes as gpusteward judges their victims, one column per field
    and one row per node: a request may carry thousands, and whole-column operations run in C
    where a loop over row objects would cost more than the rest of the request. The two
    idleness columns are flags packed one byte per node into an int (see `packed`), so that
    combining them is one integer operation."""

    nodes: list[str]
    all_idle: int  # every victim on the node idle (by its reclaim rule; no evidence is busy)
    some_idle: int  # at least one victim idle
    pdb_violations: list[int]
    shielded: list[bool] | None = None  # a busy victim is one the preemptor's Shield covers

    @classmethod
    def counted(cls, nodes: list[str], victims: list[int], idle: list[int],
                pdb_violations: list[int], shielded: list[bool] | None = None) -> Candidates:
        """From per-node counts: victims the scheduler proposes, how many of them idle."""
        return cls(nodes, *idle_flags(victims, idle), pdb_violations, shielded)


class Choice(msgspec.Struct, frozen=True):
    kept: tuple[str, ...]  # node names, in the request's order
    tier: Tier | None  # the worst tier kept; None when nothing was
    vetoed: tuple[str, ...] = ()  # nodes dropped because protectBusy shields a victim
    dropped: tuple[str, ...] = ()  # nodes dropped for more PDB violations or a worse tier


_TIERS = tuple(Tier)  # by rank, 0 the best


def packed(values: Iterable[int]) -> int:
    """0/1 flags, one byte each, the first the most significant: `&` and `|` of two such ints
    combine the flags node by node."""
    return int.from_bytes(bytes(values), "big")


def flags(mask: int, count: int) -> bytes:
    """The 0/1 flags `packed` made, one byte per node."""
    return mask.to_bytes(count, "big")


def idle_flags(victims: list[int], idle: list[int]) -> tuple[int, int]:
    """(all_idle, some_idle) of Candidates from per-node counts."""
    return packed(map(ge, idle, victims)), packed(map(bool, idle))


def choose(c: Candidates, policy: Preemption) -> Choice:
    """Keep the candidates rules 1-3 of the module docstring allow."""
    nodes, pdb, every, some = c.nodes, c.pdb_violations, c.all_idle, c.some_idle
    vetoed: tuple[str, ...] = ()
    if c.shielded is not None and any(c.shielded):
        vetoed = tuple(compress(nodes, c.shielded))
        open_ = list(map(not_, c.shielded))
        every, some = (packed(compress(flags(m, len(nodes)), open_)) for m in (every, some))
        nodes, pdb = list(compress(nodes, open_)), list(compress(pdb, open_))
    if not nodes:
        return Choice((), None, vetoed)
    if pdb.count(pdb[0]) == len(nodes):  # rule 2 keeps every node
        if policy.prefer_idle:
            return _best_tier(nodes, every, some, vetoed)
        return Choice(tuple(nodes), _worst_tier(every, some, len(nodes)), vetoed)
    # One sort key per row: PDB violations first (3 per violation), then the tier rank (0-2):
    # 2 - (some idle) - (all idle).
    ranks = list(map(sub, map(sub, repeat(2), flags(some, len(nodes))), flags(every, len(nodes))))
    keys = list(map(mul, pdb, repeat(3)))
    if policy.prefer_idle:
        keys = list(map(add, keys, ranks))
    best = min(keys)
    is_best = list(map(eq, keys, repeat(best)))
    kept = tuple(compress(nodes, is_best))
    dropped = tuple(compress(nodes, map(not_, is_best)))
    worst = best % 3 if policy.prefer_idle else max(compress(ranks, is_best))
    return Choice(kept, _TIERS[worst], vetoed, dropped)


class Row(NamedTuple):
    """One candidate as the rules read it (``choose_plainly``)."""

    node: str
    victims: int  # the victims the scheduler proposes on it
    idle: int  # how many of them are idle
    pdb_violations: int
    shielded: bool = False


def rank(row: Row) -> int:
    """Rule 3's tier, 0 the best: all victims idle, some idle, none."""
    return 2 - (row.idle > 0) - (row.idle >= row.victims)


def choose_plainly(rows: list[Row], policy: Preemption) -> Choice:
    """Rules 1-3 of the module docstring, read row by row: the rule ``choose`` is held to on
    random candidates (tests/unit/test_preemption.py). ``choose`` computes the same on packed
    columns because a request carries thousands of candidates: at 5,000 this form takes 6.4x
    as long with equal PDB counts (the usual) and 1.7x with mixed ones
    (benchmarks/bench_preempt_rule.py, benchmarks/RESULTS.md "Preempt verb")."""
    vetoed = tuple(r.node for r in rows if r.shielded)  # rule 1
    open_ = [r for r in rows if not r.shielded]
    if not open_:
        return Choice((), None, vetoed)
    fewest = min(r.pdb_violations for r in open_)  # rule 2
    best = [r for r in open_ if r.pdb_violations == fewest]
    if policy.prefer_idle:  # rule 3
        top = min(map(rank, best))
        best = [r for r in best if rank(r) == top]
    kept = {r.node for r in best}
    return Choice(tuple(r.node for r in best), _TIERS[max(map(rank, best))], vetoed,
                  tuple(r.node for r in open_ if r.node not in kept))


def _best_tier(nodes: list[str], every: int, some: int, vetoed: tuple[str, ...]) -> Choice:
    """Rule 3 when rule 2 keeps every node: the best tier present, by two integer operations
    on the packed flags instead of a key per row."""
    best, tier = every & some, IDLE
    if not best:
        best, tier = every | some, PARTLY_IDLE
    if not best:
        return Choice(tuple(nodes), BUSY, vetoed)
    keep = flags(best, len(nodes))
    left_out = flags(best ^ _everyone(len(nodes)), len(nodes))
    return Choice(tuple(compress(nodes, keep)), tier, vetoed, tuple(compress(nodes, left_out)))


def _worst_tier(every: int, some: int, count: int) -> Tier:
    everyone = _everyone(count)
    if every | some != everyone:
        return BUSY
    return IDLE if every & some == everyone else PARTLY_IDLE


def _everyone(count: int) -> int:
    """The flag set for each of count nodes."""
    return int.from_bytes(b"\x01" * count, "big")
