"""Telemetry refresh, two revisions side by side against one Prometheus.

    python benchmarks/ab_telemetry.py --base REV [--nodes 1000] [--rounds 10]

One real Prometheus is loaded with the history bench_telemetry.py writes (1,000 nodes x 8
GPUs by default); then a fresh process of the base revision (checked out with `git worktree`
into a temporary folder) and one of the working tree take turns, each timing one
PrometheusSource.fetch() per round after a warm-up. Alternating in one run is what makes the
ratio mean something on a shared 2-core machine: drift hits both sides alike. Prints medians,
the ratio and the bytes each side's queries return.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_telemetry import history  # noqa: E402
from tests.support.prometheus import PrometheusServer  # noqa: E402

# Runs inside each side's tree: one warm-up, then ROUNDS timed fetches, one per line on stdin's
# "go" so the parent can interleave the two sides round by round.
PROBE = r"""
import asyncio, json, sys, time, urllib.parse, urllib.request
from gpusteward.adapters.prometheus import PrometheusSource
from gpusteward.core.policy import parse_policy
policy = parse_policy({})
source = PrometheusSource(sys.argv[1], policy.telemetry, policy.health)
def size(q):
    url = sys.argv[1] + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=60) as r:
        return len(r.read())
async def main():
    await source.fetch()
    print(json.dumps({"bytes": sum(size(q) for q in source.queries.values()),
                      "queries": len(source.queries)}), flush=True)
    for line in sys.stdin:
        t = time.perf_counter()
        got = await source.fetch()
        print(json.dumps({"s": time.perf_counter() - t,
                          "gpus": sum(len(r) for r in got.nodes.values())}), flush=True)
asyncio.run(main())
"""


def side(tree: Path, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", PROBE, url], cwd=tree, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})


def measure(trees: dict[str, Path], url: str, rounds: int) -> dict[str, dict]:
    procs = {name: side(tree, url) for name, tree in trees.items()}
    out: dict[str, dict] = {}
    for name, proc in procs.items():
        assert proc.stdout is not None
        out[name] = {**json.loads(proc.stdout.readline()), "times": [], "gpus": None}
    for _ in range(rounds):
        for name, proc in procs.items():
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
            got = json.loads(proc.stdout.readline())
            out[name]["times"].append(got["s"])
            out[name]["gpus"] = got["gpus"]
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="the revision to compare against")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.base],
                       cwd=ROOT, check=True)
        try:
            now = time.time() - 10
            with PrometheusServer(Path(tmp) / "prom",
                                  history_openmetrics=history(args.nodes, now)) as prom:
                result = measure({"base": base, "new": ROOT}, prom.url, args.rounds)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                           check=False)
    med = {name: statistics.median(r["times"]) for name, r in result.items()}
    print(f"{args.nodes * 8} GPUs, {args.rounds} alternating rounds, medians:")
    for name, r in result.items():
        print(f"  {name}: {r['queries']} queries, {1000 * med[name]:.0f} ms, "
              f"{r['bytes'] / 1e6:.2f} MB, {r['gpus']} GPUs read")
    print(f"  ratio new/base: time {med['new'] / med['base']:.2f}, "
          f"bytes {result['new']['bytes'] / result['base']['bytes']:.2f}")


if __name__ == "__main__":
    main()
