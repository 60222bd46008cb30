"""Telemetry refresh and reclaim evidence, two revisions side by side against one Prometheus.

    python benchmarks/ab_telemetry.py --base REV [--nodes 1000] [--rounds 10]
        [--what refresh evidence] [--prometheus 3 2]

One real Prometheus is loaded with the history bench_telemetry.py writes (1,000 nodes x 8
GPUs by default); then a fresh process of the base revision (checked out with `git worktree`
into a temporary folder) and one of the working tree take turns, each timing one
PrometheusSource.fetch() (``refresh``) or one SnapshotReader.evidence() for the 4 pods of each
node (``evidence``: the reclaimer's queries over two windows, 600 s and 630 s, that hold the
whole 180 s history) per round after a warm-up. Alternating in one run is what makes the
ratio mean something on a shared 2-core machine: drift hits both sides alike. Each
``--prometheus`` major (3.16 built from its module, Debian's 2.42) is loaded and measured in
turn, in the same run. Prints
medians, the ratio and, for the refresh, the bytes each side's queries return.
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
from gpusteward.sandbox.controllers import PROMETHEUS_MAJORS, prometheus_binaries  # noqa: E402
from tests.support.prometheus import PrometheusServer  # noqa: E402

# Runs inside each side's tree: one warm-up, then ROUNDS timed fetches, one per line on stdin's
# "go" so the parent can interleave the two sides round by round.
PROBE = r"""
import asyncio, json, sys, time, urllib.parse, urllib.request
from gpusteward.core.policy import parse_policy
policy = parse_policy({})
try:  # a tree from the client split on
    from gpusteward.adapters.telemetry import PrometheusSource
    source = PrometheusSource.at(sys.argv[1], policy.telemetry, policy.health)
except ImportError:  # one before it
    from gpusteward.adapters.prometheus import PrometheusSource
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
# The same for the reclaimer's evidence read (every query of one cycle's evidence).
EVIDENCE_PROBE = r"""
import asyncio, json, sys, time
from gpusteward.adapters.snapshot import SnapshotReader
from gpusteward.core.policy import parse_policy
from tests.unit.test_reclaim_decide import gpu_pod
# staleAfter: the history ends when it is built, a minute or two before the rounds
policy = parse_policy({"telemetry": {"scrapeInterval": "15s", "staleAfter": "1h"},
                       "reclaim": {"idle": {"window": "600s", "minCoverage": 0.1},
                                   "withinQuotaWindow": "630s"}})
try:  # a tree from the client split on
    from gpusteward.adapters.promclient import PrometheusClient
    source = PrometheusClient(sys.argv[1], policy.telemetry)
except ImportError:  # one before it
    from gpusteward.adapters.prometheus import PrometheusSource
    source = PrometheusSource(sys.argv[1], policy.telemetry, policy.health)
reader = SnapshotReader(None, source, policy)
nodes = int(sys.argv[2])
pods = tuple(gpu_pod(f"p-{n}-{i}", node=f"gpu-node-{n:05d}") for n in range(nodes)
             for i in range(4))
async def main():
    now = time.time()
    await reader.evidence(pods, now)
    print(json.dumps({"bytes": 0, "queries": source.queries_run}), flush=True)
    for line in sys.stdin:
        t, before = time.perf_counter(), source.queries_run
        got, ok, why = await reader.evidence(pods, time.time())
        assert ok, why
        print(json.dumps({"s": time.perf_counter() - t, "queries": source.queries_run - before,
                          "gpus": len(next(iter(got.values())))}), flush=True)
asyncio.run(main())
"""


def side(tree: Path, url: str, what: str, nodes: int) -> subprocess.Popen[str]:
    probe = [PROBE, url] if what == "refresh" else [EVIDENCE_PROBE, url, str(nodes)]
    return subprocess.Popen([sys.executable, "-c", *probe], cwd=tree, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})


def measure(trees: dict[str, Path], url: str, rounds: int, what: str = "refresh",
            nodes: int = 0) -> dict[str, dict]:
    procs = {name: side(tree, url, what, nodes) for name, tree in trees.items()}
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
            out[name]["per_round"] = got.get("queries")
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
    parser.add_argument("--what", nargs="+", choices=("refresh", "evidence"),
                        default=["refresh"])
    parser.add_argument("--prometheus", nargs="+", choices=PROMETHEUS_MAJORS,
                        default=list(PROMETHEUS_MAJORS),
                        help="the Prometheus majors to load and measure in turn")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.base],
                       cwd=ROOT, check=True)
        try:
            for major in args.prometheus:
                prometheus, _ = prometheus_binaries(major)
                now = time.time() - 10
                with PrometheusServer(Path(tmp) / f"prom-{major}", major=major,
                                      history_openmetrics=history(range(args.nodes), now)
                                      ) as prom:
                    version = _version(prometheus)
                    for what in args.what:
                        result = measure({"base": base, "new": ROOT}, prom.url, args.rounds,
                                         what, args.nodes)
                        report(result, what, version, args)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                           check=False)


def _version(prometheus: str) -> str:
    out = subprocess.run([prometheus, "--version"], capture_output=True, text=True, timeout=30)
    return (out.stdout or out.stderr).split("\n")[0]


def report(result: dict[str, dict], what: str, version: str, args: argparse.Namespace) -> None:
    med = {name: statistics.median(r["times"]) for name, r in result.items()}
    print(f"{what} on {version}: {args.nodes * 8} GPUs, {args.rounds} alternating rounds, "
          "medians:")
    for name, r in result.items():
        queries = r["per_round"] if what == "evidence" else r["queries"]
        print(f"  {name}: {queries} queries, {1000 * med[name]:.0f} ms"
              + (f", {r['bytes'] / 1e6:.2f} MB" if r["bytes"] else "")
              + f", {r['gpus']} {'GPUs' if what == 'refresh' else 'pods'} read")
    print(f"  ratio new/base: time {med['new'] / med['base']:.2f}"
          + (f", bytes {result['new']['bytes'] / result['base']['bytes']:.2f}"
             if result["base"]["bytes"] else ""), flush=True)


if __name__ == "__main__":
    main()
