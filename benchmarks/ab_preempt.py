"""Old and new preempt verb side by side: fresh processes taking turns, CPU time per request.

    python benchmarks/ab_preempt.py --base REV [--nodes 1000 5000] [--rounds 6] [--requests 400]

Each round runs the base revision (a `git archive` of REV) and this checkout in a fresh process
each, in turn, on the same nodeCacheCapable request as bench_extender.py (every node a candidate
proposing two victims, a third of all pods idle); both must give the same reply bytes. Prints
per-round CPU p50/p99, the medians over rounds, their ratio, and the load average.
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


def measure(root: str, nodes: list[int], count: int) -> None:
    """In a fresh process: import everything from root, print one JSON line per node count."""
    sys.path.insert(0, root)
    from benchmarks.bench_extender import make_view, preempt_body, preempter
    for n in nodes:
        view = make_view(n)
        p = preempter(view)
        body = preempt_body(view, n, meta=True)
        for _ in range(20):
            p.respond(body)
        cpu = []
        for _ in range(count):
            c = time.process_time()
            answered = p.respond(body)
            cpu.append(time.process_time() - c)
            # A revision that answers bytes freed the request inside; one that answers
            # Answered hands it back to be freed after the reply is written, as its server does.
            reply = getattr(answered, "body", answered)
            del answered
        cpu.sort()
        print(json.dumps({"nodes": n, "p50": 1000 * statistics.median(cpu),
                          "p99": 1000 * cpu[int(0.99 * (count - 1))],
                          "reply": hashlib.sha256(reply).hexdigest()}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", help="git revision to compare with")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.nodes, args.requests)
        return
    with tempfile.TemporaryDirectory() as base:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        runs: dict[str, dict[int, list[dict]]] = {"base": {}, "new": {}}
        for r in range(args.rounds):
            for name, root in (("base", base), ("new", str(ROOT))):
                out = subprocess.run(
                    [sys.executable, __file__, "--measure", root, "--requests",
                     str(args.requests), "--nodes", *map(str, args.nodes)],
                    check=True, capture_output=True, text=True).stdout
                for line in out.splitlines():
                    row = json.loads(line)
                    runs[name].setdefault(row["nodes"], []).append(row)
                    print(f"round {r} {name:4} {row['nodes']:>5} nodes: CPU p50 "
                          f"{row['p50']:.2f} p99 {row['p99']:.2f} ms "
                          f"(load {os.getloadavg()[0]:.2f})", flush=True)
    for n in args.nodes:
        b, c = runs["base"][n], runs["new"][n]
        assert {x["reply"] for x in b} == {x["reply"] for x in c}, "replies differ"
        med = {k: (statistics.median(x[k] for x in b), statistics.median(x[k] for x in c))
               for k in ("p50", "p99")}
        print(f"{n} candidates, medians of {args.rounds} rounds: CPU p50 {med['p50'][0]:.2f} "
              f"-> {med['p50'][1]:.2f} ms ({med['p50'][1] / med['p50'][0]:.2f}), p99 "
              f"{med['p99'][0]:.2f} -> {med['p99'][1]:.2f} ms "
              f"({med['p99'][1] / med['p99'][0]:.2f}); same reply bytes")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
