"""Run the extender for real: connect the adapters, then serve until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from kubernetes_asyncio import client

from gpusteward.adapters.dra import KINDS as DRA_KINDS
from gpusteward.adapters.dra import DraWatcher
from gpusteward.adapters.errors import ListenError, SettingsError
from gpusteward.adapters.kube import Watcher, connect
from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.snapshot import SnapshotReader
from gpusteward.adapters.telemetry import PrometheusSource
from gpusteward.core.drafleet import DraFleet
from gpusteward.core.fleet import FleetStore
from gpusteward.extender.app import Extender, RequestLimits, create_app, create_metrics_app
from gpusteward.extender.cli import ExtenderSettings
from gpusteward.extender.guard import ConnectionGuard
from gpusteward.extender.view import PlacementView

log = logging.getLogger("gpusteward.extender")
# A quarter of the scheduler's usual httpTimeout (2 s, the shipped configs): a watch is
# milliseconds behind the scheduler's informer, and a call never waits near the point where the
# scheduler gives up on it.
WATCH_WAIT = 0.5
_AIOHTTP_SERVER_LOG = logging.getLogger("aiohttp.server")


def run_extender(args: argparse.Namespace) -> int:
    return asyncio.run(serve(ExtenderSettings.from_args(args, os.environ)))


async def serve(settings: ExtenderSettings) -> int:
    files = settings.tls
    try:
        tls = server_tls(files.cert, files.key, files.client_ca)
    except ValueError as e:
        raise SettingsError(f"TLS: {e}") from e
    except OSError as e:  # ssl.SSLError too; neither names the file
        named = ", ".join(f for f in (files.cert, files.key, files.client_ca) if f)
        raise SettingsError(f"TLS: cannot load {named}: {e.strerror or e}") from e
    api = await connect(settings.kubeconfig, settings.context)
    async with contextlib.AsyncExitStack() as stack:
        # Whatever fails below (a busy port) still stops the watches and closes the client.
        stack.push_async_callback(api.close)
        return await _serve(settings, build_extender(settings, api), tls, stack)


def build_extender(settings: ExtenderSettings, api: client.ApiClient) -> Extender:
    """The extender wired to its adapters: watches of Nodes and Pods, Prometheus telemetry and
    the reclaimer's idle evidence (none without a Prometheus URL)."""
    policy, prometheus = settings.policy, settings.prometheus
    fleet = FleetStore()
    dra = DraFleet(fleet, settings.dra_driver)
    view = PlacementView(policy, fleet, dra=dra)
    telemetry = evidence = None
    if prometheus:
        # one client: the refresh and the preempt verb's evidence share what it knows of names
        prom = PrometheusClient(prometheus, policy.telemetry)
        telemetry = PrometheusSource(prom, policy.telemetry, policy.health,
                                     locate=lambda: (fleet.nodes, fleet.pod_nodes()))
        # the reclaimer's idle evidence
        evidence = SnapshotReader(api, prom, policy, dra_driver=settings.dra_driver)
    else:
        log.warning("no Prometheus URL (--prometheus-url, PROMETHEUS_URL or policy): "
                    "load and health terms stay neutral")
    watches = [Watcher(api, dra, kind, policy.resources) for kind in ("nodes", "pods")]
    return Extender(view, telemetry, watches, float(policy.telemetry.refresh),
                    evidence=evidence, watch_wait=WATCH_WAIT,
                    side_watches=[DraWatcher(api, dra, kind) for kind in DRA_KINDS])


async def _serve(settings: ExtenderSettings, extender: Extender, tls: ssl.SSLContext | None,
                 stack: contextlib.AsyncExitStack) -> int:
    max_body = settings.max_body_bytes
    app = create_app(extender, limits=RequestLimits(max_body_bytes=max_body,
                                                    body_budget_bytes=3 * max_body))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    host, port = settings.listen
    transport = Transport(first_byte_timeout=settings.first_byte_timeout,
                          header_timeout=settings.header_timeout)
    listener = await listen(runner, extender, host, port, tls, transport)
    stack.push_async_callback(listener.close)
    if tls is not None:
        assert settings.tls.cert and settings.tls.key  # server_tls loaded them
        reloader = asyncio.create_task(
            CertificateReloader(tls, settings.tls.cert, settings.tls.key).run())
        stack.callback(reloader.cancel)
    if settings.metrics_listen:
        metrics_runner = web.AppRunner(create_metrics_app(extender), access_log=None)
        await metrics_runner.setup()
        stack.push_async_callback(metrics_runner.cleanup)
        await start_site(web.TCPSite(metrics_runner, *settings.metrics_listen),
                         *settings.metrics_listen)
        log.info("metrics and probes on %s:%d", *settings.metrics_listen)
    prometheus = settings.prometheus
    log.info("extender listening on %s:%d (%s; prometheus: %s)", host, port,
             "TLS" + (" with client certificates" if settings.tls.client_ca else "")
             if tls else "plain HTTP", prometheus.describe() if prometheus else "none")
    stop, hurry = asyncio.Event(), asyncio.Event()

    def signalled() -> None:  # the first signal drains, a second one stops at once
        (hurry if stop.is_set() else stop).set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled)
    await stop.wait()
    await drain(extender, settings.shutdown_delay, hurry)
    log.info("shutting down")
    return 0


async def drain(extender: Extender, delay: float, hurry: asyncio.Event) -> None:
    """Keep answering for ``delay`` seconds after SIGTERM, readiness off and each connection
    closed after its answer. Kubernetes takes a terminating pod out of the Service's endpoints
    while it runs, and kube-proxy follows within a second or two; until then new connections
    still arrive here, and a scheduler call refused now would place its pod without the
    extender (``ignorable: true``). After the delay no connection is left to race a close."""
    extender.draining = True
    log.info("draining: not ready, closing each connection after its answer; stopping in %gs "
             "(a second signal stops now)", delay)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay):
            await hurry.wait()


async def start_site(site: web.TCPSite, host: str, port: int) -> None:
    try:
        await site.start()
    except OSError as e:
        raise ListenError(host, port, e) from e


def server_tls(cert: str | None, key: str | None, client_ca: str | None) -> ssl.SSLContext | None:
    """The extender's TLS, as kube-scheduler's extender ``tlsConfig`` (certFile, keyFile,
    caFile) expects it: our certificate, and with a client CA only clients it signed."""
    if not cert and not key and not client_ca:
        return None
    if not cert or not key:
        raise ValueError("--tls-cert-file and --tls-key-file go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if client_ca:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class CertificateReloader:
    """Re-reads the certificate and key when their files change (a rotated Secret): new
    handshakes use the new pair, open connections keep theirs. A pair that does not load (a
    rotation half written) is logged and the old one kept until the next check."""

    def __init__(self, context: ssl.SSLContext, cert: str, key: str):
        self.context, self.cert, self.key = context, cert, key
        self._seen = self._stamp()

    def _stamp(self) -> tuple[tuple[int, int, int], ...]:
        # A Secret volume swaps a symlink: the inode changes even when the time does not.
        return tuple((st.st_mtime_ns, st.st_ino, st.st_size)
                     for st in (os.stat(self.cert), os.stat(self.key)))

    def check(self) -> bool:
        """True when a changed pair was loaded."""
        try:
            stamp = self._stamp()
            if stamp == self._seen:
                return False
            self.context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as e:
            log.warning("TLS certificate changed but could not be loaded, keeping the old: %s", e)
            return False
        self._seen = stamp
        log.info("TLS certificate reloaded from %s", self.cert)
        return True

    async def run(self, every: float = 60.0) -> None:
        while True:
            await asyncio.sleep(every)
            self.check()


@dataclass(frozen=True)
class Transport:
    """Connection limits (docs/operations.md, "Request limits")."""

    max_connections: int = 256  # one scheduler keeps a handful; a cap stops a flood
    request_timeout: float = 10.0  # first byte of a request to its answer (headers and body)
    # A new connection's first byte (TLS: its handshake, then its first byte) and a request's
    # headers; kube-scheduler writes each at once (--first-byte-timeout, --header-timeout).
    first_byte_timeout: float = 5.0
    header_timeout: float = 5.0
    backlog: int = 128


class Listener:
    def __init__(self, server: asyncio.Server, guard: ConnectionGuard,
                 sweeper: asyncio.Task[None]):
        self.server = server
        self.guard = guard
        self._sweeper = sweeper

    async def close(self) -> None:
        self._sweeper.cancel()
        self.server.close()
        await asyncio.gather(self._sweeper, return_exceptions=True)


class _ClientErrorTraceback(logging.Filter):
    """aiohttp logs a request it cannot parse with a traceback at ERROR; _counting_errors has
    logged it as one warning line already."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, HttpProcessingError) and 400 <= exc.code < 500)


def _counting_errors(server: web.Server, extender: Extender) -> Callable[[], asyncio.Protocol]:
    """aiohttp answers a request it cannot parse (bad framing, headers, chunking) itself, past
    the app's middleware: count those answers too, as verb "other". RequestHandler has slots
    and no hook, so each one is given a subclass that only adds the count."""
    requests = extender.metrics.requests

    class Counting(RequestHandler):
        __slots__ = ()

        def handle_error(self, request: Any, status: int = 500,
                         exc: BaseException | None = None,
                         message: str | None = None) -> web.StreamResponse:
            requests.labels("other", str(status)).inc()
            if 400 <= status < 500:
                log.warning("unreadable HTTP request (%d): %s", status, exc)
            return super().handle_error(request, status, exc, message)

    def make() -> asyncio.Protocol:
        handler = server()
        handler.__class__ = Counting
        return handler

    return make


async def listen(runner: web.AppRunner, extender: Extender, host: str, port: int,
                 tls: ssl.SSLContext | None, transport: Transport) -> Listener:
    """Serve the app on host:port through the connection guard (runner set up already)."""
    assert runner.server is not None
    closed = extender.metrics.connections_closed
    if not any(isinstance(f, _ClientErrorTraceback) for f in _AIOHTTP_SERVER_LOG.filters):
        _AIOHTTP_SERVER_LOG.addFilter(_ClientErrorTraceback())
    guard = ConnectionGuard(_counting_errors(runner.server, extender),
                            max_connections=transport.max_connections,
                            request_timeout=transport.request_timeout,
                            first_byte_timeout=transport.first_byte_timeout,
                            header_timeout=transport.header_timeout,
                            on_close=lambda reason: closed.labels(reason).inc())
    try:
        # A client that never starts its handshake is a silent socket: the first-byte deadline.
        server = await asyncio.get_running_loop().create_server(
            guard, host, port, ssl=tls, backlog=transport.backlog,
            ssl_handshake_timeout=transport.first_byte_timeout if tls else None)
    except OSError as e:
        raise ListenError(host, port, e) from e
    return Listener(server, guard, asyncio.create_task(guard.run()))
