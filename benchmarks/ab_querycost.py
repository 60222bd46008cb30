"""What each of gpusteward's queries costs Prometheus's CPU, for issue 32.

    python benchmarks/ab_querycost.py windows|refresh [--gpus 5000] [--minutes 35] [--runs 5]
        [--prometheus 3]

``windows``: what the length of an idle window costs. If most of a 30-minute window's cost
were its samples, a cycle that asks only for the last minute would cost a fraction of it; this
measures how much is samples and how much is per series, whatever the range.
``refresh``: the extender's refresh, query by query (adapters/telemetry.queries).

A real Prometheus (promtool backfill) holds ``--minutes`` of dcgm-exporter samples every 15 s
for ``--gpus`` one-GPU pods (bench_reclaimer.floor_fleet's shapes, honorLabels: false). The
reclaimer's own evidence queries (adapters/snapshot.evidence_queries: the checked peak and the
sample count) run over windows of 1, 5 and 30 minutes, beside the bare selection of every
GPU's utilization with the same ``max by``. Each runs ``--runs`` times at the same evaluation
time; printed: the median of Prometheus's CPU seconds per query (its process's utime + stime
around the HTTP call) and, for ``windows``, what a 1-minute read costs against a 30-minute one:
the least any incremental cycle could pay, since it must read its new minute with the same two
queries. Written to benchmarks/results/querycost-<set>.json.
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
from gpusteward.adapters.promql import exact_range, gpu_labels, keeping, utilization
from gpusteward.adapters.snapshot import evidence_queries
from gpusteward.adapters.telemetry import queries as telemetry_queries
from gpusteward.core.dcgm import PodRef
from gpusteward.core.policy import parse_policy
from gpusteward.core.vocabulary import Vocabulary
from gpusteward.sandbox.simgpu import SimGpu, render_openmetrics_history

POLICY = parse_policy({"telemetry": {"scrapeInterval": "15s"}})
WINDOWS = (60.0, 300.0, 1800.0)
RESULTS = Path(__file__).parent / "results"


def history(gpus: int, minutes: int, now: float) -> str:
    """Every GPU sampled each 15 s, a third at 0 %, the rest at 40 %; 1 % of them raise an XID 79
    halfway through (the gauge keeps it)."""
    from tests.support.prometheus import servicemonitor

    def fleet(broken: bool) -> list[SimGpu]:
        return [SimGpu(f"gpu-node-{i // 8:05d}", i % 8, "NVIDIA H100 80GB HBM3",
                       util_percent=0 if i % 3 == 0 else 40,
                       xid=79 if broken and i % 100 == 0 else 0,
                       pod=PodRef("ml", f"train-{i}", "main")) for i in range(gpus)]

    frames = minutes * 4
    before, after = fleet(False), fleet(True)
    return render_openmetrics_history([(now - 15 * (frames - k), after if 2 * k > frames
                                        else before) for k in range(frames + 1)],
                                      scrape=servicemonitor(honor_labels=False))


def timed(url: str, pid: int, query: str, at: float) -> tuple[float, int]:
    before = cpu_seconds(pid)
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode(
            {"query": query, "time": f"{at:.3f}", "timeout": "120s"}), timeout=180) as resp:
        series = len(json.load(resp)["data"]["result"])
    return cpu_seconds(pid) - before, series


def window_queries() -> dict[str, str]:
    node_labels = POLICY.telemetry.node_labels
    out = {"selection": keeping(["UUID", *gpu_labels(node_labels)])
           + f"({utilization(Vocabulary(), None, mark=False)})"}
    for w in WINDOWS:
        peak, count = evidence_queries(w, node_labels, Vocabulary(), exact_range(w, False))
        out[f"peak {w:.0f}s"], out[f"count {w:.0f}s"] = peak, count
    return out


def refresh_queries() -> dict[str, str]:
    return telemetry_queries(POLICY.health, POLICY.telemetry.node_labels, Vocabulary())


SETS = {"windows": window_queries, "refresh": refresh_queries}


def main() -> None:
    from tests.support.prometheus import PrometheusServer

    parser = argparse.ArgumentParser()
    parser.add_argument("set", choices=SETS)
    parser.add_argument("--gpus", type=int, default=5000)
    parser.add_argument("--minutes", type=int, default=35)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--prometheus", default=None)
    args = parser.parse_args()
    now = time.time() - 5
    with tempfile.TemporaryDirectory() as tmp:
        prom = PrometheusServer(Path(tmp) / "prometheus",
                                history_openmetrics=history(args.gpus, args.minutes, now),
                                major=args.prometheus)
        with prom:
            rows = {}
            for name, query in SETS[args.set]().items():
                runs = [timed(prom.url, prom.pid, query, now) for _ in range(args.runs)]
                rows[name] = (statistics.median(r[0] for r in runs), runs[0][1])
    for name, (cpu, series) in rows.items():
        print(f"{name:12} {cpu * 1000:8.1f} ms Prometheus CPU  {series:6d} series")
    result = {"date": time.strftime("%Y-%m-%d"), "gpus": args.gpus, "minutes": args.minutes,
              "runs": args.runs, "prometheus": args.prometheus or "3",
              "cpu_s": {name: cpu for name, (cpu, _) in rows.items()}}
    if args.set == "windows":
        result["one_minute_over_thirty"] = window_floor(rows, args)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"querycost-{args.set}.json").write_text(json.dumps(result, indent=1) + "\n")


def window_floor(rows: dict[str, tuple[float, int]], args: argparse.Namespace) -> float:
    def pair(w: float) -> float:
        return rows[f"peak {w:.0f}s"][0] + rows[f"count {w:.0f}s"][0]

    floor = pair(60.0) / pair(1800.0)
    print(f"1-minute read / 30-minute read: {floor:.2f}; bare selection / 30-minute read: "
          f"{rows['selection'][0] / pair(1800.0):.2f} ({args.gpus} GPUs, median of {args.runs})")
    return floor


if __name__ == "__main__":
    main()
