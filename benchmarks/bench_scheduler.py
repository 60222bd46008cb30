"""Scheduler throughput with and without the extender, side by side in one sandbox run.

    python benchmarks/bench_scheduler.py [--nodes 1000] [--pods 2000] [--quick]

For each setup — (a) kube-scheduler alone, (b) with gpusteward nodeCacheCapable: true,
(c) with gpusteward and full Node objects — the scheduler is stopped, the pods are created,
the scheduler is started, and we time it binding them all (kwok nodes, real apiserver).
Latency percentiles come from the scheduler's own `scheduler_scheduling_attempt_duration_seconds`
histogram (per pod: filter + score + extender calls). Results: benchmarks/results/scheduler.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import secrets
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusteward.sandbox.cluster import _INSECURE, Sandbox, SandboxConfig  # noqa: E402
from gpusteward.sandbox.fleet import Fleet, Pool  # noqa: E402
from gpusteward.sandbox.kubehttp import wait_for  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SETUPS = [("a: scheduler alone", False, True), ("b: gpusteward, node names", True, True),
          ("c: gpusteward, full nodes", True, False)]


def fleet(nodes: int) -> Fleet:
    share = nodes // 4
    return Fleet(pools=[
        Pool(name="h100", product="NVIDIA-H100-80GB-HBM3", count=share, gpus=8),
        Pool(name="a100", product="NVIDIA-A100-SXM4-80GB", count=share, gpus=8),
        Pool(name="l4", product="NVIDIA-L4", count=nodes - 2 * share, gpus=8),
    ])


def pod(i: int) -> dict:
    cards = ["NVIDIA-H100*,NVIDIA-A100*", "NVIDIA-L4", None][i % 3]
    annotations = {"gpusteward.io/card-types": cards} if cards else {}
    cls = ["training", "inference", "batch"][i % 3]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{i:05d}", "annotations": annotations,
                         "labels": {"gpusteward.io/class": cls}},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
                "name": "main", "image": "registry.invalid/cuda:1",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def scheduler_metrics(box: Sandbox) -> dict[str, float]:
    with urllib.request.urlopen(box.scheduler_metrics_url, context=_INSECURE, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("scheduler_scheduling_attempt_duration_seconds_bucket",
                            "scheduler_schedule_attempts_total")) and 'result="scheduled"' in line:
            name, value = line.rsplit(" ", 1)
            out[name] = out.get(name, 0.0) + float(value)
    return out


def scheduled(box: Sandbox) -> float:
    return sum(v for k, v in scheduler_metrics(box).items()
               if k.startswith("scheduler_schedule_attempts_total"))


def quantile(metrics: dict[str, float], q: float) -> float:
    """Upper bound of the histogram bucket holding quantile q (what Prometheus would report)."""
    les = {k: re.search(r'[{,]le="([^"]+)"', k) for k in metrics if "_bucket" in k}
    buckets = sorted((float(m.group(1)), metrics[k]) for k, m in les.items()
                     if m and m.group(1) != "+Inf")
    total = sum(metrics[k] for k, m in les.items() if m and m.group(1) == "+Inf")
    for le, count in buckets:
        if count >= q * total:
            return le
    return float("inf")


def run_setup(box: Sandbox, name: str, extender: bool, names_only: bool, pods: int) -> dict:
    api = box.api()
    ns = f"bench-{secrets.token_hex(4)}"  # quick setups can start within the same second
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": ns}})
    box.stop_component("scheduler")
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: api.create(f"/api/v1/namespaces/{ns}/pods", pod(i)),
                      range(pods)))
    launched = time.monotonic()
    box.restart_scheduler(with_extender=extender, node_cache_capable=names_only)
    # Rate from the first poll after the scheduler is ready to the last pod: start-up excluded.
    started, first = time.monotonic(), scheduled(box)
    wait_for(f"{pods} pods bound", lambda: scheduled(box) >= pods, timeout=1800, interval=0.1)
    elapsed = time.monotonic() - started
    if pods - first < pods / 2:  # too few pods left to time after start-up (quick mode)
        first, elapsed = 0, time.monotonic() - launched
    metrics = scheduler_metrics(box)
    bound = sum(1 for p in api.get(f"/api/v1/namespaces/{ns}/pods")["items"]
                if p["spec"].get("nodeName"))
    api.delete(f"/api/v1/namespaces/{ns}")
    return {"setup": name, "pods": pods, "bound": bound, "seconds": elapsed,
            "measured_pods": pods - first, "pods_per_second": (pods - first) / elapsed,
            "attempt_p50_ms": 1000 * quantile(metrics, 0.5),
            "attempt_p99_ms": 1000 * quantile(metrics, 0.99)}


def run(nodes: int, pods: int) -> dict:
    state = Path(tempfile.mkdtemp(prefix="gpusteward-bench-"))
    # A 5 s scrape: rendering 8,000 simulated GPUs every second would eat a core by itself.
    box = Sandbox(SandboxConfig(state_dir=state, fleet=fleet(nodes), with_extender=True,
                                policy=HERE / "policy.yaml", scrape_interval="5s",
                                log=lambda m: print(f"  {m}", flush=True))).start()
    try:
        rows = [run_setup(box, name, ext, names, pods) for name, ext, names in SETUPS]
    finally:
        box.stop()
    base = rows[0]["pods_per_second"]
    for r in rows:
        r["ratio_to_a"] = r["pods_per_second"] / base
    return {"machine": f"{platform.node()} {platform.machine()}, 2 cores shared by apiserver, "
                       f"etcd, scheduler, kwok, extender", "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(sys.argv), "nodes": nodes, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="CI: tiny run, checks it works")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.pods = 20, 40
    report = run(args.nodes, args.pods)
    for r in report["rows"]:
        print(f"{r['setup']:<28} {r['pods_per_second']:7.1f} pods/s  ratio {r['ratio_to_a']:.2f}"
              f"  attempt p50 {r['attempt_p50_ms']:.1f} ms  p99 {r['attempt_p99_ms']:.1f} ms"
              f"  ({r['bound']}/{r['pods']} bound in {r['seconds']:.1f} s)")
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "scheduler.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
