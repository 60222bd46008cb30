"""What the reclaimer's GPU-fault queries (adapters/promql.fault_queries, issue 31) cost Prometheus
beside the evidence queries of the same cycle, on the floor benchmark's fleet.

    python benchmarks/ab_faults.py [--gpus 5000] [--runs 5] [--prometheus 3]

A real Prometheus (promtool backfill) holds 3 minutes of dcgm-exporter samples every 15 s for
``--gpus`` one-GPU pods (bench_reclaimer.floor_fleet's shapes), with the opt-in
DCGM_EXP_XID_ERRORS_TOTAL, and 1 % of the GPUs raising an XID 79 halfway through. Each query runs
``--runs`` times; printed: the median of Prometheus's CPU seconds per query (its process's
utime + stime around the HTTP call) and the fault queries' sum over the evidence queries' sum.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.memory import cpu_seconds
from gpusteward.adapters.promql import exact_range, fault_queries
from gpusteward.adapters.snapshot import evidence_queries
from gpusteward.core.dcgm import PodRef
from gpusteward.core.policy import parse_policy
from gpusteward.core.vocabulary import Vocabulary
from gpusteward.sandbox.simgpu import SimGpu, render_openmetrics_history

POLICY = parse_policy({"telemetry": {"scrapeInterval": "15s"}, "health": {"xidWindow": "150s"}})


def history(gpus: int, now: float) -> str:
    from tests.support.prometheus import servicemonitor

    frames = []
    for k in range(12):
        broken = k >= 6
        frames.append((now - 180 + 15 * k, [
            SimGpu(f"gpu-node-{i // 8:05d}", i % 8, "NVIDIA H100 80GB HBM3",
                   util_percent=0 if i % 3 == 0 else 40,
                   xid=79 if broken and i % 100 == 0 else 0,
                   xid_total=1 if broken and i % 100 == 0 else 0,
                   pod=PodRef("ml", f"train-{i}", "main")) for i in range(gpus)]))
    return render_openmetrics_history(frames, scrape=servicemonitor(honor_labels=False),
                                      xid_total=True)


def timed(url: str, pid: int, query: str) -> tuple[float, int]:
    before = cpu_seconds(pid)
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode(
            {"query": query}), timeout=120) as resp:
        series = len(json.load(resp)["data"]["result"])
    return cpu_seconds(pid) - before, series


def main() -> None:
    from tests.support.prometheus import PrometheusServer

    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--prometheus", default=None)
    args = parser.parse_args()
    node_labels = POLICY.telemetry.node_labels
    span = exact_range(150.0, False)
    evidence = dict(zip(("peak", "samples"), evidence_queries(150.0, node_labels, Vocabulary(),
                                                             span), strict=True))
    faults = fault_queries(POLICY.health, node_labels, Vocabulary(), 150.0, span)
    with tempfile.TemporaryDirectory() as tmp:
        prom = PrometheusServer(Path(tmp) / "prometheus",
                                history_openmetrics=history(args.gpus, time.time() - 5),
                                major=args.prometheus)
        with prom:
            rows = {}
            for name, query in {**evidence, **faults}.items():
                runs = [timed(prom.url, prom.pid, query) for _ in range(args.runs)]
                rows[name] = (statistics.median(r[0] for r in runs), runs[0][1])
    for name, (cpu, series) in rows.items():
        print(f"{name:12} {cpu * 1000:8.1f} ms Prometheus CPU  {series:6d} series")
    fault_cpu = sum(rows[n][0] for n in faults)
    evidence_cpu = sum(rows[n][0] for n in evidence)
    print(f"faults / evidence (one window): {fault_cpu / evidence_cpu:.2f} "
          f"({args.gpus} GPUs, median of {args.runs})")


if __name__ == "__main__":
    main()
