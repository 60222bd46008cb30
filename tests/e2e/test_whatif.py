"""What-if agrees with the real reclaimer: a scripted workload runs in the sandbox while the
reclaimer acts in enforce mode, cycle by cycle at its interval; then ``gpusteward whatif``
replays the same period from Prometheus alone (kube-state-metrics' pod series from the
sandbox's stand-in, the simulator's DCGM series) with the same policy, and must name the same
workloads, reclaim them within one cycle of the real times, and count the same GPU-hours (within
5 %). A policy with a longer window frees fewer.
"""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from gpusteward.adapters.policyfile import load_policy
from tests.e2e.kube import gone, gpu_pod, wait_for_gpu_samples
from tests.e2e.scenarios import in_namespace, whatif

INTERVAL = 5.0
POLICY = """\
resources: [nvidia.com/gpu]
telemetry: {{refresh: 1s, staleAfter: 15s, scrapeInterval: 1s, queryTimeout: 5s}}
reclaim:
  mode: enforce
  interval: 5s
  idle: {{thresholdPercent: 5, window: {window}, minCoverage: 0.7, grace: 10s}}
  minPodAge: 5s
  limits: {{maxPerCycle: 20, maxPerHour: 500, maxPerTeamPerHour: 200}}
  evictionGrace: 1s
queue: {{enabled: false}}
"""
TEAM = {"gpusteward.io/team": "vision"}
RUN_S = 240  # long enough that one cycle is under 5 % of what a reclaim frees


def job(ns, name: str, util: str) -> None:
    template = gpu_pod("x", 1, util=util, labels=TEAM)
    template["spec"]["restartPolicy"] = "Never"
    ns.api.create(f"/apis/batch/v1/namespaces/{ns.name}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"template": {"metadata": template["metadata"], "spec": template["spec"]}}})


def deployment(ns, name: str, util: str) -> None:
    pod = gpu_pod("x", 1, util=util, labels={**TEAM, "app": name})
    ns.api.create(f"/apis/apps/v1/namespaces/{ns.name}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": pod["metadata"], "spec": pod["spec"]}}})


def workload(ns) -> None:
    ns.create_pod(gpu_pod("idle", 1, util="0", labels=TEAM))
    ns.create_pod(gpu_pod("late", 2, util="90:40s,0:10m", labels=TEAM))  # idle after 40 s
    ns.create_pod(gpu_pod("busy", 1, util="80", labels=TEAM))
    job(ns, "batch", "0")
    deployment(ns, "serve", "0")


async def live(rec, seconds: float) -> dict[str, float]:
    """Cycle at the policy's interval; pod key -> when its reclaim was decided."""
    reclaimed: dict[str, float] = {}
    tick = time.monotonic()
    deadline = tick + seconds
    while time.monotonic() < deadline:
        at = time.time()
        plan = await asyncio.wait_for(rec.cycle(), 60)
        for a in plan.actions:
            if a.kind == "reclaim":
                for pod in (a.pod, *a.peers):
                    reclaimed.setdefault(pod.key, at)
        tick += INTERVAL
        await asyncio.sleep(max(0.0, tick - time.monotonic()))
    return reclaimed


async def test_whatif_names_the_workloads_times_and_gpu_hours_the_reclaimer_freed(
        sandbox, ns, reclaimer, tmp_path):
    short, longer = tmp_path / "short.yaml", tmp_path / "longer.yaml"
    short.write_text(POLICY.format(window="20s"))
    longer.write_text(POLICY.format(window="60s"))
    start = float(math.floor(time.time()))
    workload(ns)
    rec = await reclaimer("enforce", policy=load_policy(short))
    reclaimed = await live(rec, RUN_S)
    # bare pods by name; the Job's and the Deployment's pods by their workload's
    assert {k.split("/")[1].split("-")[0] for k in reclaimed} == {
        "idle", "late", "batch", "serve"}, reclaimed
    assert gone(ns, "idle") and gone(ns, "late")
    wait_for_gpu_samples(sandbox.prometheus_url, ns.name, ["busy"], settle=0)
    time.sleep(3)  # the last scrapes land
    end = start + INTERVAL * math.floor((time.time() - 2 - start) / INTERVAL)

    same, long = whatif(sandbox, start, end, short, longer)
    replayed = in_namespace(same, ns.name)
    assert set(replayed) == set(reclaimed), (replayed, reclaimed)
    for pod, at in reclaimed.items():
        assert abs(replayed[pod]["at"] - at) <= INTERVAL, (pod, replayed[pod]["at"], at)
    real_hours = sum(r["gpus"] * (end - reclaimed[p]) / 3600 for p, r in replayed.items())
    replay_hours = sum(r["gpu_hours"] for r in replayed.values())
    assert replay_hours == pytest.approx(real_hours, rel=0.05)
    longer_hours = sum(r["gpu_hours"] for r in in_namespace(long, ns.name).values())
    assert longer_hours < replay_hours
