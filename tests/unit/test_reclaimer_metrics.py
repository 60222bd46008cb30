"""The reclaimer's GPU gauges: unknown GPUs apart from idle ones, and a cycle halted for stale
telemetry keeps the last counts (the dashboard read "0 allocated" during every outage)."""

from __future__ import annotations

from gpusteward.core.reclaim.decide import plan
from gpusteward.reclaimer.metrics import ReclaimerMetrics
from tests.unit.test_reclaim_decide import POLICY, gpu_pod, idle, snapshot


def _gpus(metrics: ReclaimerMetrics) -> dict[str, float]:
    return {s.labels["state"]: s.value for f in metrics.registry.collect()
            if f.name == "gpusteward_gpus" for s in f.samples}


def test_unknown_gpus_are_counted_apart_from_idle_ones() -> None:
    pods = [gpu_pod("idle", gpus=2), gpu_pod("busy", gpus=1), gpu_pod("dark", gpus=4)]
    snap = snapshot(pods, {"ml/idle": idle(gpus=2), "ml/busy": idle(peak=80.0)})
    metrics = ReclaimerMetrics()
    metrics.observe(snap, plan(snap, POLICY), 60.0)
    assert _gpus(metrics) == {"allocated": 7.0, "idle": 2.0, "unknown": 4.0}


def test_a_halted_cycle_keeps_the_last_counts() -> None:
    pods = [gpu_pod("idle", gpus=2)]
    metrics = ReclaimerMetrics()
    ok = snapshot(pods)
    metrics.observe(ok, plan(ok, POLICY), 60.0)
    stale = snapshot(pods, telemetry_ok=False)
    halted = plan(stale, POLICY)
    assert halted.halted
    metrics.observe(stale, halted, 60.0)
    assert _gpus(metrics) == {"allocated": 2.0, "idle": 2.0}
    telemetry_ok = [s.value for f in metrics.registry.collect()
                    if f.name == "gpusteward_reclaimer_telemetry_ok" for s in f.samples]
    assert telemetry_ok == [0.0]
