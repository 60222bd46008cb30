"""Run the reclaimer: adapters wired to the loop, one active replica through a Lease,
`/healthz` and `/metrics` on --metrics-listen, and the `restore` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import time
import uuid

from aiohttp import web
from kubernetes_asyncio import client
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpusteward.adapters.errors import AdapterError, KubeRefused, ListenError
from gpusteward.adapters.events import ObjectEvents
from gpusteward.adapters.kube import GatedClient, connect, kube_errors
from gpusteward.adapters.lease import LeaseGuard
from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.records import ConfigMapRecords
from gpusteward.adapters.snapshot import SnapshotReader
from gpusteward.adapters.webhook import Webhooks, read_url
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim import kinds
from gpusteward.core.reclaim.model import SnoozeRecord
from gpusteward.reclaimer.actor import Actor
from gpusteward.reclaimer.cli import ReclaimerSettings, RestoreSettings
from gpusteward.reclaimer.ledger import ConfigMapLedger
from gpusteward.reclaimer.loop import Reclaimer
from gpusteward.reclaimer.outbox import Entry, Outbox
from gpusteward.reclaimer.restore import Restorer
from gpusteward.reclaimer.selfservice import SelfService
from gpusteward.reclaimer.snoozes import SnoozeBook
from gpusteward.reclaimer.stopped import stopped, table
from gpusteward.reclaimer.stops import StopBook

log = logging.getLogger("gpusteward.reclaimer")


def run_reclaimer(args: argparse.Namespace) -> int:
    if args.reclaimer_command == "restore":
        return asyncio.run(restore(RestoreSettings.from_args(args)))
    return asyncio.run(serve(ReclaimerSettings.from_args(args, os.environ)))


def _metrics_app(reclaimer: Reclaimer) -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(reclaimer.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/metrics", metrics)])
    return app


def build_reclaimer(settings: ReclaimerSettings, api: client.ApiClient,
                    prometheus_attempts: int = 3, webhooks: Webhooks | None = None) -> Reclaimer:
    """The reclaimer wired to its adapters: snapshots from the API server and Prometheus,
    actions through the Actor, the last hour's reclaims in the ledger, each stop in the stop
    record, snoozes and restore requests, and (given ``webhooks`` and sinks) the notification
    outbox."""
    policy, namespace = settings.policy, settings.lease_namespace
    source = PrometheusClient(settings.prometheus, policy.telemetry,
                              attempts=prometheus_attempts)
    ledger = ConfigMapLedger(api, namespace, settings.ledger) if settings.ledger else None
    snoozes = SnoozeBook(ConfigMapRecords(api, namespace, settings.snoozes, SnoozeRecord)
                         if settings.snoozes else None, ObjectEvents(api))
    stops = StopBook(api, namespace, settings.stops, _catalog(policy))
    reclaimer = Reclaimer(policy, settings.mode,
                          SnapshotReader(api, source, policy, dra_driver=settings.dra_driver),
                          Actor(api, policy), ledger=ledger, snoozes=snoozes, stops=stops,
                          selfservice=SelfService(api, ObjectEvents(api), stops,
                                                  _catalog(policy)))
    if webhooks is not None and policy.notifications.sinks and settings.notifications:
        reclaimer.outbox = Outbox(policy.notifications, webhooks, ConfigMapRecords(
            api, namespace, settings.notifications, Entry), reclaimer.metrics)
    return reclaimer


async def serve(settings: ReclaimerSettings) -> int:
    for sink in settings.policy.notifications.sinks:
        read_url(sink)  # a sink without a readable URL is a setup error: exit 2, say which
    api = await connect(settings.kubeconfig, settings.context)
    webhooks = Webhooks(float(settings.policy.notifications.timeout))
    reclaimer = build_reclaimer(settings, api, webhooks=webhooks)
    log.info("reclaimer mode=%s interval=%ss prometheus=%s", reclaimer.mode,
             float(settings.policy.reclaim.interval), settings.prometheus.describe())
    try:
        if settings.once:
            await reclaimer.cycle()
            return 0
        return await _serve_forever(reclaimer, api, settings)
    finally:
        await webhooks.close()
        await api.close()


async def _serve_forever(reclaimer: Reclaimer, api: GatedClient,
                         settings: ReclaimerSettings) -> int:
    runner = web.AppRunner(_metrics_app(reclaimer), access_log=None)
    await runner.setup()
    host, port = settings.metrics_listen
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        await runner.cleanup()
        raise ListenError(host, port, e) from e
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    election = asyncio.create_task(_lead(reclaimer, api, settings))
    await asyncio.wait([election, asyncio.create_task(stop.wait())],
                       return_when=asyncio.FIRST_COMPLETED)
    failed = election.done() and not election.cancelled() and election.exception()
    if failed:
        log.error("leader election failed; exiting so the pod restarts", exc_info=failed)
    election.cancel()
    await asyncio.wait([election], timeout=5)  # lets it hand the Lease back
    await runner.cleanup()
    return 1 if failed else 0


async def _lead(reclaimer: Reclaimer, api: GatedClient, settings: ReclaimerSettings) -> None:
    """Only the Lease holder cycles. Every action checks the Lease with the API server first
    (the guard is the reclaimer's fence), every write request its local deadline (the client's
    gate); a holder that cannot renew cancels its cycles."""
    identity = f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
    guard = LeaseGuard(api, settings.lease_namespace, settings.lease_name, identity,
                       settings.lease_duration)
    reclaimer.fence = guard
    api.gate = guard.may_write
    try:
        while True:
            log.info("waiting for the Lease %s/%s as %s", settings.lease_namespace,
                     settings.lease_name, identity)
            await guard.acquire()
            reclaimer.metrics.leader.set(1)
            reclaimer.reread_ledger()
            log.info("leading as %s (Lease %s/%s)", identity, settings.lease_namespace,
                     settings.lease_name)
            acting = asyncio.create_task(reclaimer.run())
            holding = asyncio.create_task(guard.hold())
            tasks = [acting, holding]
            if reclaimer.outbox is not None:  # delivers beside the cycles, never inside them
                reclaimer.outbox.restart()
                tasks.append(asyncio.create_task(reclaimer.outbox.run(guard.check)))
            await asyncio.wait([acting, holding], return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()
            reclaimer.metrics.leader.set(0)
            why = holding.result() if holding.done() and not holding.cancelled() else "?"
            log.warning("lost the Lease (%s); cycles stopped, standing by", why)
    finally:
        await asyncio.shield(guard.release())


async def restore(settings: RestoreSettings) -> int:
    api = await connect(settings.kubeconfig, settings.context)
    catalog = _catalog(settings.policy)
    stops = StopBook(api, settings.lease_namespace, settings.stops, catalog)
    if settings.list_stopped:
        async with api:
            print(table(await stopped(api, catalog, stops)))
        return 0
    try:
        with kube_errors():
            print(await Restorer(api, stops, time.time(), catalog).restore(
                settings.namespace, settings.kind, settings.name))
        return 0
    except KubeRefused as e:
        log.error("restoring %s failed: HTTP %s %s", settings.target, e.status, e.reason)
        return 1
    except (ValueError, AdapterError) as e:  # refused, or the stop record is unreadable
        log.error("%s", e)
        return 1
    finally:
        await api.close()


def _catalog(policy: Policy | None) -> kinds.Catalog:
    """The kinds stopped through a switch: gpusteward's own and the policy's."""
    return kinds.DEFAULT if policy is None else kinds.Catalog.of(
        policy.reclaim.owner_actions.kinds)
