"""What-if replay speed: a week of history at the reclaimer's step (60 s) for 1,000 GPUs,
read through the real history adapter (HTTP range queries, JSON decode, attribution) and
replayed with the reclaimer's plan(); the target is <= 60 s and <= 1 GB RSS.

    python benchmarks/bench_whatif.py [--runs 1000x7 ...] [--quick]

Prometheus is played by benchmarks/whatif_prometheus.py (a week of 1,000 GPUs does not
backfill into a real one here); each size runs in a fresh process, so its peak RSS is its own.
Results: results/whatif.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.memory import peak_rss_mb
from gpusteward.core.policy import parse_policy
from gpusteward.sandbox.procs import free_port

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
END = 1_800_000_000.0
# The shipped defaults (60 s interval, 30 min window, 15 min grace, 30 min minimum age) with
# the scrape interval the synthetic exporter has.
POLICY = parse_policy({"telemetry": {"scrapeInterval": "30s"}})



async def measure(url: str, days: float) -> dict:
    from gpusteward.adapters.history import HistoryReader
    from gpusteward.adapters.promclient import PrometheusClient
    from gpusteward.core.whatif.replay import replay

    source = PrometheusClient(url, POLICY.telemetry)
    t = time.perf_counter()
    history = await HistoryReader(source, POLICY).read(END - days * 86400, END)
    read_s = time.perf_counter() - t
    t = time.perf_counter()
    out = replay(history, POLICY, "defaults")
    replay_s = time.perf_counter() - t
    return {"read_s": read_s, "replay_s": replay_s, "total_s": read_s + replay_s,
            "promql_queries": source.queries_run, "steps": history.grid.steps,
            "pods": len(history.pods),
            "gpus": sum(n.gpus for n in history.nodes.values()),
            "reclaimed": len(out.reclaimed), "gpu_hours_freed": round(out.gpu_hours, 1),
            "cpu_s": sum(resource.getrusage(resource.RUSAGE_SELF)[:2]),
            "peak_rss_mb": peak_rss_mb()}


def one_size(gpus: int, days: float) -> dict:
    port = free_port()
    server = subprocess.Popen([sys.executable, str(HERE / "whatif_prometheus.py"),
                               f"--port={port}", f"--gpus={gpus}", f"--days={days}",
                               f"--end={END}"])
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        out = subprocess.run([sys.executable, __file__, "--measure", url, "--days", str(days)],
                             capture_output=True, text=True, check=True)
        return {"gpus_asked": gpus, "days": days, **json.loads(out.stdout)}
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", nargs="+", default=["1000x7"], metavar="GPUSxDAYS",
                        help="fleet sizes and history lengths, e.g. 1000x7 250x7")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--days", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(asyncio.run(measure(args.measure, args.days))))
        return
    if args.quick:
        args.runs = ["80x1"]
    runs = [one_size(int(g), float(d)) for g, d in (r.split("x") for r in args.runs)]
    for r in runs:
        print(f"{r['gpus']} GPUs, {r['days']:g} d ({r['steps']} steps, {r['pods']} pods): read "
              f"{r['read_s']:.1f} s + replay {r['replay_s']:.1f} s = {r['total_s']:.1f} s, "
              f"our CPU {r['cpu_s']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB, "
              f"{r['promql_queries']} PromQL queries; "
              f"{r['reclaimed']} reclaims, {r['gpu_hours_freed']} GPU-h")
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "whatif.json").write_text(json.dumps(
            {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "runs": runs},
            indent=2) + "\n")


if __name__ == "__main__":
    main()
