"""Reclaimer scale: the pure decision at 1k/10k/20k GPU pods, and one full cycle against the
sandbox (real API server and Prometheus) with its API calls and PromQL queries counted.

    python benchmarks/bench_reclaimer.py [--pods 1000 10000 20000]
        [--e2e-pods 1000 5000 10000 20000] [--quick]

Decision time is the median of 5 runs of `plan()` on a synthetic snapshot (1 node per 10 pods,
a mix of bare pods, Deployments and Jobs, idle/busy/unknown evidence, marks, pending pods, team
quotas); peak RSS is measured in a fresh process per size. Results: results/reclaimer.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.memory import peak_rss_mb  # noqa: E402
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
    rss_mb = peak_rss_mb()
    return {"pods": n, "decision_ms": 1000 * statistics.median(times), "peak_rss_mb": rss_mb,
            "actions": len(decided.actions), "verdicts": len(decided.verdicts)}


def decision_in_fresh_process(n: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--decision-only", str(n)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def e2e_cycle(pods: int) -> dict:
    """One read + decide, in a fresh process (its peak RSS is the reclaimer's), against a
    sandbox with `pods` GPU pods placed by the real scheduler on kwok nodes and sampled by the
    real Prometheus. Above 1,000 pods the simulator is scraped every 5 s instead of every
    second (one target per node: 2,500 targets a second would take the 2 cores), and the
    policy's scrapeInterval and both idle windows follow, so that coverage reads true and the
    same queries run at every size."""
    from concurrent.futures import ThreadPoolExecutor

    from gpusteward.sandbox.cluster import Sandbox, SandboxConfig
    from gpusteward.sandbox.fleet import Fleet, Pool
    from gpusteward.sandbox.kubehttp import wait_for

    scrape = 1 if pods <= 1000 else 5
    fleet = Fleet(pools=[Pool(name="h100", product="NVIDIA-H100-80GB-HBM3",
                              count=max(1, -(-pods // 8)), gpus=8)])
    state = Path(tempfile.mkdtemp(prefix="gpusteward-rb-"))
    box = Sandbox(SandboxConfig(state_dir=state, fleet=fleet, log=lambda m: None,
                                scrape_interval=f"{scrape}s")).start()
    api = box.api()
    try:
        api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": "load"}})
        started = time.perf_counter()

        def create(i: int) -> None:
            api.create("/api/v1/namespaces/load/pods", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": f"p{i}", "annotations": {"sandbox.gpusteward.io/gpu-util": "0"}},
                "spec": {"containers": [{"name": "m", "image": "x", "resources": {
                    "limits": {"nvidia.com/gpu": "1"}}}]}})

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(pods)))
        wait_for("all pods running", lambda: not api.get(
            "/api/v1/namespaces/load/pods?limit=1&fieldSelector=status.phase!%3DRunning")[
            "items"], timeout=3600, interval=5)
        placed_s = time.perf_counter() - started
        raw = yaml.safe_load(Path(box.cfg.policy).read_text())
        raw["telemetry"]["scrapeInterval"] = f"{scrape}s"
        raw["reclaim"]["idle"]["window"] = f"{15 * scrape}s"
        raw["reclaim"]["withinQuotaWindow"] = f"{30 * scrape}s"  # two windows at every size
        # The sandbox's 5 s query timeout is for its small fleet; the shipped default is 10 s,
        # and the benchmark measures how long the reads take, not whether they fit a timeout.
        raw["telemetry"]["queryTimeout"] = "60s"
        policy_file = state / "bench-policy.yaml"
        policy_file.write_text(yaml.safe_dump(raw))
        time.sleep(15 * scrape + 2 * scrape)  # a full window of samples for every pod
        out = subprocess.run([sys.executable, __file__, "--cycle-only", str(box.kubeconfig),
                              box.prometheus_url, str(policy_file)],
                             capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"the cycle at {pods} pods failed: {out.stderr[-3000:]}")
        return {"pods": pods, "scrape_s": scrape, "placed_s": placed_s,
                **json.loads(out.stdout)}
    finally:
        box.stop()


async def cycle_only(kubeconfig: str, prometheus_url: str, policy_file: str) -> dict:
    """Read + decide as the reclaimer does, with its API calls and PromQL queries counted."""
    from kubernetes_asyncio import config as kconfig

    from gpusteward.adapters.prometheus import PrometheusSource
    from gpusteward.adapters.snapshot import SnapshotReader

    policy = load_policy(policy_file)
    client = await kconfig.new_client_from_config(config_file=kubeconfig)
    source = PrometheusSource(prometheus_url, policy.telemetry, policy.health)
    reader = SnapshotReader(client, source, policy)
    t, cpu = time.perf_counter(), time.process_time()
    snap = await reader.read()
    read_s, read_cpu_s = time.perf_counter() - t, time.process_time() - cpu
    t = time.perf_counter()
    decided = plan(snap, policy)
    decide_s = time.perf_counter() - t
    await client.close()
    evidence = next(iter(snap.evidence.values()))
    return {"read_s": read_s, "read_cpu_s": read_cpu_s, "decide_s": decide_s,
            "api_calls": reader.api_calls,
            "promql_queries": source.queries_run,
            "peak_rss_mb": peak_rss_mb(),
            "idle_pods_seen": sum(1 for v in decided.verdicts if v.state == "idle"),
            "pods_with_evidence": sum(1 for e in evidence.values()
                                      if e.peak_percent is not None)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, nargs="+", default=[1000, 10000, 20000])
    parser.add_argument("--e2e-pods", type=int, nargs="*", default=[1000, 5000, 10000, 20000])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--decision-only", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cycle-only", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.decision_only:
        print(json.dumps(decision(args.decision_only)))
        return
    if args.cycle_only:
        print(json.dumps(asyncio.run(cycle_only(*args.cycle_only))))
        return
    if args.quick:
        args.pods, args.e2e_pods = [500], [20]
    report = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
              "decision": [decision_in_fresh_process(n) for n in args.pods], "cycle": []}
    for d in report["decision"]:
        print(f"decision {d['pods']:>6} pods: {d['decision_ms']:8.1f} ms, peak RSS "
              f"{d['peak_rss_mb']:.0f} MB ({d['actions']} actions)", flush=True)
    for n in args.e2e_pods:  # written after each size: the largest take many minutes
        c = e2e_cycle(n)
        report["cycle"].append(c)
        print(f"cycle    {c['pods']:>6} pods: read {c['read_s']:.2f} s, decide "
              f"{c['decide_s']:.3f} s, peak RSS {c['peak_rss_mb']:.0f} MB, {c['api_calls']} API "
              f"calls, {c['promql_queries']} PromQL queries ({c['pods_with_evidence']} pods with "
              f"evidence, {c['idle_pods_seen']} idle; placed in {c['placed_s']:.0f} s)",
              flush=True)
        if not args.quick:
            RESULTS.mkdir(exist_ok=True)
            (RESULTS / "reclaimer.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
