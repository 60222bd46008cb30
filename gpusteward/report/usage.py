"""Read what the fleet report needs: the reclaimer's Snapshot (SnapshotReader) and per-GPU
utilization over the report window from one range query — split by time into a fixed number of
chunks when the window holds more points than Prometheus answers at once — whatever the fleet size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpusteward.adapters.errors import TelemetryUnavailable
from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.promql import per_pod_util, utilization
from gpusteward.adapters.snapshot import SnapshotReader
from gpusteward.core.attribution import Attribution, is_per_pod
from gpusteward.core.dcgm import gpu_id
from gpusteward.core.policy import Policy
from gpusteward.core.report.model import ReportInput, Series, Window
from gpusteward.core.vocabulary import Unit, Vocabulary

MAX_POINTS = 10_000  # Prometheus refuses more than 11,000 points per series in one query
Progress = Callable[[int, int], None]  # (range queries done, range queries in all)


def utilization_query(step: float, scrape_interval: float,
                      vocabulary: Vocabulary | None = None) -> str:
    """Peak utilization % per slot, under any of its names (a GPU's names joined by
    ``series``): the lookback spans two scrapes, so no slot falls between them."""
    look = f"{int(max(step, 2 * scrape_interval))}s"

    def peak(metric: str) -> str:
        return f"max_over_time({metric}[{look}])"

    return (utilization(vocabulary or Vocabulary(), Unit.PERCENT, peak) + " or "
            + per_pod_util(peak))


def chunks(window: Window) -> list[tuple[float, float]]:
    """(first slot, last slot) of each range query, slots being window.slots."""
    slots = window.slots
    n = math.ceil(len(slots) / MAX_POINTS)
    size = math.ceil(len(slots) / n)
    return [(slots[i], slots[min(i + size, len(slots)) - 1]) for i in range(0, len(slots), size)]


class UsageReader:
    def __init__(self, snapshots: SnapshotReader, prometheus: PrometheusClient, policy: Policy):
        self.snapshots = snapshots
        self.prometheus = prometheus
        self.policy = policy

    async def read(self, window: float, step: float,
                   progress: Progress = lambda done, total: None) -> ReportInput:
        snap = await self.snapshots.read()
        end = float(math.floor(snap.now))
        grid = Window(start=end - window, end=end, step=step)
        query = utilization_query(step, float(self.policy.telemetry.scrape_interval),
                                  self.prometheus.vocabulary)
        parts = chunks(grid)
        results: list[dict[str, Any]] = []
        progress(0, len(parts))
        try:
            for i, (first, last) in enumerate(parts):
                results += await self.prometheus.query_range(query, first, last, step)
                progress(i + 1, len(parts))
        except TelemetryUnavailable as e:
            return ReportInput(snap, grid, (), range_ok=False, range_problem=str(e))
        who = self.snapshots.who or self.snapshots.attribution(snap.nodes, snap.pods)
        return ReportInput(snap, grid, tuple(series(results, who)))


def series(results: Sequence[Mapping[str, Any]], who: Attribution) -> list[Series]:
    """Pod-attributed GPU series, one per (pod, GPU), chunks joined; free GPUs and pods the API
    server does not show holding GPUs there are left out. On a shared GPU a pod's own per-pod
    series stand for it (see core.attribution)."""
    points: dict[tuple[str, str, str], dict[bool, dict[float, float]]] = {}
    for s in results:
        labels = s["metric"]
        node = who.node(labels) or ""
        pod = who.pod(labels, node)
        if pod is None:
            continue
        kinds = points.setdefault((pod, node, gpu_id(labels)), {})
        merged = kinds.setdefault(is_per_pod(labels), {})
        for t, v in s["values"]:  # one GPU in several series: its peak
            merged[float(t)] = max(float(v), merged.get(float(t), 0.0))
    return [Series(pod, node, gpu, tuple(sorted((k.get(True) or k[False]).items())))
            for (pod, node, gpu), k in sorted(points.items())]
