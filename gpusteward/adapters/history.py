"""The history a what-if replay steps through, read from Prometheus: kube-state-metrics' pod
series joined with the DCGM series by the one attribution rule (core/attribution.py).

Every query is a range query over a whole series set, one per kind of fact and time chunk, so
the number of queries is ``len(QUERIES) * chunks`` whatever the number of pods, GPUs or steps:

* per step (ranges covering ``(t - step, t]`` on every Prometheus major, see ``step_range``):
  which pods existed and on which node (``kube_pod_info``), their phase
  (``kube_pod_status_phase``), and each GPU's peak and sample count, by the live reclaimer's
  own evidence PromQL at a window of one step (``adapters.snapshot.evidence_queries``);
* once per chunk (``last_over_time`` over the chunk): GPU requests
  (``kube_pod_container_resource_requests``), owners (``kube_pod_owner``), allow-listed labels
  (``kube_pod_labels``), creation times (``kube_pod_created``) and each GPU's model name.
"""

from __future__ import annotations

import re

from gpusteward.adapters.historyfold import Facts, ksm_resource
from gpusteward.adapters.prometheus import PrometheusSource, keeping, utilization
from gpusteward.adapters.snapshot import evidence_queries
from gpusteward.core.policy import Policy
from gpusteward.core.times import HOUR
from gpusteward.core.whatif.history import Grid, History

CHUNK = 6 * HOUR  # a range query's span: 360 points per series at a 60 s step

# Whether Prometheus's windows include a sample at their start. Prometheus 3 made range
# selectors left-open: ``x[60s]`` at t holds the samples in (t - 60s, t], 2.x's holds
# [t - 60s, t] (Prometheus 3.0 migration guide, "Range selectors and lookback exclude samples
# coinciding with the left boundary"; CHANGELOG 3.0.0, #13904); subqueries followed in 3.0.1
# (CHANGELOG 3.0.1, #15431: ``x[30m:1m]`` yields 30 points, not 31). This subquery of a 1 ms
# window at a 1 ms resolution is evaluated at t and, left-closed, at t - 1 ms too: 2 on 2.x,
# 1 from 3.0.1 on. (3.0.0 alone, left-open ranges but left-closed subqueries, reads as 2.x and
# then misses a sample exactly 1 ms after a step's start.)
LEFT_CLOSED_PROBE = "count_over_time(vector(1)[1ms:1ms])"


def step_range(step: float, left_closed: bool) -> str:
    """A range selector covering exactly (t - step, t] (timestamps are whole milliseconds): the
    steps partition time, as core.whatif.history's sliding window sums require. On a
    left-closed (2.x) Prometheus one millisecond shorter, so a sample at the start of a step,
    which step-aligned scrapes put there, is counted once, in the step before, as on 3.x."""
    return f"{int(step * 1000) - 1}ms" if left_closed else f"{int(step)}s"


async def is_left_closed(prometheus: PrometheusSource) -> bool:
    (sample,) = await prometheus.query(LEFT_CLOSED_PROBE)
    return float(sample["value"][1]) > 1


def queries(policy: Policy, step: float, chunk: float,
            left_closed: bool = False) -> dict[str, str]:
    s, c = step_range(step, left_closed), f"{int(chunk + step)}s"
    resources = "|".join(re.escape(ksm_resource(r)) for r in policy.resources)
    words = policy.telemetry.vocabulary()
    peak, count = evidence_queries(step, policy.telemetry.node_labels, words, s)
    return {
        "info": "max by (namespace, pod, uid, node, priority_class) "
                f"(max_over_time(kube_pod_info[{s}]))",
        "phase": 'max by (uid, phase) (max_over_time(kube_pod_status_phase'
                 f'{{phase=~"Pending|Running"}}[{s}])) == 1',
        "peak": peak,
        "count": count,
        # summed over containers; the series of one pod before and after binding differ in
        # their node label, so the largest of those sums
        "gpus": f'max by (uid, resource) (sum by (uid, resource, node) (last_over_time('
                f'kube_pod_container_resource_requests{{resource=~"{resources}"}}[{c}])))',
        "owner": 'max by (uid, owner_kind, owner_name) (last_over_time(kube_pod_owner'
                 f'{{owner_is_controller="true"}}[{c}]))',
        "labels": f"last_over_time(kube_pod_labels[{c}])",
        "created": f"max by (uid) (last_over_time(kube_pod_created[{c}]))",
        "model": keeping(["UUID", "gpu", "GPU_I_ID", "modelName", *policy.telemetry.node_labels])
                 + utilization(words, None, lambda m: f"last_over_time({m}[{c}])"),
    }


PER_STEP = ("info", "phase", "peak", "count")


class HistoryReader:
    def __init__(self, prometheus: PrometheusSource, policy: Policy, chunk: float = CHUNK):
        self.prometheus = prometheus
        self.policy = policy
        self.step = float(policy.reclaim.interval)
        self.chunk = max(chunk, self.step)
        self.queries = queries(policy, self.step, self.chunk)
        self._probed = False

    async def read(self, start: float, end: float) -> History:
        if not self._probed:
            self.queries = queries(self.policy, self.step, self.chunk,
                                   await is_left_closed(self.prometheus))
            self._probed = True
        grid = Grid(start, self.step, int((end - start) // self.step) + 1)
        facts = Facts(grid, self.policy.telemetry.node_labels)
        for a in range(0, grid.steps, max(1, int(self.chunk // self.step))):
            b = min(grid.steps - 1, a + int(self.chunk // self.step) - 1)
            for name, promql in self.queries.items():
                first = a if name in PER_STEP else b
                facts.add(name, await self.prometheus.query_matrix(
                    promql, grid.time(first), grid.time(b), self.step))
        return facts.history(self.policy)

