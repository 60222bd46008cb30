"""Reclaimer scale: the pure decision at 1k/10k/20k GPU pods, and one full cycle against the
sandbox (real API server and Prometheus) with its API calls and PromQL queries counted.

    python benchmarks/bench_reclaimer.py [--pods 1000 10000 20000] [--e2e-pods 200 1000] [--quick]

Decision time is the median of 5 runs of `plan()` on a synthetic snapshot (1 node per 10 pods,
a mix of bare pods, Deployments and Jobs, idle/busy/unknown evidence, marks, pending pods, team
quotas); peak RSS is measured in a fresh process per size. Results: results/reclaimer.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusteward.core.model import Node, Pod  # noqa: E402
from gpusteward.core.policy import load_policy, parse_policy  # noqa: E402
from gpusteward.core.reclaim.decide import plan  # noqa: E402
from gpusteward.core.reclaim.model import (  # noqa: E402
    IDLE_SINCE,
    RECLAIM_AT,
    Evidence,
    Owner,
    Snapshot,
)
from gpusteward.core.times import stamp  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
NOW = 1_800_000_000.0
POLICY = parse_policy({"teams": {f"team-{i}": {"quotaGpus": 200} for i in range(20)}})


def snapshot(n: int, seed: int = 3) -> Snapshot:
    rng = random.Random(seed)
    nodes = {f"n{i}": Node(f"n{i}", "NVIDIA-H100-80GB-HBM3", 8) for i in range(max(1, n // 10))}
    names = list(nodes)
    pods, owners, evidence = [], {}, {}
    for i in range(n):
        marks = {}
        if i % 7 == 0:
            marks = {IDLE_SINCE: stamp(NOW - 3600), RECLAIM_AT: stamp(NOW - 60)}
        pod = Pod(namespace=f"ns{i % 50}", name=f"p{i}", uid=f"u{i}", gpus=1 + i % 2,
                  node=names[i % len(names)] if i % 100 else None, phase="Running",
                  priority=rng.choice([0, 100, 1000]), created_at=NOW - 7200,
                  labels={"gpusteward.io/team": f"team-{i % 20}"}, annotations=marks,
                  unschedulable_since=NOW - 600 if i % 100 == 0 else None)
        pods.append(pod)
        if i % 3 == 1:
            owners[pod.uid] = Owner("Deployment", pod.namespace, f"d{i // 3}", (pod.uid,))
        elif i % 3 == 2:
            owners[pod.uid] = Owner("Job", pod.namespace, f"j{i}", (pod.uid,))
        peak = rng.choice([0.5, 1.0, 40.0, 90.0])
        evidence[pod.key] = Evidence(1800.0, peak, rng.choice([1.0, 1.0, 0.5]), pod.gpus)
    windows = {1800.0: evidence, float(POLICY.reclaim.within_quota_window): evidence}
    return Snapshot(now=NOW, pods=tuple(pods), nodes=nodes, owners=owners,
                    namespace_labels={}, evidence=windows, telemetry_ok=True)


def decision(n: int) -> dict:
    snap = snapshot(n)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        decided = plan(snap, POLICY)
        times.append(time.perf_counter() - t)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"pods": n, "decision_ms": 1000 * statistics.median(times), "peak_rss_mb": rss_mb,
            "actions": len(decided.actions), "verdicts": len(decided.verdicts)}


def decision_in_fresh_process(n: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--decision-only", str(n)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


async def e2e_cycle(pods: int) -> dict:
    """One read + decide against the sandbox with `pods` GPU pods bound and sampled."""
    from kubernetes_asyncio import config as kconfig

    from gpusteward.adapters.prometheus import PrometheusSource
    from gpusteward.adapters.snapshot import SnapshotReader
    from gpusteward.sandbox.cluster import Sandbox, SandboxConfig
    from gpusteward.sandbox.fleet import Fleet, Pool
    from gpusteward.sandbox.kubehttp import wait_for

    fleet = Fleet(pools=[Pool(name="h100", product="NVIDIA-H100-80GB-HBM3",
                              count=max(1, -(-pods // 8)), gpus=8)])
    box = Sandbox(SandboxConfig(state_dir=Path(tempfile.mkdtemp(prefix="gpusteward-rb-")),
                                fleet=fleet, log=lambda m: None)).start()
    api = box.api()
    try:
        api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": "load"}})
        for i in range(pods):
            api.create("/api/v1/namespaces/load/pods", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": f"p{i}", "annotations": {"sandbox.gpusteward.io/gpu-util": "0"}},
                "spec": {"containers": [{"name": "m", "image": "x", "resources": {
                    "limits": {"nvidia.com/gpu": "1"}}}]}})
        wait_for("all pods running", lambda: sum(
            1 for p in api.get("/api/v1/namespaces/load/pods")["items"]
            if p["status"].get("phase") == "Running") == pods, timeout=600, interval=2)
        policy = load_policy(box.cfg.policy)
        client = await kconfig.new_client_from_config(config_file=str(box.kubeconfig))
        source = PrometheusSource(box.prometheus_url, policy.telemetry, policy.health)
        reader = SnapshotReader(client, source, policy)
        await asyncio.sleep(20)  # a full 15 s window of samples
        t = time.perf_counter()
        snap = await reader.read()
        read_s = time.perf_counter() - t
        t = time.perf_counter()
        plan(snap, policy)
        decide_s = time.perf_counter() - t
        await client.close()
        return {"pods": pods, "read_s": read_s, "decide_s": decide_s,
                "api_calls": reader.api_calls, "promql_queries": source.queries_run,
                "idle_pods_seen": sum(1 for e in next(iter(snap.evidence.values())).values()
                                      if e.peak_percent is not None)}
    finally:
        box.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, nargs="+", default=[1000, 10000, 20000])
    parser.add_argument("--e2e-pods", type=int, nargs="*", default=[200, 1000])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--decision-only", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.decision_only:
        print(json.dumps(decision(args.decision_only)))
        return
    if args.quick:
        args.pods, args.e2e_pods = [500], [20]
    report = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
              "decision": [decision_in_fresh_process(n) for n in args.pods],
              "cycle": [asyncio.run(e2e_cycle(n)) for n in args.e2e_pods]}
    for d in report["decision"]:
        print(f"decision {d['pods']:>6} pods: {d['decision_ms']:8.1f} ms, peak RSS "
              f"{d['peak_rss_mb']:.0f} MB ({d['actions']} actions)")
    for c in report["cycle"]:
        print(f"cycle    {c['pods']:>6} pods: read {c['read_s']:.2f} s, decide "
              f"{c['decide_s']:.3f} s, {c['api_calls']} API calls, "
              f"{c['promql_queries']} PromQL queries ({c['idle_pods_seen']} pods with evidence)")
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "reclaimer.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
