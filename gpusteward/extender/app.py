"""The extender's aiohttp application: thin handlers over the precomputed placement view.

Background work (watches, telemetry refresh) runs in `cleanup_ctx` tasks; handlers never call
Prometheus or the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpusteward.adapters.errors import TelemetryUnavailable
from gpusteward.core.model import Telemetry
from gpusteward.extender import preempt, wire
from gpusteward.extender.metrics import ExtenderMetrics
from gpusteward.extender.replies import Outcome, filter_reply, prioritize_reply
from gpusteward.extender.view import PlacementView

log = logging.getLogger("gpusteward.extender")

JSON = "application/json"


class TelemetrySource(Protocol):
    async def fetch(self) -> Telemetry: ...


class Watch(Protocol):
    synced: asyncio.Event

    async def run(self) -> None: ...


@dataclass
class Extender:
    view: PlacementView
    telemetry: TelemetrySource | None
    watches: Sequence[Watch] = ()
    refresh_seconds: float = 15.0
    metrics: ExtenderMetrics = field(default_factory=ExtenderMetrics)
    evidence: preempt.EvidenceSource | None = None  # per-pod idle evidence for /preempt
    last_ok: float = 0.0

    @property
    def ready(self) -> bool:
        return all(w.synced.is_set() for w in self.watches)

    async def refresh(self) -> None:
        """One telemetry tick: fetch, then rebuild every node state (also after a failure)."""
        telemetry = self.view.telemetry
        if self.telemetry is not None:
            try:
                telemetry = await self.telemetry.fetch()
                self.last_ok = telemetry.fetched_at
            except TelemetryUnavailable as e:
                self.metrics.refresh_errors.inc()
                log.warning("telemetry unavailable, scoring load and health as neutral: %s", e)
        self.view.set_telemetry(telemetry)
        now = self.view.clock()
        self.metrics.telemetry_age.set(now - self.last_ok if self.last_ok else float("inf"))
        self.metrics.stale_nodes.set(self.view.stale_nodes())
        self.metrics.nodes.set(len(self.view.fleet.nodes))


EXTENDER = web.AppKey("extender", Extender)


def create_app(extender: Extender, *, max_body_bytes: int = 64 << 20) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes)
    app[EXTENDER] = extender
    app.add_routes([
        web.post("/filter", _verb("filter", filter_reply)),
        web.post("/prioritize", _verb("prioritize", prioritize_reply)),
        web.get("/healthz", healthz),
        web.get("/readyz", readyz),
        web.get("/metrics", metrics),
    ])
    app.cleanup_ctx.append(_background)
    preempt.install(app, extender.view.policy, extender.view.fleet, extender.evidence,
                    extender.metrics)
    return app


Answer = Callable[[PlacementView, wire.ExtenderArgs], Outcome]


def _verb(verb: str, answer: Answer) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        ext = request.app[EXTENDER]
        started = time.perf_counter()
        status, body = 200, b""
        try:
            outcome = answer(ext.view, wire.decode_args(await request.read()))
            body = outcome.body
            if outcome.unknown_nodes:
                ext.metrics.unknown_nodes.labels(verb).inc(outcome.unknown_nodes)
        except wire.BadRequest as e:
            status = 400
            body = wire.error_result(str(e)) if verb == "filter" else _error(str(e))
            log.warning("bad %s request: %s", verb, e)
        except web.HTTPRequestEntityTooLarge as e:
            status = 413
            body = _error(f"{e.text} (raise the limit with --max-body-mb)")
            log.warning("bad %s request: %s", verb, e)
        ext.metrics.latency.labels(verb).observe(time.perf_counter() - started)
        ext.metrics.requests.labels(verb, str(status)).inc()
        return web.Response(body=body, status=status, content_type=JSON)

    return handler


def _error(message: str) -> bytes:
    return b'{"Error":' + wire.encode_str(message) + b"}"


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def readyz(request: web.Request) -> web.Response:
    if request.app[EXTENDER].ready:
        return web.Response(text="ok")
    return web.Response(text="waiting for the first list of nodes and pods", status=503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[EXTENDER].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _refresh_loop(ext: Extender) -> None:
    while True:
        try:
            await ext.refresh()
        except Exception:  # a bug here must not stop scheduling: log it and go on
            log.exception("telemetry refresh crashed")
        await asyncio.sleep(ext.refresh_seconds)


async def _background(app: web.Application) -> AsyncIterator[None]:
    ext = app[EXTENDER]
    tasks = [asyncio.create_task(w.run()) for w in ext.watches]
    tasks.append(asyncio.create_task(_refresh_loop(ext)))
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
