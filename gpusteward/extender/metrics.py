"""The extender's Prometheus metrics, on a registry of its own (one per app instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpusteward.adapters import buildinfo

# Server-side latency targets are in milliseconds (docs/architecture.md: p99 <= 2 ms at 5,000
# nodes).
_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0)


class ExtenderMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        buildinfo.register(r)
        self.latency = Histogram(
            "gpusteward_extender_request_duration_seconds",
            "Server-side time to answer a scheduler call.",
            ["verb"], buckets=_BUCKETS, registry=r)
        self.requests = Counter(
            "gpusteward_extender_requests_total",
            "Scheduler calls by verb and HTTP status; 499: the client hung up before the answer "
            "(not an error of ours, never sent).", ["verb", "code"], registry=r)
        self.unknown_nodes = Counter(
            "gpusteward_extender_unknown_nodes_total",
            "Nodes in requests that the watch cache did not know yet.", ["verb"], registry=r)
        self.telemetry_age = Gauge(
            "gpusteward_telemetry_age_seconds",
            "Seconds since telemetry was last fetched successfully.", registry=r)
        self.stale_nodes = Gauge(
            "gpusteward_telemetry_stale_nodes",
            "GPU nodes scored with neutral load and health terms (telemetry missing or stale).",
            registry=r)
        self.refresh_errors = Counter(
            "gpusteward_telemetry_refresh_errors_total",
            "Telemetry refreshes that failed (Prometheus unreachable or garbage, or a bug).",
            registry=r)
        self.unknown_metrics = Gauge(
            "gpusteward_extender_telemetry_unknown_metrics",
            "Metric names like utilization's that gpusteward does not read (1 per name, "
            "checked every minute): a renamed field or a custom counters file; see "
            "telemetry.metrics.", ["metric"], registry=r)
        self.series_dropped = Counter(
            "gpusteward_extender_telemetry_series_dropped_total",
            "Telemetry series left out of a refresh (their GPU reads as unknown), by reason: "
            "not_finite, out_of_range, malformed, duplicate (the highest reading is kept).",
            ["reason"], registry=r)
        self.connections_closed = Counter(
            "gpusteward_extender_connections_closed_total",
            "Connections the extender closed: first_byte_timeout (a new connection sent "
            "nothing in time), header_timeout (a request's headers incomplete in time), "
            "request_timeout (a request not received and answered in time), idle_evicted (idle "
            "between requests, closed at the cap for a new one), connection_cap (a new one "
            "refused: at the cap with every connection inside a request).", ["reason"],
            registry=r)
        self.watch_waits = Counter(
            "gpusteward_extender_watch_waits_total",
            "Scheduler calls about a GPU pod the pod watch had not delivered yet, answered once "
            "it had (caught_up) or after the wait with the pod still unseen (timed_out: a "
            "lagging watch, or a caller sending pods that do not exist).", ["outcome"],
            registry=r)
        self.nodes = Gauge("gpusteward_extender_nodes", "GPU nodes in the watch cache.", registry=r)
