"""Which utilization series in percent are really ratios: a busy GPU read as a percent
(0.9 -> 0.9 %) would look idle, the one mistake the reclaimer must never make.

dcgm-exporter 4.9's exact default counters could not be confirmed (issue 26): an exporter, a
custom counters file or a recording rule may print a legacy percent name with DCGM 4.7's 0-1
value. Such a series never leaves [0, 1] while its GPU's graphics engine is visibly active
(utilization is the share of time any kernel runs, so it is at least engine activity). Those
series are doubted: the evidence of their GPUs is no reading (unknown, never idle) and counted.

The check costs a query over every GPU's window, so it runs at the first cycle and then every
``EVERY`` seconds: a series' unit is a property of the exporter's configuration, not of the
moment.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.promql import WHOLE_GPU, keeping
from gpusteward.core.vocabulary import SOURCE_LABEL, Concept, Unit, Vocabulary, marked

log = logging.getLogger("gpusteward.telemetry")

EVERY = 600.0
# Engine activity above this with utilization at most 1 "%" cannot be a percent.
ACTIVE = 0.05


def audit_query(vocabulary: Vocabulary, node_labels: Sequence[str], window: float) -> str | None:
    """The percent-named utilization series whose window stays within [0, 1] while their GPU's
    engine activity exceeds ACTIVE; None when no utilization name is in percent."""
    percent = [m for m in vocabulary.metrics[Concept.UTILIZATION] if m.unit is Unit.PERCENT]
    if not percent:
        return None
    w = f"{int(window)}s"
    gpu = ["UUID", "gpu", *node_labels]
    low = " or ".join(marked(f"max_over_time({m.name}{{{WHOLE_GPU}}}[{w}])", m.name)
                      for m in percent)
    engine = vocabulary.union(Concept.ENGINE_ACTIVITY, Unit.RATIO,
                              lambda s: f"max_over_time({s}[{w}])")
    return (f"({keeping([*gpu, SOURCE_LABEL])}({low}) <= 1) "
            f"and on ({', '.join(gpu)}) ({keeping(gpu)}({engine}) > {ACTIVE})")


class UnitAudit:
    def __init__(self, prometheus: PrometheusClient, node_labels: Sequence[str],
                 window: float):
        self.prometheus = prometheus
        self.query = audit_query(prometheus.vocabulary, node_labels, window)
        self.doubted: list[dict[str, Any]] = []
        self._at = -EVERY

    async def series(self, now: float) -> list[dict[str, Any]]:
        """The doubted series' labels, as of the last check (run now if it is due)."""
        if self.query is not None and now - self._at >= EVERY:
            self.doubted = [s["metric"] for s in await self.prometheus.query(self.query)]
            self._at = now
            if self.doubted:
                log.warning("%d utilization series named as percent read as 0-1 ratios while "
                            "their GPUs' engines are active; their GPUs are judged unknown "
                            "(set telemetry.metrics.utilization with unit ratio): %s",
                            len(self.doubted), self.doubted[:3])
        return self.doubted
