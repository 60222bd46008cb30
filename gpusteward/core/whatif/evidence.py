"""A pod's idle evidence at every step, from its GPUs' per-step peaks and sample counts.

Each window's figures are computed once per GPU for the whole history (sliding max and sum in
a few C-level passes), so a replayed cycle only looks them up: the per-GPU fold is the live
reclaimer's (adapters/snapshot.per_pod): the highest peak of any GPU, the worst-covered GPU's
coverage, and how many GPUs have samples at all.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate, compress, repeat
from operator import ne, sub, truediv

from gpusteward.core.reclaim.model import Evidence
from gpusteward.core.whatif.history import GpuUse


def sliding_max(values: Iterable[float], k: int) -> array[float]:
    """``max(values[i-k+1 .. i])`` for every ``i`` (clipped at 0), in O(n).

    van Herk / Gil-Werman: a window of ``k`` spans at most two blocks of ``k``; its max is the
    max of the first block's suffix and the second block's prefix."""
    values = list(values)
    n = len(values)
    if k <= 1 or n == 0:
        return array("d", values)
    prefix: list[float] = []
    suffix: list[float] = []
    for b in range(0, n, k):
        block = values[b:b + k]
        prefix.extend(accumulate(block, max))
        suffix.extend(reversed(list(accumulate(reversed(block), max))))
    out = array("d", prefix[:k])
    out.extend(map(max, suffix[1:n - k + 1], prefix[k:]))
    return out


def sliding_sum(values: Sequence[float], k: int) -> array[float]:
    """``sum(values[i-k+1 .. i])`` for every ``i`` (clipped at 0)."""
    total = list(accumulate(values, initial=0.0))
    out = array("d", total[1:k + 1])
    out.extend(map(sub, total[k + 1:], total[1:len(total) - k]))
    return out


class PodEvidence:
    """One pod's evidence over one window, at any step: its GPUs' figures folded as the live
    reclaimer folds them (adapters/snapshot.per_pod), once for the pod's whole time."""

    def __init__(self, gpus: Sequence[GpuUse], window: float, step: float,
                 scrape_interval: float, offset: int = 0):
        k = max(1, round(window / step))
        self.offset = offset  # step of the figures' first entry
        self.window = window
        expected = max(window / scrape_interval, 1.0)
        # the windowed max of the GPUs' highest peak per step: the same as the highest of each
        # GPU's windowed max, for one sliding pass instead of one per GPU
        top = map(max, *(g.peaks for g in gpus)) if len(gpus) > 1 else (
            gpus[0].peaks if gpus else ())
        counts = [sliding_sum(g.samples, k) for g in gpus]
        # per GPU: its coverage, or 1 where it has no sample (the fold skips it)
        covers = [map(max, map(truediv, c, repeat(expected)), map(0.0.__eq__, c))
                  for c in counts]
        self.peak = sliding_max(top, k)
        self.coverage = array("d", map(min, repeat(1.0), *covers)) if covers else array("d")
        sampled = [map(0.0.__lt__, c) for c in counts]
        self.seen = array("b", sampled[0] if len(sampled) == 1 else map(
            sum, zip(*sampled, strict=True)))

    def at(self, i: int) -> Evidence | None:
        """None when no GPU of the pod has a sample in the window (the live query finds none)."""
        i -= self.offset
        if not 0 <= i < len(self.seen) or not self.seen[i]:
            return None
        return Evidence(self.window, self.peak[i], self.coverage[i], self.seen[i])

    def flips(self, threshold: float, min_coverage: float) -> set[int]:
        """Every step at which one of the comparisons rules.judge() makes on this evidence can
        come out otherwise than at the step before: how many GPUs are sampled, the coverage
        against ``min_coverage``, the peak against ``threshold`` and against 0-100 (a broken
        reading). Between two such steps the pod's state (idle, busy, unknown) cannot change."""
        steps = range(1, len(self.seen))
        out = {0, len(self.seen)}  # the figures start and end
        for flags in (list(map(threshold.__le__, self.peak)), list(map(100.0.__ge__, self.peak)),
                      self.seen, list(map(min_coverage.__le__, self.coverage))):
            out.update(compress(steps, map(ne, flags[1:], flags[:-1])))
        return {i + self.offset for i in out}
