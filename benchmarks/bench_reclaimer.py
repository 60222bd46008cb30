"""Reclaimer scale: the pure decision at 1k/10k/20k GPU pods; one read + decide with nothing
else on the cores (LISTs served without an API server's cost, a real Prometheus loaded with
history: our CPU and Prometheus's, floor_cycle); and one full cycle against the sandbox (real
API server and Prometheus) with its API calls, PromQL queries and each sandbox process's CPU.

    python benchmarks/bench_reclaimer.py [--pods 1000 10000 20000]
        [--floor-pods 1000 5000 10000 20000] [--e2e-pods 1000 5000 10000 20000] [--quick]
        [--prometheus 3 2]

The floor cycle (the evidence read) runs on each Prometheus major given (default: 3, built from
its Go module, and Debian's 2.42), one row each, side by side; the sandbox cycle on the
sandbox's Prometheus ($GPUSTEWARD_PROMETHEUS, default 3).

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

from benchmarks.memory import cpu_seconds, peak_rss_mb
from gpusteward.adapters.policyfile import load_policy
from gpusteward.core.model import Node, Pod
from gpusteward.core.policy import parse_policy
from gpusteward.core.reclaim.decide import plan
from gpusteward.core.reclaim.model import (
    IDLE_SINCE,
    RECLAIM_AT,
    Evidence,
    Owner,
    Snapshot,
)
from gpusteward.core.times import stamp
from gpusteward.sandbox.controllers import PROMETHEUS_MAJORS

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
    second, and above 10,000 every 10 s (one target per node: 2,500 targets a second would
    take the 2 cores; this keeps it at 250 or fewer), and the policy's scrapeInterval and
    both idle windows follow, so that coverage reads true and the same queries run at every
    size. The CPU each sandbox process used during the cycle is recorded beside it."""
    from concurrent.futures import ThreadPoolExecutor

    from gpusteward.sandbox.cluster import Sandbox, SandboxConfig
    from gpusteward.sandbox.fleet import Fleet, Pool
    from gpusteward.sandbox.kubehttp import wait_for

    scrape = 1 if pods <= 1000 else 5 if pods <= 10000 else 10
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
        before = {name: cpu_seconds(proc.pid) for name, proc in box.procs.items()}
        out = subprocess.run([sys.executable, __file__, "--cycle-only", str(box.kubeconfig),
                              box.prometheus_url, str(policy_file)],
                             capture_output=True, text=True)
        during = {name: round(cpu_seconds(box.procs[name].pid) - used, 2)
                  for name, used in before.items()}
        if out.returncode:
            raise RuntimeError(f"the cycle at {pods} pods failed: {out.stderr[-3000:]}")
        return {"pods": pods, "scrape_s": scrape, "placed_s": placed_s,
                **json.loads(out.stdout), "sandbox_cpu_s": during}
    finally:
        box.stop()


FLOOR_PRODUCT = "NVIDIA-H100-80GB-HBM3"


def _fields(*names: str) -> dict:
    return {".": {}, **{f"f:{n}": {} for n in names}}


def _condition() -> dict:
    return _fields("lastProbeTime", "lastTransitionTime", "status", "type")


# What kube-apiserver keeps and LISTs with every pod: one managedFields entry per writer
# (Server-Side Apply field tracking), here the client that created it and the status writer.
MANAGED_FIELDS = [
    {"manager": "kubectl-create", "operation": "Update", "apiVersion": "v1",
     "time": "2026-11-29T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {
         "f:metadata": {"f:labels": _fields("app", "gpusteward.io/team")},
         "f:spec": {"f:containers": {'k:{"name":"main"}': {
             **_fields("image", "imagePullPolicy", "name", "terminationMessagePath",
                       "terminationMessagePolicy"),
             "f:resources": {".": {}, "f:limits": _fields("nvidia.com/gpu"),
                             "f:requests": _fields("nvidia.com/gpu")}}},
             **{f"f:{n}": {} for n in ("dnsPolicy", "enableServiceLinks", "priorityClassName",
                                       "restartPolicy", "schedulerName", "securityContext",
                                       "terminationGracePeriodSeconds")}}}},
    {"manager": "kwok", "operation": "Update", "apiVersion": "v1", "subresource": "status",
     "time": "2026-11-29T10:00:02Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {
         "f:conditions": {f'k:{{"type":"{t}"}}': _condition()
                          for t in ("ContainersReady", "Initialized", "PodScheduled", "Ready")},
         "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {}, "f:podIP": {},
         "f:podIPs": {".": {}, 'k:{"ip":"10.0.0.1"}': _fields("ip")}, "f:startTime": {}}}},
]


def floor_fleet(pods: int, now: float) -> tuple[dict[str, list[dict]], str]:
    """LIST items and Prometheus history for ``pods`` one-GPU pods, eight to a node: the pods
    and nodes as the API server stores them (bench_fleetview's shapes, the pods with the
    managedFields every LIST carries) and 3 minutes of
    dcgm-exporter samples every 15 s for each GPU, stored as a ServiceMonitor stores them
    (honorLabels: false). A third of the GPUs read 0 %, the rest 40 %."""
    from benchmarks.bench_fleetview import pod_json
    from benchmarks.fleetgen import node_json
    from gpusteward.core.dcgm import PodRef
    from gpusteward.sandbox.simgpu import SimGpu, render_openmetrics_history
    from tests.support.prometheus import servicemonitor

    names = [f"gpu-node-{i:05d}" for i in range(-(-pods // 8))]
    placed = [(node, k) for node in names for k in range(8)][:pods]
    lists = {"/api/v1/nodes": [node_json(n, FLOOR_PRODUCT) for n in names],
             "/api/v1/pods": [_stored(pod_json(node, k, claims=False)) for node, k in placed],
             "/api/v1/namespaces": [{"metadata": {"name": "ml", "labels": {}}}]}
    gpus = [SimGpu(node, k, "NVIDIA H100 80GB HBM3", util_percent=0 if i % 3 == 0 else 40,
                   pod=PodRef("ml", f"train-{node}-{k}", "main"))
            for i, (node, k) in enumerate(placed)]
    history = render_openmetrics_history([(now - 180 + 15 * k, gpus) for k in range(12)],
                                         scrape=servicemonitor(honor_labels=False))
    return lists, history


def _stored(pod: dict) -> dict:
    pod["metadata"]["managedFields"] = MANAGED_FIELDS
    return pod


def floor_cycle(pods: int, major: str | None = None) -> dict:
    """One read + decide in a fresh process with nothing else on the cores: the LISTs from
    benchmarks/listserver.py (paged as the API server pages them, without its cost) and the
    evidence from a real Prometheus loaded with the history (promtool backfill). Our CPU and
    Prometheus's during the cycle are the whole cost; the sandbox cycle adds the API server's
    and the competition of the sandbox's own processes. The window is 150 s of 15 s samples
    and coverage may be as low as 0.1: the history ends when it is built, minutes before the
    read at 20,000 pods (backfill, start), and the read costs the same either way."""
    from benchmarks.listserver import ListServer
    from tests.support.prometheus import PrometheusServer

    with tempfile.TemporaryDirectory() as tmp:
        lists, history = floor_fleet(pods, time.time() - 10)
        policy_file = Path(tmp) / "policy.yaml"
        policy_file.write_text(yaml.safe_dump({
            "telemetry": {"scrapeInterval": "15s", "queryTimeout": "60s", "staleAfter": "1h"},
            "reclaim": {"idle": {"window": "150s", "minCoverage": 0.1},
                        "withinQuotaWindow": "165s"},  # a second window, as in the sandbox
            "teams": {"ml": {"quotaGpus": pods // 2}}}))
        prom = PrometheusServer(Path(tmp) / "prometheus", history_openmetrics=history,
                                major=major)
        del history
        with ListServer(lists) as api, prom:
            before = cpu_seconds(prom.pid)
            out = subprocess.run([sys.executable, __file__, "--cycle-only",
                                  str(api.kubeconfig(Path(tmp))), prom.url, str(policy_file)],
                                 capture_output=True, text=True)
            prometheus_cpu_s = cpu_seconds(prom.pid) - before
    if out.returncode:
        raise RuntimeError(f"the floor cycle at {pods} pods failed: {out.stderr[-3000:]}")
    return {"pods": pods, "prometheus": major or PROMETHEUS_MAJORS[0], **json.loads(out.stdout),
            "prometheus_cpu_s": prometheus_cpu_s}


async def cycle_only(kubeconfig: str, prometheus_url: str, policy_file: str) -> dict:
    """Read + decide as the reclaimer does, with its API calls and PromQL queries counted."""
    from kubernetes_asyncio import config as kconfig

    from gpusteward.adapters.promclient import PrometheusClient
    from gpusteward.adapters.snapshot import SnapshotReader

    policy = load_policy(policy_file)
    client = await kconfig.new_client_from_config(config_file=kubeconfig)
    source = PrometheusClient(prometheus_url, policy.telemetry)
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
    parser.add_argument("--floor-pods", type=int, nargs="*", default=[1000, 5000, 10000, 20000])
    parser.add_argument("--e2e-pods", type=int, nargs="*", default=[1000, 5000, 10000, 20000])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--prometheus", nargs="+", choices=PROMETHEUS_MAJORS,
                        default=list(PROMETHEUS_MAJORS),
                        help="the Prometheus majors the floor cycle runs on, side by side")
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
        args.pods, args.floor_pods, args.e2e_pods = [500], [200], [20]
    report = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
              "decision": [decision_in_fresh_process(n) for n in args.pods], "floor": [],
              "cycle": []}
    for d in report["decision"]:
        print(f"decision {d['pods']:>6} pods: {d['decision_ms']:8.1f} ms, peak RSS "
              f"{d['peak_rss_mb']:.0f} MB ({d['actions']} actions)", flush=True)
    for n, major in ((n, m) for n in args.floor_pods for m in args.prometheus):
        f = floor_cycle(n, major)
        report["floor"].append(f)
        print(f"floor    {f['pods']:>6} pods, Prometheus {major}: read {f['read_s']:.2f} s "
              f"(our CPU {f['read_cpu_s']:.2f} s, Prometheus {f['prometheus_cpu_s']:.2f} s), "
              f"decide {f['decide_s']:.3f} s, peak RSS {f['peak_rss_mb']:.0f} MB, "
              f"{f['api_calls']} API calls, {f['promql_queries']} PromQL queries", flush=True)
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
