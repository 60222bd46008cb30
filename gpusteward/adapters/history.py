"""The history a what-if replay steps through, read from Prometheus: kube-state-metrics' pod
series joined with the DCGM series by the one attribution rule (core/attribution.py).

Every query is a range query over a whole series set, one per kind of fact and time chunk, so
the number of queries is ``len(QUERIES) * chunks`` whatever the number of pods, GPUs or steps:

* per step (ranges covering ``(t - step, t]`` on every Prometheus major, see ``step_range``):
  which pods existed and on which node (``kube_pod_info``), their phase
  (``kube_pod_status_phase``), each GPU's peak and sample count, by the live reclaimer's
  own evidence PromQL at a window of one step (``adapters.snapshot.evidence_queries``), and
  each GPU's cumulative XID count per code (``DCGM_EXP_XID_ERRORS_TOTAL``, the XIDs the policy
  does not ignore), whose rises are the faults the replay holds for ``health.xidWindow``: read
  from ``health.xidWindow`` before the window, so that an XID just before it counts and a
  count that was there all along does not;
* once per chunk (``last_over_time`` over the chunk): GPU requests
  (``kube_pod_container_resource_requests``), owners (``kube_pod_owner``), allow-listed labels
  (``kube_pod_labels``), creation times (``kube_pod_created``), each GPU's model name, and,
  where a class has a minRuntime, start times (``kube_pod_start_time``).
"""

from __future__ import annotations

import re

from gpusteward.adapters.historyfold import Facts, ksm_resource
from gpusteward.adapters.promclient import PrometheusClient, is_left_closed
from gpusteward.adapters.promql import GPU_PLACE, exact_range, keeping, utilization, xid_matchers
from gpusteward.adapters.snapshot import evidence_queries
from gpusteward.core.dcgm import XID_TOTAL
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.rules import counts_runtime
from gpusteward.core.times import HOUR
from gpusteward.core.whatif.history import Grid, History, xid_steps

CHUNK = 6 * HOUR  # a range query's span: 360 points per series at a 60 s step

def queries(policy: Policy, step: float, chunk: float,
            left_closed: bool = False) -> dict[str, str]:
    s, c = exact_range(step, left_closed), f"{int(chunk + step)}s"
    resources = "|".join(re.escape(ksm_resource(r)) for r in policy.resources)
    words = policy.telemetry.vocabulary()
    peak, count = evidence_queries(step, policy.telemetry.node_labels, words, s)
    out = {
        "info": "max by (namespace, pod, uid, node, priority_class) "
                f"(max_over_time(kube_pod_info[{s}]))",
        "phase": 'max by (uid, phase) (max_over_time(kube_pod_status_phase'
                 f'{{phase=~"Pending|Running"}}[{s}])) == 1',
        "peak": peak,
        "count": count,
        # per GPU, not per pod: a pod arriving on a GPU with an old XID carries its count
        "xid": keeping([*policy.telemetry.node_labels, *GPU_PLACE, "xid"])
               + f"(last_over_time({XID_TOTAL}{{{', '.join(xid_matchers(policy.health))}}}"
                 f"[{s}]))",
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
    if counts_runtime(policy):
        out["started"] = f"max by (uid) (last_over_time(kube_pod_start_time[{c}]))"
    return out


PER_STEP = ("info", "phase", "peak", "count", "xid")


class HistoryReader:
    def __init__(self, prometheus: PrometheusClient, policy: Policy, chunk: float = CHUNK):
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
        lead = xid_steps(self.policy, self.step)  # XID history from one xidWindow before
        facts = Facts(grid, self.policy.telemetry.node_labels, -lead)
        for a in range(0, grid.steps, max(1, int(self.chunk // self.step))):
            b = min(grid.steps - 1, a + int(self.chunk // self.step) - 1)
            for name, promql in self.queries.items():
                first = a if name in PER_STEP else b
                if name == "xid" and a == 0:
                    first = -lead
                facts.add(name, await self.prometheus.query_matrix(
                    promql, grid.time(first), grid.time(b), self.step))
        return facts.history(self.policy)

