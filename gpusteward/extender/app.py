"""The extender's aiohttp application: thin handlers over the precomputed placement view.

Background work (watches, telemetry refresh) runs in `cleanup_ctx` tasks; handlers never call
Prometheus or the API server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpusteward.adapters.background import every, running
from gpusteward.adapters.errors import TelemetryUnavailable
from gpusteward.core.kubewire import WirePod
from gpusteward.core.model import Telemetry
from gpusteward.extender import preempt, wire
from gpusteward.extender.metrics import ExtenderMetrics
from gpusteward.extender.replies import Reply, filter_reply, prioritize_reply
from gpusteward.extender.view import PlacementView

log = logging.getLogger("gpusteward.extender")
# Each prioritize answer at debug (`ranking`): a logger of its own, to turn on alone.
placement_log = logging.getLogger("gpusteward.extender.placement")

JSON = "application/json"


class TelemetrySource(Protocol):
    """Where the refresh reads from (adapters.telemetry.PrometheusSource), and what it says of
    the last read: series it dropped by reason, metric names it does not read."""

    @property
    def last_dropped(self) -> Mapping[str, int]: ...

    @property
    def unknown_names(self) -> Sequence[str]: ...

    async def fetch(self) -> Telemetry: ...


class Watch(Protocol):
    synced: asyncio.Event

    async def run(self) -> None: ...


@dataclass
class Extender:
    view: PlacementView
    telemetry: TelemetrySource | None
    watches: Sequence[Watch] = ()  # readiness waits for these (Nodes, Pods)
    refresh_seconds: float = 15.0
    metrics: ExtenderMetrics = field(default_factory=ExtenderMetrics)
    evidence: preempt.EvidenceSource | None = None  # per-pod idle evidence for /preempt
    last_ok: float = 0.0
    # Watches that feed the view but not readiness: a cluster without resource.k8s.io/v1 (or
    # without the RBAC for it) still places device-plugin pods; each watch logs why it waits.
    side_watches: Sequence[Watch] = ()
    # SIGTERM received: readiness fails and every answer closes its connection (serve._drain).
    draining: bool = False
    # Seconds a call about a GPU pod the pod watch has not shown yet waits for it (catch_up);
    # 0 where nothing watches (a store fed directly).
    watch_wait: float = 0.0

    def __post_init__(self) -> None:
        # Read at scrape time, so a refresh that stops or crashes still shows as ageing.
        self.metrics.telemetry_age.set_function(self.telemetry_age)
        self.metrics.stale_nodes.set_function(self.view.stale_nodes)
        self.metrics.nodes.set_function(lambda: len(self.view.fleet.nodes))

    @property
    def ready(self) -> bool:
        return all(w.synced.is_set() for w in self.watches)

    def _unknown_names(self, names: Sequence[str]) -> None:
        self.metrics.unknown_metrics.clear()
        for name in names:
            self.metrics.unknown_metrics.labels(name).set(1)

    def telemetry_age(self) -> float:
        return self.view.clock() - self.last_ok if self.last_ok else float("inf")

    async def refresh(self) -> None:
        """One telemetry tick: fetch, then rebuild every node state (also after a failure).

        Whatever goes wrong, the last good readings are kept and age: they turn stale (neutral
        terms) after ``staleAfter`` and the age, stale-nodes and error metrics say so."""
        telemetry = self.view.telemetry
        try:
            if self.telemetry is not None:
                telemetry = await self.telemetry.fetch()
                self.last_ok = telemetry.fetched_at
                for reason, count in self.telemetry.last_dropped.items():
                    self.metrics.series_dropped.labels(reason).inc(count)
                self._unknown_names(self.telemetry.unknown_names)
        except TelemetryUnavailable as e:
            self.metrics.refresh_errors.inc()
            log.warning("telemetry unavailable, scoring load and health as neutral: %s", e)
        except Exception:  # a bug must not leave the old readings looking fresh
            self.metrics.refresh_errors.inc()
            log.exception("telemetry refresh failed; keeping the last readings, which age")
        try:
            self.view.set_telemetry(telemetry)
        except Exception:  # readings the scoring cannot digest: score neutral, never stale-fresh
            self.metrics.refresh_errors.inc()
            log.exception("rebuilding node states failed; scoring load and health as neutral")
            self.view.set_telemetry(Telemetry())


EXTENDER = web.AppKey("extender", Extender)


@dataclass(frozen=True)
class RequestLimits:
    """What one request may cost (docs/operations.md, "Extender request limits").

    max_body_bytes: the largest body read at all; body_budget_bytes: bodies buffered at once
    across all connections (a request that would exceed it gets 503 and the scheduler retries);
    read_timeout: seconds to receive a request's body once its headers arrived."""

    max_body_bytes: int = 32 << 20
    body_budget_bytes: int = 96 << 20
    read_timeout: float = 10.0


LIMITS = web.AppKey("limits", RequestLimits)
VERBS = ("filter", "prioritize", "preempt")
# aiohttp would inflate a gzip body inside the event loop, also to drain one we refused. Idle
# keep-alive connections are closed after two minutes (aiohttp's default is an hour): longer
# than kube-scheduler's client keeps them (Go's DefaultTransport IdleConnTimeout, 90 s, which
# apimachinery's SetTransportDefaults applies), so the client closes first and never writes a
# call onto a connection we are closing (a written POST is not resent, and the call fails).
SERVER_OPTIONS = {"auto_decompress": False, "keepalive_timeout": 120.0}


def create_app(extender: Extender, *, max_body_bytes: int = 32 << 20,
               limits: RequestLimits | None = None) -> web.Application:
    limits = limits or RequestLimits(max_body_bytes=max_body_bytes,
                              body_budget_bytes=max(3 * max_body_bytes, 8 << 20))
    app = web.Application(client_max_size=limits.max_body_bytes,
                          middlewares=[_closing_when_draining, _counted],
                          handler_args=SERVER_OPTIONS)
    app[EXTENDER] = extender
    app[LIMITS] = limits
    app[_BUDGET] = _Budget(limits.body_budget_bytes)
    app.add_routes([
        web.post("/filter", _verb("filter", filter_reply)),
        web.post("/prioritize", _verb("prioritize", prioritize_reply)),
        web.post("/preempt", _preempt),
        web.get("/healthz", healthz),
        web.get("/readyz", readyz),
        web.get("/metrics", metrics),
    ])
    app.cleanup_ctx.append(_background)
    preempt.install(app, extender.view.policy, extender.view.fleet, extender.evidence,
                    extender.metrics)
    return app


def create_metrics_app(extender: Extender) -> web.Application:
    """/metrics and the probes alone, for a port of their own (--metrics-listen): Prometheus
    and the kubelet reach it while the scheduler port admits only the scheduler."""
    app = web.Application()
    app[EXTENDER] = extender
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz),
                    web.get("/metrics", metrics)])
    return app


@web.middleware
async def _closing_when_draining(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """While draining, each answer says ``Connection: close``: the client's next request opens
    a new connection, which the Service sends to a replica still in its endpoints. Closing an
    idle keep-alive connection instead races the client's next write, and kube-scheduler does
    not resend a POST that was written (Go's net/http retries only unwritten requests)."""
    response = await handler(request)
    if request.app[EXTENDER].draining:
        response.force_close()
    return response


class _Budget:
    """Bytes of request bodies held in memory right now, across all requests."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0


_BUDGET = web.AppKey("budget", _Budget)
_SMALL_BODY = 1 << 20
_SMALL_HEADROOM = 16 << 20
_UNCOUNTED = frozenset({"/healthz", "/readyz", "/metrics"})


@web.middleware
async def _counted(request: web.Request,
                   handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                   ) -> web.StreamResponse:
    """Every scheduler-facing response is counted, whatever produced it (404, 405, a bug), and
    every request its client abandoned (499, with no answer and no time to answer)."""
    if request.path in _UNCOUNTED:
        return await handler(request)
    ext = request.app[EXTENDER]
    verb = request.path.strip("/") if request.path.strip("/") in VERBS else "other"
    started = time.perf_counter()
    try:
        response = await handler(request)
        status = response.status
    except web.HTTPException as e:
        status = e.status
        raise
    except Exception as e:
        status = _failure_status(request, verb, e)
        response = web.Response(body=_error("internal error; see the extender's log"),
                                status=status, content_type=JSON)  # a 499 is never sent
    finally:
        if status != CLIENT_ABORTED:
            ext.metrics.latency.labels(verb).observe(time.perf_counter() - started)
        ext.metrics.requests.labels(verb, str(status)).inc()
    return response


CLIENT_ABORTED = 499  # nginx's code: the client closed its connection before the answer


def _failure_status(request: web.Request, verb: str, e: Exception) -> int:
    """499 for a request whose client hung up mid-body (aiohttp's read then fails with "Connection
    lost"): not our failure, so a debug line and out of the error ratio. 500 for anything else,
    a bug, logged with its traceback."""
    transport = request.transport
    if isinstance(e, ConnectionResetError) and (transport is None or transport.is_closing()):
        log.debug("%s request from %s abandoned by its client before the answer (499): %s",
                  verb, request.remote, e)
        return CLIENT_ABORTED
    log.exception("%s request failed", verb)
    return 500


Answer = Callable[[PlacementView, wire.ExtenderArgs], Reply]

# How often a waiting call looks again: the watch applies events between two looks.
WATCH_POLL = 0.002


async def catch_up(ext: Extender, pod: WirePod) -> None:
    """Wait, up to ``ext.watch_wait``, until the pod watch shows the pod asked about.

    In a burst the scheduler places pods tens of milliseconds apart, and a watch that lags that
    much would leave each pod of the burst ranked before the last one counted (parked,
    view.py): all of them onto the node that looked idlest. One watch delivers in
    resourceVersion order, so once it shows this pod it shows every pod created before it. A
    made-up pod delays only its own answer."""
    if not ext.watch_wait or not ext.view.unwatched(pod):
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ext.watch_wait
    # Whether it waits is settled: now only whether the watch shows it (a re-list replaces the
    # store's dict, so it is looked up each time).
    while pod.metadata.uid not in ext.view.fleet.pods:
        if loop.time() >= deadline:
            ext.metrics.watch_waits.labels("timed_out").inc()
            return
        await asyncio.sleep(WATCH_POLL)
    ext.metrics.watch_waits.labels("caught_up").inc()


def respond(view: PlacementView, answer: Answer, args: wire.ExtenderArgs) -> Reply:
    """One filter or prioritize request. The answer itself only reads the view; these are the
    request path's writes, each rebuilding the nodes it touches in every cached demand table:
    the pod asked about again stops counting where it was expected (it must not crowd itself
    out), the GPUs reserved for it are free for it alone while it is answered (every other pod
    finds them taken), and after prioritize it is expected on the node ranked first until the
    watch shows where it was bound (burst correction, view.py)."""
    assert args.Pod is not None  # decode_args refuses a request without one
    uid = args.Pod.metadata.uid
    view.settle()
    view.forget(uid)
    reserved = view.exempt(uid) if uid else None
    try:
        reply = answer(view, args)
    finally:
        if reserved is not None:
            view.unexempt(reserved)
    # No uid: a probe, or a pod the scheduler never binds under that uid.
    if uid and reply.best_node is not None:
        ranked = ranking(view, args.Pod, reply) if placement_log.isEnabledFor(logging.DEBUG) else ""
        view.expect(uid, reply.best_node)
        if ranked:
            placement_log.debug("%s; %s %s", ranked, _counted_as(view, uid), reply.best_node)
    return reply


def _counted_as(view: PlacementView, uid: str) -> str:
    """What ``expect`` made of the answer, for its debug line."""
    if uid in view.inflight:
        return "now expected on"
    if uid in view.parked:  # counts only once the watch shows the pod
        return "not watched yet, parked for"
    return "not counted (bound already, or every GPU expected) on"


def ranking(view: PlacementView, pod: WirePod, reply: Reply, top: int = 5) -> str:
    """One prioritize answer as a debug line: the best-scored nodes and what their scores
    counted (load with young and expected pods, GPUs allocated, expected, reserved), to tell
    why a pod went where it did. Decodes the reply: for debug logging only. Read before the
    answer's own expectation, which ``_counted_as`` says after."""
    entries = sorted(json.loads(reply.body), key=lambda e: -e["Score"])[:top]
    parts = []
    for e in entries:
        state = view.book.states.get(e["Host"])
        counted = "" if state is None else (
            f" (load {'unknown' if state.util is None else f'{state.util:.2f}'},"
            f" allocated {state.allocated}, expected {state.inflight},"
            f" reserved {state.reserved})")
        parts.append(f"{e['Host']}={e['Score']}{counted}")
    return f"ranked {pod.metadata.namespace}/{pod.metadata.name}: {', '.join(parts)}"


class _Refused(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


async def _body(request: web.Request) -> bytes:
    """The request body within the limits, or _Refused saying which one it broke."""
    limits, budget = request.app[LIMITS], request.app[_BUDGET]
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":
        raise _Refused(415, f"Content-Encoding {encoding!r} not accepted: send plain JSON "
                            "(kube-scheduler never compresses extender requests)")
    size = request.content_length
    if size is None:
        size = limits.max_body_bytes  # chunked: reserve the most it may grow to
    elif size > limits.max_body_bytes:
        raise _Refused(413, f"body of {size} bytes over the limit of {limits.max_body_bytes} "
                            "(raise it with --max-body-mb)")
    # Small bodies (the scheduler's node-name lists) get headroom that large ones cannot take,
    # so a few slow large uploads cannot starve them.
    headroom = _SMALL_HEADROOM if size <= _SMALL_BODY else 0
    if budget.used + size > budget.limit + headroom:
        raise _Refused(503, "too many large requests at once; retry")
    budget.used += size
    try:
        async with asyncio.timeout(limits.read_timeout):
            return await request.read()
    except TimeoutError as e:
        raise _Refused(408, f"body not received within {limits.read_timeout:g}s") from e
    except web.HTTPRequestEntityTooLarge as e:
        raise _Refused(413, f"{e.text} (raise the limit with --max-body-mb)") from e
    finally:
        budget.used -= size


async def _preempt(request: web.Request) -> web.Response:
    """The scheduler's preemption candidates, kept or dropped by their victims' idleness."""
    try:
        answered = request.app[preempt.PREEMPTER].respond(await _body(request))
    except (wire.BadRequest, _Refused) as e:
        return _refusal("preempt", e, _error(str(e)))
    # aiohttp writes the reply in this turn of the loop, as soon as the handler returns; the
    # decoded request is freed in the next, while the reply travels.
    asyncio.get_running_loop().call_soon(answered.spent.clear)
    return web.Response(body=answered.body, content_type=JSON)


def _refusal(verb: str, e: wire.BadRequest | _Refused, body: bytes) -> web.Response:
    status = e.status if isinstance(e, _Refused) else 400
    log.warning("bad %s request (%d): %s", verb, status, e)
    response = web.Response(body=body, status=status, content_type=JSON)
    if isinstance(e, _Refused):
        response.force_close()  # do not drain a body we would not read
    return response


def _verb(verb: str, answer: Answer) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        ext = request.app[EXTENDER]
        try:
            args = wire.decode_args(await _body(request))
            assert args.Pod is not None  # decode_args refuses a request without one
            await catch_up(ext, args.Pod)
            reply = respond(ext.view, answer, args)
        except (wire.BadRequest, _Refused) as e:
            return _refusal(verb, e, wire.error_result(str(e)) if verb == "filter"
                            else _error(str(e)))
        if reply.unknown_nodes:
            ext.metrics.unknown_nodes.labels(verb).inc(reply.unknown_nodes)
        return web.Response(body=reply.body, content_type=JSON)

    return handler


def _error(message: str) -> bytes:
    return b'{"Error":' + wire.encode_str(message) + b"}"


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def readyz(request: web.Request) -> web.Response:
    if request.app[EXTENDER].draining:
        return web.Response(text="shutting down", status=503)
    if request.app[EXTENDER].ready:
        return web.Response(text="ok")
    return web.Response(text="waiting for the first list of nodes and pods", status=503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[EXTENDER].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _background(app: web.Application) -> AsyncIterator[None]:
    ext = app[EXTENDER]

    def crashed() -> None:  # a bug here must not stop scheduling: log it and go on
        ext.metrics.refresh_errors.inc()
        log.exception("telemetry refresh crashed")

    watches = [w.run() for w in (*ext.watches, *ext.side_watches)]
    async with running(*watches, every(ext.refresh_seconds, ext.refresh, crashed)):
        yield
