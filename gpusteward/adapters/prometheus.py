"""GPU telemetry from Prometheus (dcgm-exporter series, or our NVML agent's identical ones).

A refresh runs a fixed set of instant queries whatever the fleet size. prometheus-api-client is
synchronous, so each query runs in a worker thread; its own HTTP retries are off and tenacity is
the only retry policy.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
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
from gpusteward.adapters.promconnection import PrometheusConnection
from gpusteward.adapters.promsession import credentials, session
from gpusteward.core.attribution import (
    POD_LABELS,
    SCRAPE_NODE_LABELS,
    VIRTUAL_GPU_LABEL,
    claimed_pod,
    honor_mode,
    is_per_pod,
    node_of,
)
from gpusteward.core.dcgm import XID_COUNT, gpu_id
from gpusteward.core.model import GpuReading, Telemetry
from gpusteward.core.policy import Health, TelemetryPolicy
from gpusteward.core.vocabulary import LOOKALIKE, Concept, Unit, Vocabulary, fallback

log = logging.getLogger("gpusteward.telemetry")

# Series that identify one GPU (or one MIG instance) on a node.
_GPU_KEY = ("gpu", "GPU_I_ID")
# dcgm-exporter reports no GPU_UTIL for a MIG instance (series with GPU_I_ID/GPU_I_PROFILE),
# or a 0 whatever it computes (NVIDIA/dcgm-exporter#50, #216, #430): an instance is only ever
# read from the profiling engine-activity field, which ``fallback`` supplies where utilization
# is left out.
WHOLE_GPU = 'GPU_I_ID=""'


def utilization(vocabulary: Vocabulary, unit: Unit | None,
                body: Callable[[str], str] = lambda selector: selector, mark: bool = True,
                aggregate: str = "") -> str:
    """``body`` over each GPU's utilization, under any of its names, in ``unit``; engine
    activity where a GPU (a MIG instance always) has no utilization series. ``mark`` and
    ``aggregate``: see Vocabulary.union."""
    return fallback(
        vocabulary.union(Concept.UTILIZATION, unit, body, WHOLE_GPU, mark, aggregate),
        vocabulary.union(Concept.ENGINE_ACTIVITY, unit, body, mark=mark, aggregate=aggregate))


def sampled(vocabulary: Vocabulary, mark: bool = True, aggregate: str = "") -> str:
    """Each utilization (or engine-activity) series' newest sample time."""
    return utilization(vocabulary, None, _timestamp, mark, aggregate)


def _timestamp(selector: str) -> str:
    return f"timestamp({selector})"


def newest_sample(vocabulary: Vocabulary) -> str:
    """The newest sample of any GPU or MIG instance (the reclaimer's fleet-wide probe)."""
    return f"max({sampled(vocabulary, mark=False)})"  # one number: no series to tell apart


NAMES_EVERY = 60.0

# Whether Prometheus's windows include a sample at their start. Prometheus 3 made range
# selectors left-open: ``x[60s]`` at t holds the samples in (t - 60s, t], 2.x's holds
# [t - 60s, t] (Prometheus 3.0 migration guide, "Range selectors and lookback exclude samples
# coinciding with the left boundary"; CHANGELOG 3.0.0, #13904); subqueries followed in 3.0.1
# (CHANGELOG 3.0.1, #15431: ``x[30m:1m]`` yields 30 points, not 31). This subquery of a 1 ms
# window at a 1 ms resolution is evaluated at t and, left-closed, at t - 1 ms too: 2 on 2.x,
# 1 from 3.0.1 on. (3.0.0 alone, left-open ranges but left-closed subqueries, reads as 2.x and
# then misses a sample exactly 1 ms after a step's start.)
LEFT_CLOSED_PROBE = "count_over_time(vector(1)[1ms:1ms])"


def exact_range(seconds: float, left_closed: bool) -> str:
    """A range covering exactly (t - seconds, t] (timestamps are whole milliseconds) on either
    major: on a left-closed (2.x) Prometheus one millisecond shorter, so a sample at the
    window's start is left out as 3.x leaves it out. The what-if's steps then partition time, as
    core.whatif.history's sliding window sums require (step-aligned scrapes put samples exactly
    there); the reclaimer's windows count the same samples, and the XID subquery yields the
    same points, on both."""
    return f"{int(seconds * 1000) - 1}ms" if left_closed else f"{int(seconds)}s"


async def is_left_closed(prometheus: PrometheusSource) -> bool:
    (sample,) = await prometheus.query(LEFT_CLOSED_PROBE)
    return float(sample["value"][1]) > 1


class _Transient(Exception):
    pass


class Series(msgspec.Struct):
    """One series of a range query's matrix: its labels and its [time, "value"] points."""

    metric: dict[str, str]
    values: list[tuple[float, str]]


class _Matrix(msgspec.Struct):
    result: list[Series]


class _RangeAnswer(msgspec.Struct):
    data: _Matrix


# A week of a fleet's range queries is GBs of JSON: decoded straight into typed structs
# (values stay strings: Prometheus writes "+Inf", which msgspec would not read as a float).
_range_answer = msgspec.json.Decoder(_RangeAnswer)


def _tls_reason(error: Exception) -> str:
    """The certificate problem out of requests' nested SSLError text."""
    found = re.search(r"certificate verify failed: ([^(')]+)", str(error))
    return found.group(1).strip() if found else str(error)


# What ``node_of`` may fall back on: the scrape's node label, the exporter's own pod.
_LOCATING = (*SCRAPE_NODE_LABELS, "pod")
# (node names known, pod name -> node): lets a series whose node label names no node (an older
# exporter's Hostname is its pod's name) find its node; see core.attribution.node_of.
Locator = Callable[[], tuple[Collection[str], Mapping[str, str]]]


def gpu_labels(node_labels: Sequence[str]) -> list[str]:
    """The labels that name one GPU (or MIG instance), its node and the pod holding it."""
    return [*dict.fromkeys([*node_labels, *_GPU_KEY, *POD_LABELS, VIRTUAL_GPU_LABEL,
                            *_LOCATING])]


def keeping(labels: Sequence[str]) -> str:
    """``max by (labels) `` for a query: dcgm-exporter's series carry a dozen long labels (UUID,
    bus id, model, driver) that, at 8,000 GPUs, were most of the bytes Prometheus encoded and
    we decoded; the caller keeps only those it reads."""
    return f"max by ({', '.join(labels)}) "


def queries(health: Health, node_labels: Sequence[str],
            vocabulary: Vocabulary | None = None, left_closed: bool = False) -> dict[str, str]:
    """The PromQL of one refresh, each concept under all its names (core.vocabulary) in the
    unit the readings use. Engine activity stands in where utilization is absent and always
    reads MIG instances (see WHOLE_GPU).

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
    words = vocabulary or Vocabulary()
    labels = gpu_labels(node_labels)
    by = keeping(labels)
    xid_window = f"[{exact_range(health.xid_window, left_closed)}:{step}]"
    counted = ['xid!=""'] + ([f'xid!~"{"|".join(str(x) for x in sorted(health.ignored_xids))}"']
                             if health.ignored_xids else [])
    return {
        # instant readings: unmarked (see Vocabulary.union)
        "util": by + utilization(words, Unit.RATIO, mark=False),
        "util_at": by + sampled(words, mark=False),
        "temp": by + words.union(Concept.TEMPERATURE, Unit.CELSIUS, mark=False),
        "fb_used": by + words.union(Concept.MEMORY_USED, Unit.MIB, mark=False),
        # an XID under either name within the window counts: marked, so both are kept
        "xid": by + words.union(Concept.XID, Unit.CODE,
                                lambda x: f"max_over_time(({x}{ignored}){xid_window})"),
        "xid_nodes": f"count by ({', '.join([*node_labels, *_LOCATING])}) ({XID_COUNT})",
        "xid_counted": keeping([*labels, "xid"])
                       + f"(max_over_time({XID_COUNT}{{{', '.join(counted)}}}[{window}]) > 0)",
    }


class PrometheusSource:
    def __init__(self, connection: PrometheusConnection | str, policy: TelemetryPolicy,
                 health: Health, clock: Callable[[], float] = time.time, attempts: int = 3,
                 locate: Locator | None = None):
        """``connection``: how to reach Prometheus (a bare URL: no credentials, TLS verified)."""
        if isinstance(connection, str):
            connection = PrometheusConnection(connection)
        self.url = connection.url
        self.node_labels = tuple(policy.node_labels)
        self.honor = honor_mode(policy.honor_labels)
        self.locate = locate
        self._where: tuple[Collection[str], Mapping[str, str]] | None = None
        self.timeout = float(policy.query_timeout)
        self.vocabulary = policy.vocabulary()  # every name each concept may come under
        # Those with samples lately (all until checked): a name no series has still costs each
        # query an `or` over the fleet's vectors (1.46x the utilization query at 8,000 GPUs)
        self.present = self.vocabulary
        self.health = health
        self.queries = queries(health, self.node_labels, self.present)
        self.clock = clock
        self.attempts = attempts
        self._prom = PrometheusConnect(self.url, session=session(connection),
                                       auth=credentials(connection), retry=Retry(total=0),
                                       timeout=self.timeout)
        self.queries_run = 0
        # reason -> series dropped by the last assemble (the extender counts them)
        self.last_dropped: dict[str, int] = {}
        # metric names like utilization's that no concept is read under
        self.unknown_names: list[str] = []
        self._names_at = -NAMES_EVERY
        self._names_lookback = 0.0
        self._gpus_read = 0
        # 2.x's windows include a sample at their start, 3.x's do not (exact_range)
        self.left_closed: bool | None = None

    async def fetch(self) -> Telemetry:
        """One refresh; raises TelemetryUnavailable when Prometheus cannot answer."""
        await self.check_names()
        names = list(self.queries)
        results = await asyncio.gather(*(self._query(self.queries[n]) for n in names))
        telemetry = self.assemble(dict(zip(names, results, strict=True)))
        read = sum(len(r) for r in telemetry.nodes.values())
        if read < self._gpus_read:  # GPUs gone: maybe renamed (an exporter upgrade); look now
            self._names_at = -NAMES_EVERY
        self._gpus_read = read
        return telemetry

    async def check_names(self, lookback: float = NAMES_EVERY) -> None:
        """Which metric names have had samples within ``lookback`` (an index lookup, no
        samples read), every NAMES_EVERY seconds or when asked to look further back: queries
        then read only those (``present``), and ``unknown_names`` lists names like
        utilization's that no concept is read under. A name that appears between two checks is
        read from the next (``fetch`` asks again at once when it reads fewer GPUs than the
        last time): until then its GPUs' evidence is too old to judge (never idle), and a name
        that stops stays read while any window holds its samples."""
        now = self.clock()
        if now - self._names_at < NAMES_EVERY and lookback <= self._names_lookback:
            return
        # The longest lookback any caller asked for, always: the extender's refresh and its
        # preempt verb's evidence share this source, and a refresh's minute must not drop a
        # name the evidence window still holds samples of. (Prometheus answers label values
        # per block, two hours or more, so it would not show there; a finer backend would.)
        lookback = max(lookback, self._names_lookback)
        if self.left_closed is None:
            try:
                self.left_closed = await is_left_closed(self)
            except TelemetryUnavailable as e:  # asked again at the next check
                log.warning("could not tell Prometheus's window semantics: %s", e)
        wanted = "|".join([LOOKALIKE, *sorted(self.vocabulary.known())])
        try:
            seen = await self._retry(self._label_values_once, "__name__", {
                "match[]": f'{{__name__=~"{wanted}"}}', "start": f"{now - lookback:.0f}"})
        except TelemetryUnavailable as e:
            log.warning("could not list telemetry metric names; reading every known name: %s",
                        e)
            self.present = self.vocabulary
        else:
            self._names_at, self._names_lookback = now, lookback
            self.unknown_names = self.vocabulary.unknown(seen)
            self.present = self.vocabulary.narrowed(seen)
            if self.unknown_names:
                log.warning("ignoring GPU metrics under names gpusteward does not read (a "
                            "newer exporter, or a custom counters file: see "
                            "telemetry.metrics): %s", ", ".join(self.unknown_names))
        self.queries = queries(self.health, self.node_labels, self.present,
                               bool(self.left_closed))

    def _label_values_once(self, label: str, params: dict[str, str]) -> list[str]:
        return self._mapped(f"label values of {label}",
                            lambda: self._prom.get_label_values(label, params=params))

    async def query(self, promql: str) -> list[dict[str, Any]]:
        """Any instant query, with the same retries and error mapping (used by the reclaimer)."""
        return await self._query(promql)

    async def query_range(self, promql: str, start: float, end: float,
                          step: float) -> list[dict[str, Any]]:
        """A range query (whole seconds; a matrix of series), with the same retries and error
        mapping as instant queries (used by the report)."""
        return await self._retry(self._query_range_once, promql, start, end, step)

    async def query_matrix(self, promql: str, start: float, end: float,
                           step: float) -> list[Series]:
        """A range query as typed series (the what-if history's bulk reads), with the same
        retries and error mapping."""
        return await self._retry(self._query_matrix_once, promql, start, end, step)

    async def _query(self, promql: str) -> list[dict[str, Any]]:
        return await self._retry(self._query_once, promql)

    async def _retry(self, once: Callable[..., list[Any]], *args: Any) -> list[Any]:
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

    def _query_matrix_once(self, promql: str, start: float, end: float,
                           step: float) -> list[Series]:
        def call() -> list[Series]:
            prom = self._prom
            response = prom._session.request(
                method=prom._method, url=f"{self.url}/api/v1/query_range",
                params={"query": promql, "start": round(start), "end": round(end),
                        "step": f"{step:g}", "timeout": f"{self.timeout:g}s"},
                verify=prom._session.verify, headers=prom.headers, auth=prom.auth,
                cert=prom._session.cert, timeout=self.timeout)
            if response.status_code != 200:  # the same text as prometheus-api-client's
                raise PrometheusApiClientException(
                    f"HTTP Status Code {response.status_code} ({response.content!r})")
            return _range_answer.decode(response.content).data.result

        return self._mapped(promql, call)

    def _mapped(self, promql: str, call: Callable[[], Any]) -> list[Any]:
        """Run one HTTP call, mapping library errors to ours (_Transient ones are retried)."""
        self.queries_run += 1
        try:
            result = call()
        except requests.exceptions.SSLError as e:
            raise TelemetryUnavailable(
                f"prometheus at {self.url}: TLS verification failed ({_tls_reason(e)}); give "
                "the CA that signed its certificate with --prometheus-ca-file") from e
        except (requests.ConnectionError, requests.Timeout) as e:
            raise _Transient(f"unreachable: {e}") from e
        except PrometheusApiClientException as e:
            if "Status Code 5" in str(e):
                raise _Transient(str(e)) from e
            if re.search(r"Status Code 40[13]\b", str(e)):
                raise TelemetryUnavailable(
                    f"prometheus at {self.url} refused our credentials: {e}; check the "
                    "bearer token or basic auth settings") from e
            raise TelemetryUnavailable(f"prometheus at {self.url} rejected {promql!r}: {e}") from e
        except (ValueError, KeyError, TypeError) as e:  # msgspec.DecodeError is a ValueError
            raise TelemetryUnavailable(f"prometheus at {self.url} answered garbage: {e}") from e
        if not isinstance(result, list):
            raise TelemetryUnavailable(f"prometheus at {self.url} answered garbage: {result!r}")
        return result

    def assemble(self, results: dict[str, list[dict[str, Any]]]) -> Telemetry:
        """Readings from one refresh's query results.

        A series that cannot be read (NaN, ±Inf or out-of-range value, missing or malformed
        labels) is dropped with its GPU for this refresh and counted in ``last_dropped``; the
        rest of the fleet is unaffected. Duplicates for one GPU keep the highest value, so the
        result never depends on series order."""
        gpus: dict[tuple[str, ...], dict[str, Any]] = {}
        bad: set[tuple[str, ...]] = set()
        dropped: dict[str, int] = {}
        counting: set[str] = set()
        copies: dict[tuple[str, ...], dict[str, Any]] = {}  # per-pod copies of shared GPUs
        self._where = self.locate() if self.locate else None
        try:
            for name, series in results.items():
                for s in series:
                    try:
                        key, labels, value = self._parse_series(name, s)
                    except BadSeries as e:
                        dropped[e.reason] = dropped.get(e.reason, 0) + 1
                        if e.key is not None:
                            bad.add(e.key)
                        log.debug("dropped %s series %r: %s", name, s, e)
                        continue
                    if name == "xid_nodes":
                        counting.add(key[0])
                        continue
                    per_pod = is_per_pod(labels)
                    if self._merge(copies if per_pod else gpus, key, name, labels, value) \
                            and not per_pod:
                        dropped["duplicate"] = dropped.get("duplicate", 0) + 1
        except (AttributeError, TypeError) as e:
            raise TelemetryUnavailable(f"unexpected query result shape: {e}") from e
        self.last_dropped = dropped
        if dropped:
            log.warning("telemetry series dropped this refresh (their GPUs read as unknown): %s",
                        ", ".join(f"{r}={n}" for r, n in sorted(dropped.items())))
        for key, fields in copies.items():  # a GPU seen only through its per-pod copies
            device = gpus.setdefault(key, fields)
            if "pod" in fields:  # a shared GPU is held: name one of its pods, always the same
                device.setdefault("pod", fields["pod"])
        now = self.clock()
        by_node: dict[str, list[GpuReading]] = {}
        for key, fields in sorted(gpus.items()):  # GPU order, not series order
            if key in bad:
                continue
            then = fields.pop("held_then", None)
            counted = fields.pop("counted_xid", 0)
            if fields["node"] in counting:  # the windowed count, not the sticky gauge
                fields["xid"] = counted
            if "sampled_at" not in fields and fields.get("xid"):
                # A GPU that stopped reporting utilization (lost: NVML gives none, the agent
                # exports its XID alone) but had an XID within the window is current now,
                # held by the pod its XID series name (no instant one can).
                fields["sampled_at"] = now
                if then is not None:
                    fields.setdefault("pod", then)
            if "sampled_at" in fields:
                by_node.setdefault(fields["node"], []).append(GpuReading(**fields))
        return Telemetry(nodes={n: tuple(r) for n, r in by_node.items()}, fetched_at=now)

    def _node_of(self, labels: dict[str, str]) -> str | None:
        known, pod_nodes = self._where or (None, None)
        return node_of(labels, self.node_labels, known, pod_nodes)

    def _parse_series(self, name: str, series: Any) -> tuple[tuple[str, ...], dict[str, str],
                                                                float]:
        """(GPU key, labels, value) of one series, or BadSeries saying why it is unusable."""
        try:
            labels = series["metric"]
            node = self._node_of(labels)
        except (KeyError, TypeError, AttributeError) as e:
            raise BadSeries("malformed", f"no label map: {e!r}") from e
        if not isinstance(node, str):
            raise BadSeries("malformed", "no node label")
        key = (node, *(labels.get(k, "") for k in _GPU_KEY))
        try:
            value = float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BadSeries("malformed", f"no sample value: {e!r}", key) from e
        low, high = _RANGE.get(name, _ANY)
        if not low <= value <= high:  # NaN fails every comparison
            reason = "out_of_range" if math.isfinite(value) else "not_finite"
            raise BadSeries(reason, f"value {value} outside [{low}, {high}]", key)
        if name in _WHOLE and not value.is_integer():
            raise BadSeries("out_of_range", f"XID value {value} is not a whole number", key)
        if name == "xid_counted":
            xid = labels.get("xid")
            if not (isinstance(xid, str) and xid.isascii() and xid.isdigit()
                    and int(xid) <= _MAX_XID):
                raise BadSeries("malformed", f"xid label {xid!r}", key)
        return key, labels, value

    def _merge(self, gpus: dict[tuple[str, ...], dict[str, Any]], key: tuple[str, ...],
               name: str, labels: dict[str, str], value: float) -> bool:
        """Fold one series into its GPU; True when it repeats an instant reading the GPU had.

        A windowed series (``_WINDOWED``) is one of those its GPU had over the window, one per
        label set: the pod that held it then, the name before an exporter upgrade. Their
        highest is the reading, and they name a holder only where no instant series does."""
        gpu = gpus.get(key)
        if gpu is None:
            gpu = gpus[key] = {"node": key[0], "gpu": gpu_id(labels)}
        pod = claimed_pod(labels, self.honor)
        holder = "held_then" if name in _WINDOWED else "pod"
        if pod and pod < gpu.get(holder, "\uffff"):  # copies of a shared GPU: the same one always
            gpu[holder] = pod
        field = _FIELDS.get(name)
        if field is None:
            return False
        if name == "xid_counted":  # one series per XID seen in the window
            gpu[field] = max(gpu.get(field, 0), int(labels["xid"]))
            return False
        old = gpu.get(field)
        if name == "xid":
            value = int(value)
        elif name == "util":
            value = min(1.0, value)  # engine activity may overshoot by rounding
        gpu[field] = value if old is None else max(old, value)  # order-independent
        return old is not None and name not in _WINDOWED


class BadSeries(ValueError):
    """One series that cannot be used; ``reason`` labels the dropped-series metric."""

    def __init__(self, reason: str, detail: str, key: tuple[str, ...] | None = None):
        super().__init__(detail)
        self.reason = reason
        self.key = key


# XIDs are small driver codes (the highest documented is below 200); a bound keeps int() sane.
_MAX_XID = 10_000
# Plausible values per query (finite bounds, so one comparison also refuses NaN and ±Inf);
# anything else is a broken exporter or a bad recording rule.
_RANGE = {"util": (0.0, 1.0 + 1e-6), "util_at": (0.0, 1e11), "temp": (-50.0, 200.0),
          "fb_used": (0.0, 1e9), "xid": (0.0, _MAX_XID), "xid_counted": (0.0, 1e12),
          "xid_nodes": (0.0, 1e12)}
_ANY = (-1e300, 1e300)
_WHOLE = frozenset({"xid", "xid_counted"})
_WINDOWED = _WHOLE  # read over health.xid_window, not at an instant
_FIELDS = {"util": "util", "util_at": "sampled_at", "temp": "temp_c", "fb_used": "fb_used_mib",
           "xid": "xid", "xid_counted": "counted_xid"}
