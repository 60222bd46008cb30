"""Telemetry cost against fleet size: one extender refresh (7 PromQL queries) at 1,000 to 5,000
nodes x 8 GPUs (8,000 to 40,000 GPUs).

    python benchmarks/bench_telemetry.py [--nodes 1000 2000 3000 5000] [--quick]

A real Prometheus is loaded with 3 minutes of dcgm-exporter history for every GPU (promtool
backfill, 15 s steps), stored as a Prometheus Operator ServiceMonitor with dcgm-exporter's chart
default (honorLabels: false) stores it, with dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT enabled as
docs/install.md recommends and one GPU in a hundred counting an XID; we time
PrometheusSource.fetch() (median of 10) in a fresh process, whose peak RSS is the refresh's
(the history text is built in another), and count the bytes each query returns. Results:
benchmarks/results/telemetry.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.memory import peak_rss_mb  # noqa: E402
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


def response_bytes(url: str, query: str) -> tuple[int, int]:
    """(JSON bytes, bytes on the wire): PrometheusSource's requests session asks for gzip, as
    every requests session does, and Prometheus's API compresses what is asked for."""
    full = f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(full, timeout=60) as resp:
        plain = len(resp.read())
    asked = urllib.request.Request(full, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(asked, timeout=60) as resp:
        wire = resp.read()
        assert resp.headers.get("Content-Encoding") == "gzip", resp.headers
    assert len(gzip.decompress(wire)) == plain
    return plain, len(wire)


async def fetch_times(url: str, runs: int) -> dict:
    policy = parse_policy({})
    source = PrometheusSource(url, policy.telemetry, policy.health)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        readings = await source.fetch()
        times.append(time.perf_counter() - t)
    return {"times": times, "gpus_read": sum(len(r) for r in readings.nodes.values()),
            "queries": dict(source.queries),
            "peak_rss_mb": peak_rss_mb()}


def run(nodes: int, runs: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        now = time.time() - 10
        prom = PrometheusServer(Path(tmp), history_openmetrics=history(nodes, now))
        with prom:
            out = subprocess.run([sys.executable, __file__, "--fetch-only", prom.url, str(runs)],
                                 capture_output=True, text=True, check=True)
            fetched = json.loads(out.stdout)
            sizes = {name: response_bytes(prom.url, q) for name, q in fetched["queries"].items()}
    per_query = {name: plain for name, (plain, _) in sizes.items()}
    times = fetched["times"]
    return {"nodes": nodes, "gpus": nodes * 8, "queries_per_refresh": len(per_query),
            "refresh_p50_ms": 1000 * statistics.median(times),
            "refresh_max_ms": 1000 * max(times), "bytes_per_refresh": sum(per_query.values()),
            "bytes_by_query": per_query,
            "wire_bytes_per_refresh": sum(wire for _, wire in sizes.values()),
            "gpus_read": fetched["gpus_read"],
            "peak_rss_mb": fetched["peak_rss_mb"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 2000, 3000, 5000])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--fetch-only", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fetch_only:
        url, runs = args.fetch_only
        print(json.dumps(asyncio.run(fetch_times(url, int(runs)))))
        return
    sizes, runs = ([20], 3) if args.quick else (args.nodes, 10)
    results = []
    for nodes in sizes:
        r = run(nodes, runs)
        results.append(r)
        print(f"telemetry refresh at {r['gpus']} GPUs: {r['queries_per_refresh']} queries, "
              f"p50 {r['refresh_p50_ms']:.0f} ms, {r['bytes_per_refresh'] / 1e6:.1f} MB JSON, "
              f"{r['wire_bytes_per_refresh'] / 1e6:.2f} MB on the wire, peak "
              f"RSS {r['peak_rss_mb']:.0f} MB ({r['gpus_read']} GPUs read)", flush=True)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "telemetry.json").write_text(json.dumps(
            {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
             "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
