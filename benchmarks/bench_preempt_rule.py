"""The preemption rule as written against the form requests run, at a request's size.

    python benchmarks/bench_preempt_rule.py [--candidates 5000] [--rounds 7]

core/preemption.choose_plainly reads rules 1-3 one candidate at a time; choose computes the same
on packed columns (and is held equal to it by tests/unit/test_preemption.py). Both are timed on
the same candidates, 2 victims each, some idle: every candidate with equal PDB counts (the
usual, the fast path) and with mixed ones. choose's time includes packing the counts
(Candidates.counted). Prints medians of the per-call times over the rounds and their ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusteward.core.policy import Preemption
from gpusteward.core.preemption import Candidates, Row, choose, choose_plainly


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rng, n, policy = random.Random(1), args.candidates, Preemption()
    nodes = [f"node-{i:05d}" for i in range(n)]
    victims, idle = [2] * n, [rng.randint(0, 2) for _ in range(n)]
    for case, pdb in (("equal PDB counts", [0] * n),
                      ("mixed PDB counts", [rng.randint(0, 1) for _ in range(n)])):
        rows = [Row(*r) for r in zip(nodes, victims, idle, pdb, strict=True)]

        def packed(pdb: list[int] = pdb) -> object:
            return choose(Candidates.counted(nodes, victims, idle, pdb), policy)

        def plain(rows: list[Row] = rows) -> object:
            return choose_plainly(rows, policy)

        assert packed() == plain()
        times = {f.__name__: [min(timeit.repeat(f, number=10, repeat=3)) / 10
                              for _ in range(args.rounds)] for f in (packed, plain)}
        fast, slow = (statistics.median(times[k]) for k in ("packed", "plain"))
        print(f"{n} candidates, {case}: choose {fast * 1e3:.2f} ms, choose_plainly "
              f"{slow * 1e3:.2f} ms, ratio {slow / fast:.1f}x")


if __name__ == "__main__":
    main()
