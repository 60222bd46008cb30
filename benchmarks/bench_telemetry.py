"""Telemetry cost: one extender refresh (7 PromQL queries) at 1,000 nodes x 8 GPUs.

    python benchmarks/bench_telemetry.py [--nodes 1000] [--quick]

A real Prometheus is loaded with 3 minutes of dcgm-exporter history for every GPU (promtool
backfill, 15 s steps), stored as a Prometheus Operator ServiceMonitor with dcgm-exporter's chart
default (honorLabels: false) stores it, with dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT enabled as
docs/install.md recommends and one GPU in a hundred counting an XID; we time
PrometheusSource.fetch() (median of 10) and count the bytes each query returns. Results:
benchmarks/results/telemetry.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusteward.adapters.prometheus import PrometheusSource  # noqa: E402
from gpusteward.core.dcgm import PodRef  # noqa: E402
from gpusteward.core.policy import parse_policy  # noqa: E402
from gpusteward.sandbox.simgpu import SimGpu, render_openmetrics_history  # noqa: E402
from tests.support.prometheus import PrometheusServer, servicemonitor  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def history(nodes: int, now: float) -> str:
    gpus = [SimGpu(f"gpu-node-{n:05d}", i, "NVIDIA H100 80GB HBM3", util_percent=(n * 7 + i) % 100,
                   xid=48 if (n * 8 + i) % 100 == 0 else 0, xid_count=int((n * 8 + i) % 100 == 0),
                   pod=PodRef("ml", f"p-{n}-{i}", "main") if i < 4 else None)
            for n in range(nodes) for i in range(8)]
    frames = [(now - 180 + 15 * k, gpus) for k in range(12)]
    return render_openmetrics_history(frames, scrape=servicemonitor(honor_labels=False),
                                      xid_count_window_ms=300_000)


def response_bytes(url: str, query: str) -> int:
    full = f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(full, timeout=60) as resp:
        return len(resp.read())


async def fetch_times(source: PrometheusSource, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        await source.fetch()
        times.append(time.perf_counter() - t)
    return times


def run(nodes: int, runs: int) -> dict:
    policy = parse_policy({})
    with tempfile.TemporaryDirectory() as tmp:
        now = time.time() - 10
        prom = PrometheusServer(Path(tmp), history_openmetrics=history(nodes, now))
        with prom:
            source = PrometheusSource(prom.url, policy.telemetry, policy.health)
            times = asyncio.run(fetch_times(source, runs))
            per_query = {name: response_bytes(prom.url, q) for name, q in source.queries.items()}
            readings = asyncio.run(source.fetch())
    return {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "nodes": nodes,
            "gpus": nodes * 8, "queries_per_refresh": len(source.queries),
            "refresh_p50_ms": 1000 * statistics.median(times),
            "refresh_max_ms": 1000 * max(times), "bytes_per_refresh": sum(per_query.values()),
            "bytes_by_query": per_query, "gpus_read": sum(len(r) for r in readings.nodes.values())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    nodes, runs = (20, 3) if args.quick else (args.nodes, 10)
    report = run(nodes, runs)
    print(f"telemetry refresh at {report['gpus']} GPUs: {report['queries_per_refresh']} queries, "
          f"p50 {report['refresh_p50_ms']:.0f} ms, {report['bytes_per_refresh'] / 1e6:.1f} MB "
          f"({report['gpus_read']} GPUs read)")
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "telemetry.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
