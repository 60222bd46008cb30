"""Scenarios that must hold whichever source feeds GPU telemetry and whichever way Prometheus
stores it: the DCGM simulator scraped as dcgm-exporter's ServiceMonitor does, honorLabels false
(test_placement, test_reclaim, test_report), or one NVML agent per node scraped as our agent's
ServiceMonitor does, honorLabels true (test_agent_telemetry).

Default sandbox fleet: h100-0/1 (8 GPUs each), a100-0/1 (8), l4-0/1/2 (4), t4-0 (2 T4s time-sliced
4 ways, tainted), a100-mig-0 (2 A100s as 14 MIG 1g.10gb slices).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from gpusteward.core.reclaim.model import FAULTY_GPU, IDLE_SINCE, RECLAIM_AT
from gpusteward.core.times import stamp
from gpusteward.reclaimer.loop import Reclaimer
from gpusteward.sandbox.cluster import SANDBOX_POLICY, Sandbox
from gpusteward.sandbox.fleet import XID_LABEL
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e.kube import (
    Namespace,
    annotations,
    cycle_until,
    events,
    gone,
    gpu_pod,
    reasons,
    set_util,
    wait_for_gpu_samples,
)

H100S, A100S, L4S = {"h100-0", "h100-1"}, {"a100-0", "a100-1"}, {"l4-0", "l4-1", "l4-2"}


def pods_land_only_on_cards_they_accept_in_preference_order(box: Sandbox,
                                                           ns: Namespace) -> None:
    # 4-GPU pods preferring A100 over H100: A100s hold 4 of them, the rest spill to H100s.
    for i in range(6):
        ns.create_pod(gpu_pod(f"p{i}", 4, cards="NVIDIA-A100*,NVIDIA-H100*", cls="batch"))
        ns.node_of(f"p{i}")  # one at a time, so the order is the preference order
        # ... and each judged on its predecessors' samples: within telemetry.podWarmup a new
        # pod counts as fully busy, which made a half-full A100 look hotter than an empty H100.
        wait_for_gpu_samples(box.prometheus_url, ns.name, [f"p{i}"])
    nodes = [ns.pod(f"p{i}")["spec"]["nodeName"] for i in range(6)]
    assert set(nodes[:4]) <= A100S, nodes
    assert set(nodes[4:]) <= H100S, nodes
    # An L4-only pod never lands on the big cards, even though they have room.
    ns.create_pod(gpu_pod("small", 1, cards="NVIDIA-L4"))
    assert ns.node_of("small") in L4S


def a_burst_does_not_all_land_on_the_node_that_looked_idlest(box: Sandbox,
                                                             ns: Namespace) -> None:
    # Both H100s hold 4 busy GPUs; h100-0's read 0 %, h100-1's 40 %: h100-0 looks idlest.
    ns.create_pod(gpu_pod("load-0", 4, node="h100-0", util="0"))
    ns.create_pod(gpu_pod("load-1", 4, node="h100-1", util="40"))
    ns.running("load-0")
    ns.running("load-1")
    wait_for_gpu_samples(box.prometheus_url, ns.name, ["load-0", "load-1"])
    for i in range(4):  # all at once
        ns.create_pod(gpu_pod(f"burst-{i}", 1, cards="NVIDIA-H100*", cls="interactive"))
    placed = Counter(ns.node_of(f"burst-{i}") for i in range(4))
    assert set(placed) <= H100S
    assert placed["h100-0"] < 4, f"{placed}; the extender ranked:\n{rankings(box, ns)}"


def rankings(box: Sandbox, ns: Namespace) -> str:
    """The extender's debug line for each prioritize answer about a pod of ``ns``: what each
    node's score counted (the sandbox runs it at debug)."""
    logs = box.dir / "logs"  # one extender, or replicas (extender/0.log, ...)
    lines = [line for log in sorted([*logs.glob("extender*.log"), *logs.glob("extender/*.log")])
             for line in log.read_text().splitlines() if f" ranked {ns.name}/" in line]
    return "\n".join(lines) or "(nothing: no prioritize answer about these pods)"


def spread_class_prefers_the_cooler_node(box: Sandbox, ns: Namespace) -> None:
    for node, util in (("l4-0", "95"), ("l4-1", "5"), ("l4-2", "60")):
        ns.create_pod(gpu_pod(f"load-{node}", 2, node=node, util=util))
    for node in ("l4-0", "l4-1", "l4-2"):
        ns.running(f"load-{node}")
    wait_for_gpu_samples(box.prometheus_url, ns.name, [f"load-{n}" for n in sorted(L4S)])
    ns.create_pod(gpu_pod("serve", 1, cards="NVIDIA-L4", cls="inference"))
    assert ns.node_of("serve") == "l4-1"


def filter_passes(box: Sandbox, node: str, gpus: int = 8) -> bool:
    """Whether the extender's filter keeps ``node`` for a pod of ``gpus`` GPUs."""
    body = json.dumps({"Pod": gpu_pod("probe", gpus), "NodeNames": [node]}).encode()
    req = urllib.request.Request(f"{box.extender_url}/filter", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return bool(json.load(resp)["NodeNames"] == [node])


@contextmanager
def broken(box: Sandbox, node: str, xid: int = 79) -> Iterator[str]:
    """Every GPU of ``node`` reports ``xid`` (79: fell off the bus) until the block ends."""
    api, path = box.api(), f"/api/v1/nodes/{node}"
    api.merge_patch(path, {"metadata": {"labels": {XID_LABEL: str(xid)}}})
    try:
        yield node
    finally:
        api.merge_patch(path, {"metadata": {"labels": {XID_LABEL: None}}})
        # The XID stays "recent" for the policy's xidWindow; wait until the extender forgets it.
        wait_for(f"{node} healthy again", lambda: filter_passes(box, node), timeout=90)


def an_unhealthy_node_receives_no_new_gpu_pods(box: Sandbox, ns: Namespace,
                                                xid: int = 79) -> None:
    with broken(box, "h100-1", xid) as node:
        wait_for("the extender to see the XID", lambda: not filter_passes(box, node),
                 timeout=30)
        for i in range(4):
            ns.create_pod(gpu_pod(f"p{i}", 2, cards="NVIDIA-H100*"))
        assert {ns.node_of(f"p{i}") for i in range(4)} == {"h100-0"}


async def an_idle_pod_is_warned_then_evicted(ns: Namespace, rec: Reclaimer,
                                             node: str = "h100-0") -> None:
    ns.create_pod(gpu_pod("idle", 1, node=node, util="0"))
    ns.running("idle")
    await cycle_until(rec, "idle mark", lambda: IDLE_SINCE in annotations(ns, "idle"))
    await cycle_until(rec, "warning", lambda: RECLAIM_AT in annotations(ns, "idle"))
    assert not gone(ns, "idle")
    await cycle_until(rec, "eviction", lambda: gone(ns, "idle"))
    assert {"GPUIdle", "GPUIdleWarning", "GPUReclaimed"} <= set(reasons(ns, "idle"))


async def the_faulty_pod_stays_and_its_idle_neighbour_goes(ns: Namespace, rec: Reclaimer,
                                                           fault: str) -> None:
    """"broken" and "beside", both idle and due: the reclaimer evicts "beside" and leaves
    "broken", whose GPU is faulty (``fault``: words of its fault), noted once, unmarked."""
    await cycle_until(rec, "the idle neighbour evicted", lambda: gone(ns, "beside"))
    assert not gone(ns, "broken")
    marks = annotations(ns, "broken")
    assert fault in marks.get(FAULTY_GPU, ""), marks
    assert IDLE_SINCE not in marks and RECLAIM_AT not in marks
    noted = [m for reason, m in events(ns, "broken") if reason == "GPUFaulty"]
    assert len(noted) == 1 and fault in noted[0], noted


def whatif(sandbox: Sandbox, start: float, end: float, *policies: Path) -> list[dict]:
    """``gpusteward whatif`` over [start, end] of the sandbox's Prometheus: its JSON outcomes."""
    out = subprocess.run(
        [sys.executable, "-m", "gpusteward", "whatif", *(f"--policy={p}" for p in policies),
         f"--window={int(end - start)}s", f"--end={stamp(end)}", "--format=json",
         f"--prometheus-url={sandbox.prometheus_url}"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout)["policies"])


def in_namespace(outcome: dict, ns: str) -> dict[str, dict]:
    return {r["pod"]: r for r in outcome["reclaimed"] if r["pod"].startswith(f"{ns}/")}


def due_pod(name: str, **kw) -> dict:
    """An idle pod already marked and warned, its deadline passed: the next idle cycle acts."""
    marks = {IDLE_SINCE: stamp(time.time() - 60), RECLAIM_AT: stamp(time.time() - 1)}
    return gpu_pod(name, 1, util="0", annotations=marks, **kw)


async def a_busy_pod_is_left_alone_and_its_marks_cleared(ns: Namespace, rec: Reclaimer,
                                                         node: str = "h100-0") -> None:
    ns.create_pod(due_pod("busy", node=node))
    set_util(ns, ["busy"], "80")
    ns.running("busy")
    # A pod younger than minPodAge is protected, and protection clears marks too: wait it out,
    # so that what clears them here is the pod's activity.
    await asyncio.sleep(float(rec.policy.reclaim.min_pod_age) + 1)
    await cycle_until(rec, "marks cleared", lambda: IDLE_SINCE not in annotations(ns, "busy"))
    assert not gone(ns, "busy")
    cleared = [message for reason, message in events(ns, "busy") if reason == "GPUActive"]
    assert any("peak 80%" in m for m in cleared), cleared


WINDOW_S = 20
PREMIUM, ECONOMY = 90.0, 36.0  # $ per GPU-hour: 20 s of one GPU costs 0.50 and 0.20
HARNESS = ("import argparse, sys\n"
           "from gpusteward.report.cli import add_report_flags\n"
           "from gpusteward.report.run import run_report\n"
           "p = argparse.ArgumentParser(prog='gpusteward')\n"
           "add_report_flags(p.add_subparsers(dest='command').add_parser('report'))\n"
           "sys.exit(run_report(p.parse_args(sys.argv[1:])))\n")


class Workload:
    def __init__(self, sandbox, ns: Namespace, team: str, policy: Path):
        self.sandbox, self.ns, self.team, self.policy = sandbox, ns, team, policy

    def report(self, *flags: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-c", HARNESS, "report", f"--policy={self.policy}",
               f"--window={WINDOW_S}s", "--step=1s", f"--kubeconfig={self.sandbox.kubeconfig}",
               f"--prometheus-url={self.sandbox.prometheus_url}", *flags]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out

    def json(self, by: str) -> dict:
        return json.loads(self.report("--format=json", f"--by={by}").stdout)


@contextmanager
def report_workload(sandbox: Sandbox, tmp: Path) -> Iterator[Workload]:
    """The report's known workload on ``sandbox``, running for the whole window."""
    team = f"report-{secrets.token_hex(3)}"
    policy = yaml.safe_load(SANDBOX_POLICY.read_text())
    policy["cardTiers"] = [
        {"name": "premium", "products": ["NVIDIA-H100*"], "costPerGpuHour": PREMIUM},
        {"name": "standard", "products": ["NVIDIA-A100*"]},
        {"name": "economy", "products": ["NVIDIA-L4"], "costPerGpuHour": ECONOMY}]
    policy["teams"][team] = {"quotaGpus": 2}
    path = tmp / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    ns = Namespace(sandbox.api(), team)
    ns.create()
    labels = {"gpusteward.io/team": team}
    ns.create_pod(gpu_pod("busy", 2, node="h100-0", util="80", labels=labels))
    ns.running("busy")
    time.sleep(1.5)  # created a second before the others: it holds the quota, they borrow
    ns.create_pod(gpu_pod("idle", 1, node="h100-0", util="0", labels=labels))
    ns.create_pod(gpu_pod("cheap", 1, node="l4-0", util="0", labels=labels))
    ns.create_pod(gpu_pod("waiting", 9, labels=labels))  # no node has 9 GPUs: it queues
    for name in ("busy", "idle", "cheap"):
        ns.running(name)
    wait_for_gpu_samples(sandbox.prometheus_url, team, ["busy", "idle", "cheap"], settle=0)
    time.sleep(WINDOW_S + 4)  # the whole window after the pods started, plus scrape slack
    try:
        yield Workload(sandbox, ns, team, path)
    finally:
        ns.delete()


def hours(gpus: float) -> float:
    return round(gpus * WINDOW_S / 3600, 4)


def a_known_workload_gives_exact_numbers_by_team(workload: Workload) -> None:
    doc = workload.json("team")
    assert doc["telemetry"] == {"ok": True, "problem": ""}
    (mine,) = [g for g in doc["groups"] if g["name"] == workload.team]
    assert {k: mine[k] for k in ("allocatable", "allocated", "used", "idle", "unknown", "free",
                                 "active_ratio", "allocated_gpu_hours", "idle_gpu_hours",
                                 "unknown_gpu_hours", "idle_cost")} == {
        "allocatable": None, "allocated": 4.0, "used": 2.0, "idle": 2.0, "unknown": 0.0,
        "free": None, "active_ratio": 0.5, "allocated_gpu_hours": hours(4),
        "idle_gpu_hours": hours(2), "unknown_gpu_hours": 0.0, "idle_cost": 0.7}
    assert mine["mean_util_percent"] == 40.0  # 2 GPUs at 80 %, 2 at 0 %
    idle = {p["pod"]: p for p in doc["top_idle_pods"] if p["namespace"] == workload.team}
    assert set(idle) == {"idle", "cheap"}
    assert idle["idle"]["idle_cost"] == 0.5 and idle["cheap"]["idle_cost"] == 0.2
    for p in idle.values():
        assert (p["owner"], p["state"], p["idle_gpu_hours"]) == (
            f"Pod/{p['pod']}", "idle", hours(1))
        assert p["reclaimer"]["state"] == "idle" and p["reclaimer"]["action"] == "mark"
        assert "peak 0% < 5%" in p["reclaimer"]["why"]
    (queued,) = [g for g in doc["queue"]["by_team_class"] if g["team"] == workload.team]
    assert (queued["class"], queued["pods"], queued["gpus"]) == ("batch", 1, 9)
    (quota,) = [q for q in doc["quotas"] if q["team"] == workload.team]
    assert quota == {"team": workload.team, "quota": 2, "used": 4.0, "borrowed": 2.0,
                     "idle_within_quota": 0.0, "idle_borrowed": 2.0}
