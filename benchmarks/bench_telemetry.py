"""Telemetry cost against fleet size: one extender refresh (7 PromQL queries) at 1,000 to 5,000
nodes x 8 GPUs (8,000 to 40,000 GPUs).

    python benchmarks/bench_telemetry.py [--nodes 1000 2000 3000 5000] [--no-thanos] [--quick]
        [--prometheus 3 2]

A real Prometheus is loaded with 3 minutes of dcgm-exporter history for every GPU (promtool
backfill, 15 s steps), stored as a Prometheus Operator ServiceMonitor with dcgm-exporter's chart
default (honorLabels: false) stores it, with dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT enabled as
docs/install.md recommends and one GPU in a hundred counting an XID; we time
PrometheusSource.fetch() (median of 10) in a fresh process, whose peak RSS is the refresh's
(the history text is built in another), and count the bytes each query returns. Results:
benchmarks/results/telemetry.json.

Each size runs on every Prometheus major given (default: 3, built from its Go module, and
Debian's 2.42), side by side: a row's figures are the first major's, ``by_prometheus`` holds
each major's.

Unless --no-thanos (or --quick), the same refresh also runs against a horizontally scaled
backend, as large fleets keep DCGM metrics: a Thanos querier over two Prometheus instances
holding half the fleet each (external label `shard`), each behind a Thanos sidecar (Store API
over gRPC). Thanos is built from its Go module on first use (sandbox/controllers/thanos). The
refresh must read every GPU through the querier; each process's CPU over the refreshes is
recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

from benchmarks.memory import cpu_seconds, peak_rss_mb
from gpusteward.adapters.telemetry import PrometheusSource
from gpusteward.core.dcgm import PodRef
from gpusteward.core.policy import parse_policy
from gpusteward.sandbox.controllers import PROMETHEUS_MAJORS, ensure_controller
from gpusteward.sandbox.procs import free_port
from gpusteward.sandbox.simgpu import SimGpu, render_openmetrics_history
from tests.support.prometheus import PrometheusServer, servicemonitor

RESULTS = Path(__file__).resolve().parent / "results"


def history(nodes: range, now: float) -> str:
    gpus = [SimGpu(f"gpu-node-{n:05d}", i, "NVIDIA H100 80GB HBM3", util_percent=(n * 7 + i) % 100,
                   xid=48 if (n * 8 + i) % 100 == 0 else 0, xid_count=int((n * 8 + i) % 100 == 0),
                   pod=PodRef("ml", f"p-{n}-{i}", "main") if i < 4 else None)
            for n in nodes for i in range(8)]
    frames = [(now - 180 + 15 * k, gpus) for k in range(12)]
    return render_openmetrics_history(frames, scrape=servicemonitor(honor_labels=False),
                                      xid_count_window_ms=300_000)


def response_bytes(url: str, query: str) -> tuple[int, int]:
    """(JSON bytes, bytes on the wire): PrometheusSource's requests session asks for gzip, as
    every requests session does; Prometheus's API compresses what is asked for, a Thanos
    querier only answers above a size (a small answer comes plain)."""
    full = f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    asked = urllib.request.Request(full, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(asked, timeout=60) as resp:
        wire = resp.read()
        zipped = resp.headers.get("Content-Encoding") == "gzip"
    return len(gzip.decompress(wire) if zipped else wire), len(wire)


async def fetch_times(url: str, runs: int) -> dict:
    policy = parse_policy({})
    source = PrometheusSource.at(url, policy.telemetry, policy.health)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        readings = await source.fetch()
        times.append(time.perf_counter() - t)
    return {"times": times, "gpus_read": sum(len(r) for r in readings.nodes.values()),
            "queries": dict(source.queries),
            "peak_rss_mb": peak_rss_mb()}


def fetched_from(url: str, runs: int, pids: dict[str, int]) -> tuple[dict, dict]:
    """The refreshes in a fresh process, each query's bytes, and each of `pids`' CPU seconds
    per refresh (the fetch process's warm-up excluded: it imports before it times)."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    out = subprocess.run([sys.executable, __file__, "--fetch-only", url, str(runs)],
                         capture_output=True, text=True, check=True)
    cpu = {name: round((cpu_seconds(pid) - before[name]) / runs, 3) for name, pid in pids.items()}
    fetched = json.loads(out.stdout)
    sizes = {name: response_bytes(url, q) for name, q in fetched["queries"].items()}
    return {**fetched, "cpu_s_per_refresh": cpu}, sizes


def run(nodes: int, runs: int, thanos: bool, majors: list[str]) -> dict:
    by_major = {}
    for major in majors:
        with tempfile.TemporaryDirectory() as tmp:
            now = time.time() - 10
            prom = PrometheusServer(Path(tmp), history_openmetrics=history(range(nodes), now),
                                    major=major)
            with prom:
                fetched, sizes = fetched_from(prom.url, runs, {"prometheus": prom.pid})
        by_major[major] = summary(nodes, fetched, sizes)
    row = {**by_major[majors[0]], "prometheus": majors[0], "by_prometheus": by_major}
    if thanos:
        row["thanos"] = run_thanos(nodes, runs, majors[0])
    return row


def run_thanos(nodes: int, runs: int, major: str) -> dict:
    """The refresh through a Thanos querier over two shards of half the fleet each."""
    binary = str(ensure_controller("thanos", log=lambda m: print(m, flush=True)))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        now, half = time.time() - 10, nodes // 2
        pids, endpoints = {}, []
        for shard, part in (("a", range(half)), ("b", range(half, nodes))):
            prom = stack.enter_context(PrometheusServer(
                Path(tmp) / shard, history_openmetrics=history(part, now),
                external_labels={"shard": shard}, major=major))
            grpc, http = free_port(), free_port()
            pids[f"prometheus-{shard}"] = prom.pid
            pids[f"sidecar-{shard}"] = stack.enter_context(thanos_process(
                Path(tmp) / f"sidecar-{shard}.log", http,
                [binary, "sidecar", f"--prometheus.url={prom.url}",
                 f"--tsdb.path={prom.tsdb_path}", f"--grpc-address=127.0.0.1:{grpc}",
                 f"--http-address=127.0.0.1:{http}"]))
            endpoints.append(f"--endpoint=127.0.0.1:{grpc}")
        http = free_port()
        pids["querier"] = stack.enter_context(thanos_process(
            Path(tmp) / "querier.log", http,
            [binary, "query", f"--http-address=127.0.0.1:{http}",
             f"--grpc-address=127.0.0.1:{free_port()}", *endpoints]))
        url = f"http://127.0.0.1:{http}"
        try:
            wait_for_stores(url, len(endpoints))
        except RuntimeError as e:
            logs = "".join(f"\n--- {p.name}\n{p.read_text()[-2000:]}"
                           for p in sorted(Path(tmp).glob("*.log")))
            raise RuntimeError(f"{e}{logs}") from None
        fetched, sizes = fetched_from(url, runs, pids)
    if fetched["gpus_read"] != nodes * 8:
        raise RuntimeError(f"through Thanos the refresh read {fetched['gpus_read']} GPUs of "
                           f"{nodes * 8}")
    return summary(nodes, fetched, sizes)


@contextlib.contextmanager
def thanos_process(log: Path, http_port: int, argv: list[str]):
    """A Thanos component, ready once its /-/ready answers; yields its pid."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not _ok(f"http://127.0.0.1:{http_port}/-/ready"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{argv[1]} not ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def wait_for_stores(url: str, count: int) -> None:
    """The querier lists a store once it has dialled it and read its labels and time range."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(f"{url}/api/v1/stores", timeout=5) as resp:
                stores = json.load(resp).get("data") or {}
            if sum(len(v or []) for v in stores.values()) >= count:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the Thanos querier at {url} did not see {count} stores in 60 s")


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def summary(nodes: int, fetched: dict, sizes: dict[str, tuple[int, int]]) -> dict:
    per_query = {name: plain for name, (plain, _) in sizes.items()}
    times = fetched["times"]
    return {"nodes": nodes, "gpus": nodes * 8, "queries_per_refresh": len(per_query),
            "refresh_p50_ms": 1000 * statistics.median(times),
            "refresh_max_ms": 1000 * max(times), "bytes_per_refresh": sum(per_query.values()),
            "bytes_by_query": per_query,
            "wire_bytes_per_refresh": sum(wire for _, wire in sizes.values()),
            "gpus_read": fetched["gpus_read"],
            "peak_rss_mb": fetched["peak_rss_mb"],
            "cpu_s_per_refresh": fetched["cpu_s_per_refresh"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 2000, 3000, 5000])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-thanos", dest="thanos", action="store_false",
                        help="skip the refresh through a Thanos querier over two shards")
    parser.add_argument("--prometheus", nargs="+", choices=PROMETHEUS_MAJORS,
                        default=list(PROMETHEUS_MAJORS),
                        help="the Prometheus majors each size runs on, side by side (the first "
                             "one's figures are the row's; Thanos reads through it)")
    parser.add_argument("--fetch-only", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fetch_only:
        url, runs = args.fetch_only
        print(json.dumps(asyncio.run(fetch_times(url, int(runs)))))
        return
    sizes, runs = ([20], 3) if args.quick else (args.nodes, 10)
    results = []
    for nodes in sizes:
        r = run(nodes, runs, args.thanos and not args.quick, args.prometheus)
        results.append(r)
        for where, row in (*((f"one Prometheus {m}", r["by_prometheus"][m])
                             for m in args.prometheus), ("Thanos, 2 shards", r.get("thanos"))):
            if row is not None:
                print(f"telemetry refresh at {row['gpus']} GPUs, {where}: "
                      f"{row['queries_per_refresh']} queries, p50 {row['refresh_p50_ms']:.0f} "
                      f"ms, {row['bytes_per_refresh'] / 1e6:.1f} MB JSON, "
                      f"{row['wire_bytes_per_refresh'] / 1e6:.2f} MB on the wire, peak RSS "
                      f"{row['peak_rss_mb']:.0f} MB ({row['gpus_read']} GPUs read), CPU s per "
                      f"refresh {row['cpu_s_per_refresh']}", flush=True)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "telemetry.json").write_text(json.dumps(
            {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
             "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
