"""The reclaimer's decision and the what-if replay, two revisions side by side.

    python benchmarks/ab_decide.py --base REV [--pods 10000] [--rounds 8]

Each round runs the base revision (a `git archive` of REV) and this checkout in a fresh process
each, in turn: plan() over bench_reclaimer.py's snapshot of ``--pods`` GPU pods (CPU time, the
median of 5 calls), and the what-if replay (core/whatif/replay.replay) of the four random
histories tests/unit/test_whatif_replay.py checks, under its queue policy (CPU time of all
four, the median of 5 passes after one to warm). Both sides must reach the same actions,
verdicts and replay outcomes. Prints the medians over rounds and their ratio: the check that
a change meant to move code (issue 28) costs the decisions nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(root: str, pods: int) -> None:
    """In a fresh process: import everything from root, print one JSON line."""
    sys.path.insert(0, root)
    from benchmarks.bench_reclaimer import POLICY, snapshot
    from gpusteward.core.policy import parse_policy
    from gpusteward.core.reclaim.decide import plan
    from gpusteward.core.whatif.replay import replay
    from tests.unit.test_whatif_replay import random_history

    snap = snapshot(pods)
    plan(snap, POLICY)  # warm
    cpu = []
    for _ in range(5):
        c = time.process_time()
        decided = plan(snap, POLICY)
        cpu.append(time.process_time() - c)
    histories = [random_history(seed) for seed in range(4)]
    policy = parse_policy({"telemetry": {"scrapeInterval": "30s"}, "queue": {
        "enabled": True, "minWait": "60s"}, "reclaim": {"interval": "60s", "minPodAge": "1s",
                                                       "idle": {"window": "300s",
                                                                "grace": "300s"}}})
    outcomes = [replay(h, policy) for h in histories]  # warm
    passes = []
    for _ in range(5):
        c = time.process_time()
        outcomes = [replay(h, policy) for h in histories]
        passes.append(time.process_time() - c)
    replay_cpu = statistics.median(passes)
    digest = hashlib.sha256(repr([(o.reclaimed, o.warned) for o in outcomes]).encode())
    print(json.dumps({"decision_ms": 1000 * statistics.median(cpu),
                      "replay_ms": 1000 * replay_cpu, "actions": len(decided.actions),
                      "verdicts": len(decided.verdicts), "replay": digest.hexdigest()}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", help="git revision to compare with")
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.pods)
        return
    runs: dict[str, list[dict]] = {"base": [], "new": []}
    with tempfile.TemporaryDirectory() as base:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        for r in range(args.rounds):
            for name, root in (("base", base), ("new", str(ROOT))):
                out = subprocess.run([sys.executable, __file__, "--measure", root, "--pods",
                                      str(args.pods)], check=True, capture_output=True,
                                     text=True).stdout
                row = json.loads(out)
                runs[name].append(row)
                print(f"round {r} {name:4}: plan {row['decision_ms']:.1f} ms, replay "
                      f"{row['replay_ms']:.1f} ms (load {os.getloadavg()[0]:.2f})", flush=True)
    b, n = runs["base"], runs["new"]
    for key in ("actions", "verdicts", "replay"):
        assert {x[key] for x in b} == {x[key] for x in n}, f"{key} differ"
    for key, what in (("decision_ms", f"plan() at {args.pods} pods"),
                      ("replay_ms", "the replay of four random histories")):
        old, new = statistics.median(x[key] for x in b), statistics.median(x[key] for x in n)
        print(f"{what}, medians of {args.rounds} rounds: {old:.1f} -> {new:.1f} ms "
              f"({new / old:.2f}); the same decisions")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
