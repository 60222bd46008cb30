"""The reclaimer's Prometheus metrics. Labels are team, card, stage, action, reason, result —
never a pod, so cardinality stays bounded by the fleet's shape, not its churn."""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpusteward.adapters import buildinfo
from gpusteward.core.reclaim.model import RECLAIM_AT, Plan, Snapshot, VerdictState
from gpusteward.core.reclaim.quota import team
from gpusteward.core.sharing import pod_share


class ReclaimerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        buildinfo.register(r)
        self.gpus = Gauge("gpusteward_gpus", "Physical GPUs held by running pods (a MIG slice or a "
                          "time-sliced replica counts as its share of the card), by team, card "
                          "and state (allocated; of those idle, unknown: no evidence either way, "
                          "faulty: on a GPU a health source calls faulty).",
                          ["team", "card", "state"], registry=r)
        self.pods = Gauge("gpusteward_reclaimer_pods", "GPU pods by reclaim stage.", ["stage"],
                          registry=r)
        self.actions = Counter("gpusteward_reclaimer_actions_total",
                               "Reclaimer actions by kind, reason, team and result "
                               "(result 'skipped' = not carried out in this mode).",
                               ["action", "reason", "team", "result"], registry=r)
        self.cycle = Histogram("gpusteward_reclaimer_cycle_duration_seconds",
                               "Time for one read-decide-act cycle.", registry=r,
                               buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60))
        self.cycles = Counter("gpusteward_reclaimer_cycles_total",
                              "Cycles by result (ok, halted: no telemetry, fenced: a write "
                              "refused by the Lease's deadline stopped it, error).", ["result"],
                              registry=r)
        self.idle_seconds = Counter("gpusteward_idle_gpu_seconds_total",
                                    "GPU-seconds held idle, by team.", ["team"], registry=r)
        self.pending = Gauge("gpusteward_pending_gpu_pods", "Pending GPU pods, by team.",
                             ["team"], registry=r)
        self.pending_wait = Gauge("gpusteward_pending_gpu_pod_max_wait_seconds",
                                  "Longest wait of a pending GPU pod, by team.", ["team"],
                                  registry=r)
        self.telemetry_ok = Gauge("gpusteward_reclaimer_telemetry_ok",
                                  "1 when telemetry was fresh in the last cycle.", registry=r)
        self.doubted = Gauge("gpusteward_reclaimer_telemetry_series_doubted",
                             "Utilization series named as percent that read as 0-1 ratios "
                             "while their GPUs' engines are active: their GPUs are unknown.",
                             registry=r)
        self.leader = Gauge("gpusteward_reclaimer_leader", "1 while this replica leads.",
                            registry=r)
        self.held_back = Counter("gpusteward_reclaimer_held_back_total",
                                 "Reclaims a limit or an in-progress action held back.",
                                 registry=r)
        self.ledger_errors = Counter("gpusteward_reclaimer_ledger_errors_total",
                                     "Failed writes of the per-hour reclaim count to its "
                                     "ConfigMap (retried after the next cycle).", registry=r)
        self.fenced = Counter("gpusteward_reclaimer_fenced_actions_total",
                              "Writes not carried out because this replica could not confirm "
                              "it holds the Lease or the API server refused the write on its "
                              "resourceVersion, HTTP 409 (why=fenced), or the decision no "
                              "longer matched the cluster (why=stale).", ["why"], registry=r)
        self.restores = Counter("gpusteward_reclaimer_restores_total",
                                "Self-service restore requests (gpusteward.io/restore) by team "
                                "and result (restored, refused, stale, skipped, error).",
                                ["team", "result"], registry=r)
        self.notices = Counter("gpusteward_notifications_total",
                               "Notifications by sink, event (warned, reclaimed, blocked, "
                               "restored) and result (sent; failed: given up after "
                               "notifications.retryFor; dropped: the queue was full).",
                               ["sink", "event", "result"], registry=r)
        self.notice_errors = Counter("gpusteward_notification_attempt_failures_total",
                                     "Delivery attempts a receiver did not take (no answer in "
                                     "time, not 2xx, unreachable); retried with backoff.",
                                     ["sink"], registry=r)
        self.notices_pending = Gauge("gpusteward_notifications_pending",
                                     "Notifications waiting for delivery, by sink.", ["sink"],
                                     registry=r)
        self.notice_record_errors = Counter(
            "gpusteward_notification_record_errors_total",
            "Failed writes of the notification record (<lease>-notifications); without it a "
            "failover could send a message twice or not at all.", registry=r)

    def observe(self, snap: Snapshot, plan: Plan, interval: float) -> None:
        self.telemetry_ok.set(1 if snap.telemetry_ok else 0)
        self.doubted.set(snap.doubted_series)
        self.held_back.inc(len(plan.held_back))
        self._pending(snap)
        if plan.halted:
            return  # no verdicts this cycle: keep the last counts rather than read zero
        cards = {n.name: n.product or "unknown" for n in snap.nodes.values()}
        gpus: dict[tuple[str, str, str], float] = {}
        stages: Tally[str] = Tally()
        by_key = {p.key: p for p in snap.pods}
        for v in plan.verdicts:
            pod = by_key[v.pod]
            card = cards.get(pod.node or "", "unknown")
            held = pod_share(pod, snap.nodes.get(pod.node or ""))
            gpus[(v.team, card, "allocated")] = gpus.get((v.team, card, "allocated"), 0.0) + held
            if v.state in (VerdictState.IDLE, VerdictState.UNKNOWN, VerdictState.FAULTY):
                gpus[(v.team, card, v.state)] = gpus.get((v.team, card, v.state), 0.0) + held
            if v.state == VerdictState.IDLE:
                self.idle_seconds.labels(v.team).inc(held * interval)
            stages["snoozed" if v.snoozed_until is not None else
                   "warned" if v.state == VerdictState.IDLE and RECLAIM_AT in pod.annotations
                   else v.state] += 1
        self.gpus.clear()
        for (owner, card, state), n in gpus.items():
            self.gpus.labels(owner, card, state).set(n)
        self.pods.clear()
        for stage, n in stages.items():
            self.pods.labels(stage).set(n)

    def _pending(self, snap: Snapshot) -> None:
        count: Tally[str] = Tally()
        wait: dict[str, float] = {}
        for p in snap.pods:
            if p.node is None and not p.deleting:
                t = team(p, snap.namespace_labels)
                count[t] += 1
                wait[t] = max(wait.get(t, 0.0), snap.now - p.created_at)
        self.pending.clear()
        self.pending_wait.clear()
        for t, n in count.items():
            self.pending.labels(t).set(n)
            self.pending_wait.labels(t).set(wait[t])
