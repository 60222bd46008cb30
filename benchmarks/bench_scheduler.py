"""Scheduler throughput: gpusteward against the scheduler alone and against the protocol floor.

    python benchmarks/bench_scheduler.py [--nodes 1000,5000] [--pods 400] [--reps 3] [--quick]

Setups, all in one sandbox per fleet size, repeated --reps times in alternating order:

  (a)  kube-scheduler alone;
  (a') alone with OpportunisticBatching=false — kube-scheduler 1.36 turns its batching off for
       any profile with an extender, so (a') is what every extender starts from;
  (n)  the protocol floor: a no-op extender in Go on the upstream extender/v1 types
       (sandbox/go/cmd/noopextender), node names (nodeCacheCapable: true);
  (b)  gpusteward, node names;
  (c)  gpusteward, full Node objects;
  (n') the no-op extender with full Node objects;
  (b*) and (n*): (b) and (n) with the extender pinned to a core of its own and everything else
       (apiserver, etcd, scheduler, kwok, Prometheus) to the other ones.

For each run the scheduler is stopped, the pods are created, the scheduler is started, and we time
it binding them all (kwok nodes, real apiserver). Latency percentiles come from the scheduler's
own `scheduler_scheduling_attempt_duration_seconds` histogram. Results:
benchmarks/results/scheduler.json, rendered by benchmarks/report.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import secrets
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from operator import sub
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.memory import cpu_seconds
from gpusteward.sandbox.cluster import Sandbox, SandboxConfig
from gpusteward.sandbox.fleet import Fleet, Pool
from gpusteward.sandbox.kubehttp import _INSECURE, wait_for

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


@dataclass(frozen=True)
class Setup:
    key: str
    label: str
    extender: str | None = None  # None, "gpusteward" or "noop"
    names_only: bool = True
    batching: bool = True
    pinned: bool = False


SETUPS = (
    Setup("a", "scheduler alone"),
    Setup("a'", "scheduler alone, batching off", batching=False),
    Setup("n", "Go no-op extender, node names", "noop"),
    Setup("b", "gpusteward, node names", "gpusteward"),
    Setup("c", "gpusteward, full nodes", "gpusteward", names_only=False),
    Setup("n'", "Go no-op extender, full nodes", "noop", names_only=False),
    Setup("b*", "gpusteward, node names, extender on its own core", "gpusteward", pinned=True),
    Setup("n*", "Go no-op, node names, extender on its own core", "noop", pinned=True),
)
#: Each extender setup's protocol floor: the no-op extender in the same mode.
FLOOR = {"b": "n", "c": "n'", "b*": "n*"}


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


def process_cpu(box: Sandbox) -> dict[str, float]:
    """CPU seconds each sandbox process has used so far."""
    used = {}
    for name, proc in box.procs.items():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            used[name] = cpu_seconds(proc.pid)
    return used


def extender_calls(box: Sandbox) -> tuple[float, float]:
    """(seconds, calls) the gpusteward extender has spent answering filter and prioritize,
    from its own `gpusteward_extender_request_duration_seconds` histogram."""
    with urllib.request.urlopen(f"{box.extender_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = {"_sum": 0.0, "_count": 0.0}
    for line in text.splitlines():
        for part in total:
            if line.startswith(f"gpusteward_extender_request_duration_seconds{part}{{") and (
                    'verb="filter"' in line or 'verb="prioritize"' in line):
                total[part] += float(line.rsplit(" ", 1)[1])
    return total["_sum"], total["_count"]


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


def pin(box: Sandbox, extender: str | None) -> bool:
    """Pin the extender's threads to the last CPU and every other sandbox process to the rest;
    extender None: every process back on every CPU. False where there is one CPU only."""
    cpus = sorted(os.sched_getaffinity(0))
    if extender is not None and len(cpus) < 2:
        return False
    for name, proc in box.procs.items():
        own = extender is not None and name.split("/")[0] == extender
        target = set(cpus) if extender is None else {cpus[-1]} if own else set(cpus[:-1])
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), target)
    return True


def configure(box: Sandbox, setup: Setup, floor_url: str) -> None:
    box.cfg.scheduler_feature_gates = {} if setup.batching else {"OpportunisticBatching": False}
    box.cfg.scheduler_extender_url = floor_url if setup.extender == "noop" else None
    box.cfg.preempt_verb = setup.extender == "gpusteward"  # the floor serves filter/prioritize
    box.restart_scheduler(with_extender=setup.extender is not None,
                          node_cache_capable=setup.names_only)
    if setup.pinned:
        pin(box, "extender" if setup.extender == "gpusteward" else "noopextender")


def run_setup(box: Sandbox, setup: Setup, floor_url: str, pods: int) -> dict:
    api = box.api()
    ns = f"bench-{secrets.token_hex(4)}"  # quick setups can start within the same second
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": ns}})
    box.stop_component("scheduler")
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: api.create(f"/api/v1/namespaces/{ns}/pods", pod(i)),
                      range(pods)))
    launched = time.monotonic()
    configure(box, setup, floor_url)
    ours = setup.extender == "gpusteward"
    try:
        # Rate from the first poll after the scheduler is ready to the last pod: start-up
        # excluded. Each process's CPU over the same span says where the time went.
        cpu_before, calls_before = process_cpu(box), extender_calls(box) if ours else (0, 0)
        started, first = time.monotonic(), scheduled(box)
        wait_for(f"{pods} pods bound", lambda: scheduled(box) >= pods, timeout=1800,
                 interval=0.1)
        elapsed = time.monotonic() - started
        cpu = {name: round(used - cpu_before[name], 3)
               for name, used in process_cpu(box).items() if name in cpu_before}
        calls = tuple(map(sub, extender_calls(box), calls_before)) if ours else (0, 0)
    finally:
        if setup.pinned:
            pin(box, None)
    if pods - first < pods / 2:  # too few pods left to time after start-up (quick mode)
        first, elapsed = 0, time.monotonic() - launched
    metrics = scheduler_metrics(box)
    bound = sum(1 for p in api.get(f"/api/v1/namespaces/{ns}/pods")["items"]
                if p["spec"].get("nodeName"))
    api.delete(f"/api/v1/namespaces/{ns}")
    return {"setup": setup.key, "pods": pods, "bound": bound, "seconds": elapsed,
            "measured_pods": pods - first, "pods_per_second": (pods - first) / elapsed,
            "attempt_p50_ms": 1000 * quantile(metrics, 0.5),
            "attempt_p99_ms": 1000 * quantile(metrics, 0.99), "cpu_s": cpu,
            "extender_calls": calls[1],
            "extender_ms_per_call": 1000 * calls[0] / calls[1] if calls[1] else None}


def summarise(runs: list[dict]) -> list[dict]:
    """Per setup: median pods/s with its spread over repetitions, and the ratios the targets
    use — to (a), to (a') and, for gpusteward, to the no-op extender in the same mode."""
    rates = {s.key: [r["pods_per_second"] for r in runs if r["setup"] == s.key] for s in SETUPS}
    median = {k: statistics.median(v) for k, v in rates.items() if v}
    rows = []
    for s in SETUPS:
        if s.key not in median:
            continue
        own = [r for r in runs if r["setup"] == s.key]
        row = {"setup": s.key, "label": s.label, "reps": len(own),
               "pods_per_second": median[s.key], "min": min(rates[s.key]),
               "max": max(rates[s.key]), "ratio_to_a": median[s.key] / median["a"],
               "ratio_to_a_prime": median[s.key] / median["a'"],
               "attempt_p50_ms": statistics.median(r["attempt_p50_ms"] for r in own),
               "attempt_p99_ms": statistics.median(r["attempt_p99_ms"] for r in own),
               "bound": min(r["bound"] for r in own), "pods": own[0]["pods"],
               "cpu_ms_per_pod": cpu_per_pod(own)}
        calls = [r["extender_ms_per_call"] for r in own if r.get("extender_ms_per_call")]
        if calls:
            row["extender_ms_per_call"] = statistics.median(calls)
        if s.key in FLOOR and FLOOR[s.key] in median:
            row["floor"] = FLOOR[s.key]
            row["ratio_to_floor"] = median[s.key] / median[FLOOR[s.key]]
        rows.append(row)
    return rows


def cpu_per_pod(runs: list[dict]) -> dict[str, float]:
    """Per sandbox process, the median over repetitions of its CPU ms per pod timed."""
    names = set().union(*(r.get("cpu_s", {}) for r in runs))
    return {name: statistics.median(1000 * r["cpu_s"].get(name, 0.0) / r["measured_pods"]
                                    for r in runs if "cpu_s" in r)
            for name in sorted(names)}


def merged(sizes: list[dict]) -> list[dict]:
    """This run's fleet sizes beside those an earlier run measured and this one did not."""
    path = RESULTS / "scheduler.json"
    earlier = json.loads(path.read_text())["sizes"] if path.exists() else []
    ran = {size["nodes"] for size in sizes}
    return sorted([*sizes, *(s for s in earlier if s["nodes"] not in ran)],
                  key=lambda size: size["nodes"])


def run(nodes: int, pods: int, reps: int, setups: tuple[Setup, ...]) -> dict:
    state = Path(tempfile.mkdtemp(prefix="gpusteward-bench-"))
    # At most 250 scrape targets a second (1,000 nodes every 5 s, 5,000 every 20 s): rendering
    # 8,000 simulated GPUs every second would eat a core by itself.
    scrape = max(5, nodes // 250)
    box = Sandbox(SandboxConfig(state_dir=state, fleet=fleet(nodes), with_extender=True,
                                policy=HERE / "policy.yaml", scrape_interval=f"{scrape}s",
                                log=lambda m: print(f"  {m}", flush=True))).start()
    runs = []
    try:
        floor_url = box.start_protocol_floor()
        for rep in range(reps):
            # Alternate the order, so a drift in the machine does not favour one setup.
            for setup in setups if rep % 2 == 0 else setups[::-1]:
                row = run_setup(box, setup, floor_url, pods)
                print(f"  rep {rep + 1} {setup.key:<3} {row['pods_per_second']:7.1f} pods/s",
                      flush=True)
                runs.append({**row, "rep": rep + 1})
    finally:
        box.stop()
    return {"nodes": nodes, "gpus": nodes * 8, "pods": pods, "date": time.strftime("%Y-%m-%d"),
            "scrape_s": scrape,
            "runs": runs, "summary": summarise(runs)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="1000,5000", help="comma-separated fleet sizes")
    # 400: the full-node setups bind 2-7 pods a second, so that is 1-3 minutes a repetition
    parser.add_argument("--pods", type=int, default=400)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="CI: tiny run, checks it works")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    if args.quick:
        sizes, args.pods, args.reps = [20], 40, 1
    report = {"machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores shared "
                         "by apiserver, etcd, scheduler, kwok, Prometheus, extender",
              "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "reps": args.reps,
              "sizes": [run(n, args.pods, args.reps, SETUPS) for n in sizes]}
    for size in report["sizes"]:
        print(f"{size['nodes']} nodes:")
        for r in size["summary"]:
            floor = (f"  /({r['floor']}) {r['ratio_to_floor']:.2f}" if "floor" in r else "")
            print(f"  ({r['setup']:<2}) {r['label']:<50} {r['pods_per_second']:7.1f} pods/s "
                  f"[{r['min']:.1f}–{r['max']:.1f}]  /(a) {r['ratio_to_a']:.2f}"
                  f"  /(a') {r['ratio_to_a_prime']:.2f}{floor}"
                  f"  ({r['bound']}/{r['pods']} bound)")
            if r["bound"] < r["pods"]:
                sys.exit(f"setup ({r['setup']}) bound only {r['bound']} of {r['pods']} pods")
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        report["sizes"] = merged(report["sizes"])
        (RESULTS / "scheduler.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
