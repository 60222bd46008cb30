"""Pending GPU pods that GPUs a replayed policy freed would have let start earlier.

The record does not say where a pending pod could have run (node selectors, affinity and card
requests are not in kube-state-metrics' pod series), so any freed GPUs on one node, enough for
the pod, count; each freed GPU serves one waiting pod at a time, in the order they began to
wait. The figure is an upper bound, and says so in the report.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from gpusteward.core.reclaim.quota import team
from gpusteward.core.whatif.history import History, PodRecord
from gpusteward.core.whatif.outcome import Earlier, Reclaimed


class _Lent:
    """Freed GPUs on one node from ``at`` to ``until``, some lent to waiting pods meanwhile."""

    def __init__(self, r: Reclaimed):
        self.node, self.gpus, self.at, self.until = r.node, r.gpus, r.at, r.until
        self.loans: list[tuple[float, float, int]] = []  # (from, to, gpus)

    def free_at(self, t: float) -> int:
        if not self.at <= t < self.until:
            return 0
        return self.gpus - sum(n for a, b, n in self.loans if a <= t < b)


def started_earlier(history: History, reclaimed: Iterable[Reclaimed]) -> Iterator[Earlier]:
    pools = [_Lent(r) for r in reclaimed if r.node]
    if not pools:
        return
    grid = history.grid
    waiting = sorted((r for r in history.pods if r.pending and r.running
                      and r.running.first > r.pending.first), key=_pending_from)
    for r in waiting:
        assert r.pending is not None and r.running is not None
        since, started = grid.time(r.pending.first), grid.time(r.running.first)
        for t in sorted({since, *(p.at for p in pools if since <= p.at < started)}):
            taken = _take(pools, t, started, r.pod.gpus)
            if taken:
                yield Earlier(r.pod.key, team(r.pod, {}), r.pod.gpus, since, started, t)
                break


def _pending_from(r: PodRecord) -> int:
    return r.pending.first if r.pending else 0


def _take(pools: list[_Lent], t: float, until: float, gpus: int) -> bool:
    by_node: dict[str, list[_Lent]] = {}
    for p in pools:
        if p.free_at(t) > 0:
            by_node.setdefault(p.node, []).append(p)
    for lenders in by_node.values():
        if sum(p.free_at(t) for p in lenders) < gpus:
            continue
        need = gpus
        for p in lenders:
            n = min(need, p.free_at(t))
            p.loans.append((t, until, n))
            need -= n
            if need == 0:
                return True
    return False
