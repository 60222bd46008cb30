"""Prometheus's HTTP API as gpusteward calls it: one retry policy, one error mapping, and what
it knows of the server (which GPU metric names have samples, how its windows are bounded).

prometheus-api-client is synchronous, so each call runs in a worker thread; its own HTTP retries
are off and tenacity is the only retry policy. The extender's refresh (adapters.telemetry), the
reclaimer's evidence, the report and the what-if all query through one of these.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
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
from gpusteward.adapters.promql import LEFT_CLOSED_PROBE
from gpusteward.adapters.promsession import credentials, session
from gpusteward.core.policy import TelemetryPolicy
from gpusteward.core.vocabulary import LOOKALIKE

log = logging.getLogger("gpusteward.telemetry")

NAMES_EVERY = 60.0


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


async def is_left_closed(prometheus: PrometheusClient) -> bool:
    (sample,) = await prometheus.query(LEFT_CLOSED_PROBE)
    return float(sample["value"][1]) > 1


class PrometheusClient:
    def __init__(self, connection: PrometheusConnection | str, policy: TelemetryPolicy,
                 clock: Callable[[], float] = time.time, attempts: int = 3):
        """``connection``: how to reach Prometheus (a bare URL: no credentials, TLS verified)."""
        if isinstance(connection, str):
            connection = PrometheusConnection(connection)
        self.url = connection.url
        self.timeout = float(policy.query_timeout)
        self.vocabulary = policy.vocabulary()  # every name each concept may come under
        # Those with samples lately (all until checked): a name no series has still costs each
        # query an `or` over the fleet's vectors (1.46x the utilization query at 8,000 GPUs)
        self.present = self.vocabulary
        self.clock = clock
        self.attempts = attempts
        self._prom = PrometheusConnect(self.url, session=session(connection),
                                       auth=credentials(connection), retry=Retry(total=0),
                                       timeout=self.timeout)
        self.queries_run = 0
        # metric names like utilization's that no concept is read under
        self.unknown_names: list[str] = []
        self._names_at = -NAMES_EVERY
        self._names_lookback = 0.0
        # 2.x's windows include a sample at their start, 3.x's do not (promql.exact_range)
        self.left_closed: bool | None = None

    def recheck_names(self) -> None:
        """Look at the names again at the next check (GPUs went missing: maybe renamed)."""
        self._names_at = -NAMES_EVERY

    async def check_names(self, lookback: float = NAMES_EVERY) -> None:
        """Which metric names have had samples within ``lookback`` (an index lookup, no
        samples read), every NAMES_EVERY seconds or when asked to look further back: queries
        then read only those (``present``), and ``unknown_names`` lists names like
        utilization's that no concept is read under. A name that appears between two checks is
        read from the next (the extender's refresh asks again at once, ``recheck_names``, when
        it reads fewer GPUs than the last time): until then its GPUs' evidence is too old to
        judge (never idle), and a name that stops stays read while any window holds its
        samples."""
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
