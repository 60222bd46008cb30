"""GPU telemetry from Prometheus (dcgm-exporter series, or our NVML agent's identical ones).

A refresh runs a fixed set of instant queries whatever the fleet size. prometheus-api-client is
synchronous, so each query runs in a worker thread; its own HTTP retries are off and tenacity is
the only retry policy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)
from urllib3.util.retry import Retry

from gpusteward.adapters.errors import TelemetryUnavailable
from gpusteward.core.model import GpuReading, Telemetry
from gpusteward.core.policy import Health
from gpusteward.core.policy import Telemetry as TelemetryPolicy

log = logging.getLogger("gpusteward.telemetry")

POD_LABELS = (("namespace", "pod"), ("exported_namespace", "exported_pod"))
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
# Series that identify one GPU (or one MIG instance) on a node.
_GPU_KEY = ("gpu", "GPU_I_ID")
# dcgm-exporter reports no GPU_UTIL for a MIG instance (series with GPU_I_ID/GPU_I_PROFILE),
# or a 0 whatever it computes (NVIDIA/dcgm-exporter#50, #216, #430): an instance is only ever
# read from the profiling engine-activity field, which `or` supplies where GPU_UTIL is left out.
GPU_UTIL = 'DCGM_FI_DEV_GPU_UTIL{GPU_I_ID=""}'
ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
# The newest sample of any GPU or MIG instance (the reclaimer's freshness probe).
NEWEST_SAMPLE = f"max(timestamp({GPU_UTIL}) or timestamp({ENGINE_ACTIVE}))"


class _Transient(Exception):
    pass


def gpu_labels(node_labels: Sequence[str]) -> list[str]:
    """The labels that name one GPU (or MIG instance) and the pod holding it."""
    return [*dict.fromkeys([*node_labels, *_GPU_KEY, *(x for pair in POD_LABELS for x in pair)])]


def keeping(labels: Sequence[str]) -> str:
    """``max by (labels) `` for a query: dcgm-exporter's series carry a dozen long labels (UUID,
    bus id, model, driver) that, at 8,000 GPUs, were most of the bytes Prometheus encoded and
    we decoded; the caller keeps only those it reads."""
    return f"max by ({', '.join(labels)}) "


def queries(health: Health, node_labels: Sequence[str]) -> dict[str, str]:
    """The PromQL of one refresh. GR_ENGINE_ACTIVE stands in where GPU_UTIL is absent and
    always reads MIG instances (see GPU_UTIL).

    Each query keeps the labels ``assemble`` reads; ``timestamp`` goes inside the aggregation so
    that it is still each sample's time.

    XIDs: dcgm-exporter's gauge keeps a GPU's last XID until the exporter restarts
    (NVIDIA/dcgm-exporter#500), so a single old XID would sideline the GPU for good. Where the
    exporter also has its windowed DCGM_EXP_XID_ERRORS_COUNT enabled (``xid_nodes``: one series
    per node), that count is believed instead (``xid_counted``: only GPUs with a non-ignored
    XID in the window)."""
    ignored = "".join(f" != {x}" for x in sorted({0, *health.ignored_xids}))
    window = f"{int(health.xid_window)}s"
    step = f"{max(1, int(health.xid_window) // 40)}s"  # ~40 points per series and window
    labels = gpu_labels(node_labels)
    by = keeping(labels)
    counted = ['xid!=""'] + ([f'xid!~"{"|".join(str(x) for x in sorted(health.ignored_xids))}"']
                             if health.ignored_xids else [])
    return {
        "util": by + f"(({GPU_UTIL} / 100) or {ENGINE_ACTIVE})",
        "util_at": by + f"(timestamp({GPU_UTIL}) or timestamp({ENGINE_ACTIVE}))",
        "temp": by + "(DCGM_FI_DEV_GPU_TEMP)",
        "fb_used": by + "(DCGM_FI_DEV_FB_USED)",
        "xid": by + f"(max_over_time((DCGM_FI_DEV_XID_ERRORS{ignored})[{window}:{step}]))",
        "xid_nodes": f"count by ({', '.join(node_labels)}) ({XID_COUNT})",
        "xid_counted": keeping([*labels, "xid"])
                       + f"(max_over_time({XID_COUNT}{{{', '.join(counted)}}}[{window}]) > 0)",
    }


class PrometheusSource:
    def __init__(self, url: str, policy: TelemetryPolicy, health: Health,
                 clock: Callable[[], float] = time.time, attempts: int = 3):
        self.url = url
        self.node_labels = tuple(policy.node_labels)
        self.timeout = float(policy.query_timeout)
        self.queries = queries(health, self.node_labels)
        self.clock = clock
        self.attempts = attempts
        self._prom = PrometheusConnect(url, disable_ssl=True, retry=Retry(total=0),
                                       timeout=self.timeout)
        self.queries_run = 0

    async def fetch(self) -> Telemetry:
        """One refresh; raises TelemetryUnavailable when Prometheus cannot answer."""
        names = list(self.queries)
        results = await asyncio.gather(*(self._query(self.queries[n]) for n in names))
        return self.assemble(dict(zip(names, results, strict=True)))

    async def query(self, promql: str) -> list[dict[str, Any]]:
        """Any instant query, with the same retries and error mapping (used by the reclaimer)."""
        return await self._query(promql)

    async def query_range(self, promql: str, start: float, end: float,
                          step: float) -> list[dict[str, Any]]:
        """A range query (whole seconds; a matrix of series), with the same retries and error
        mapping as instant queries (used by the report)."""
        return await self._retry(self._query_range_once, promql, start, end, step)

    async def _query(self, promql: str) -> list[dict[str, Any]]:
        return await self._retry(self._query_once, promql)

    async def _retry(self, once: Callable[..., list[dict[str, Any]]],
                     *args: Any) -> list[dict[str, Any]]:
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_Transient),
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential_jitter(multiplier=0.2, max=2, jitter=0.2),
            reraise=True,
            before_sleep=lambda rs: log.warning(
                "prometheus query failed, retrying: %s",
                rs.outcome.exception() if rs.outcome else None),
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await asyncio.to_thread(once, *args)
        except _Transient as e:
            raise TelemetryUnavailable(f"prometheus at {self.url}: {e}") from e
        raise AssertionError("unreachable")

    def _query_once(self, promql: str) -> list[dict[str, Any]]:
        return self._mapped(promql, lambda: self._prom.custom_query(
            promql, params={"timeout": f"{self.timeout:g}s"}))

    def _query_range_once(self, promql: str, start: float, end: float,
                          step: float) -> list[dict[str, Any]]:
        return self._mapped(promql, lambda: self._prom.custom_query_range(
            promql, start_time=datetime.fromtimestamp(start, UTC),
            end_time=datetime.fromtimestamp(end, UTC), step=f"{step:g}",
            params={"timeout": f"{self.timeout:g}s"}))

    def _mapped(self, promql: str, call: Callable[[], Any]) -> list[dict[str, Any]]:
        """Run one HTTP call, mapping library errors to ours (_Transient ones are retried)."""
        self.queries_run += 1
        try:
            result = call()
        except (requests.ConnectionError, requests.Timeout) as e:
            raise _Transient(f"unreachable: {e}") from e
        except PrometheusApiClientException as e:
            if "Status Code 5" in str(e):
                raise _Transient(str(e)) from e
            raise TelemetryUnavailable(f"prometheus at {self.url} rejected {promql!r}: {e}") from e
        except (ValueError, KeyError, TypeError) as e:
            raise TelemetryUnavailable(f"prometheus at {self.url} answered garbage: {e}") from e
        if not isinstance(result, list):
            raise TelemetryUnavailable(f"prometheus at {self.url} answered garbage: {result!r}")
        return result

    def assemble(self, results: dict[str, list[dict[str, Any]]]) -> Telemetry:
        gpus: dict[tuple[str, ...], dict[str, Any]] = {}
        try:
            counting = {self._node_of(s["metric"]) for s in results.get("xid_nodes", ())}
            for name, series in results.items():
                if name != "xid_nodes":
                    for s in series:
                        self._merge(gpus, name, s["metric"], float(s["value"][1]))
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise TelemetryUnavailable(f"unexpected query result shape: {e}") from e
        now = self.clock()
        by_node: dict[str, list[GpuReading]] = {}
        for fields in gpus.values():
            counted = fields.pop("counted_xid", 0)
            if fields["node"] in counting:  # the windowed count, not the sticky gauge
                fields["xid"] = counted
            if "sampled_at" not in fields and fields.get("xid"):
                # A GPU that stopped reporting utilization (lost: NVML gives none, the agent
                # exports its XID alone) but had an XID within the window is current now.
                fields["sampled_at"] = now
            if "sampled_at" in fields:
                by_node.setdefault(fields["node"], []).append(GpuReading(**fields))
        return Telemetry(nodes={n: tuple(r) for n, r in by_node.items()}, fetched_at=now)

    def _node_of(self, labels: dict[str, str]) -> str | None:
        return next((labels[k] for k in self.node_labels if labels.get(k)), None)

    def _merge(self, gpus: dict[tuple[str, ...], dict[str, Any]], name: str,
               labels: dict[str, str], value: float) -> None:
        node = self._node_of(labels)
        if node is None:
            return
        key = (node, *(labels.get(k, "") for k in _GPU_KEY))
        gpu = gpus.setdefault(key, {"node": node, "gpu": _gpu_name(labels)})
        pod = _pod_of(labels)
        if pod:
            gpu["pod"] = pod
        if name == "util":
            gpu["util"] = min(1.0, max(0.0, value))
        elif name == "util_at":
            gpu["sampled_at"] = value
        elif name == "temp":
            gpu["temp_c"] = value
        elif name == "fb_used":
            gpu["fb_used_mib"] = value
        elif name == "xid":
            gpu["xid"] = max(gpu.get("xid", 0), int(value))
        elif name == "xid_counted":
            gpu["counted_xid"] = max(gpu.get("counted_xid", 0), int(labels["xid"]))


def _gpu_name(labels: dict[str, str]) -> str:
    gpu = labels.get("gpu", "")
    return f"{gpu}/mig{labels['GPU_I_ID']}" if labels.get("GPU_I_ID") else gpu


def _pod_of(labels: dict[str, str]) -> str | None:
    for ns_label, pod_label in POD_LABELS:
        if labels.get(pod_label):
            return f"{labels.get(ns_label, '')}/{labels[pod_label]}"
    return None

