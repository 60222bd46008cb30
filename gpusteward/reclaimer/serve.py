"""Run the reclaimer: adapters wired to the loop, one active replica through a Lease,
`/healthz` and `/metrics` on --metrics-listen, and the `restore` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import uuid

from aiohttp import web
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpusteward.adapters.actor import Actor
from gpusteward.adapters.errors import ListenError, SettingsError
from gpusteward.adapters.kube import connect
from gpusteward.adapters.lease import LeaseGuard
from gpusteward.adapters.ledger import ConfigMapLedger
from gpusteward.adapters.promconnection import PrometheusConnection
from gpusteward.adapters.prometheus import PrometheusSource
from gpusteward.adapters.records import ConfigMapRecords, ObjectEvents
from gpusteward.adapters.restore import Restorer
from gpusteward.adapters.selfservice import SelfService
from gpusteward.adapters.snapshot import SnapshotReader
from gpusteward.adapters.webhook import Webhooks, read_url
from gpusteward.core.policy import Policy
from gpusteward.core.reclaim.model import SnoozeRecord
from gpusteward.reclaimer.loop import Reclaimer
from gpusteward.reclaimer.outbox import Entry, Outbox
from gpusteward.reclaimer.snoozes import SnoozeBook

log = logging.getLogger("gpusteward.reclaimer")


def _metrics_app(reclaimer: Reclaimer) -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(reclaimer.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/metrics", metrics)])
    return app


async def serve(policy: Policy, args: argparse.Namespace,
                prometheus: PrometheusConnection | None) -> int:
    if prometheus is None:
        log.error("no Prometheus URL (--prometheus-url, PROMETHEUS_URL or the policy's "
                  "telemetry.prometheusUrl): the reclaimer never acts without telemetry")
        return 2
    for sink in policy.notifications.sinks:
        read_url(sink)  # a sink without a readable URL is a setup error: exit 2, say which
    api = await connect(args.kubeconfig, args.context)
    source = PrometheusSource(prometheus, policy.telemetry, policy.health)
    webhooks = Webhooks(float(policy.notifications.timeout))
    reclaimer = Reclaimer(policy, args.mode or policy.reclaim.mode,
                          SnapshotReader(api, source, policy),
                          Actor(api, policy),
                          ledger=ConfigMapLedger(api, args.lease_namespace,
                                                 ledger_name(args.lease_name)),
                          snoozes=SnoozeBook(ConfigMapRecords(
                              api, args.lease_namespace, f"{args.lease_name}-snoozes",
                              SnoozeRecord), ObjectEvents(api)),
                          selfservice=SelfService(api, ObjectEvents(api)))
    if policy.notifications.sinks:
        reclaimer.outbox = Outbox(policy.notifications, webhooks, ConfigMapRecords(
            api, args.lease_namespace, f"{args.lease_name}-notifications", Entry),
            reclaimer.metrics)
    log.info("reclaimer mode=%s interval=%ss prometheus=%s", reclaimer.mode,
             float(policy.reclaim.interval), prometheus.describe())
    try:
        if args.once:
            await reclaimer.cycle()
            return 0
        return await _serve_forever(reclaimer, api, args)
    finally:
        await webhooks.close()
        await api.close()


async def _serve_forever(reclaimer: Reclaimer, api, args: argparse.Namespace) -> int:  # noqa: ANN001
    runner = web.AppRunner(_metrics_app(reclaimer), access_log=None)
    await runner.setup()
    host, port = args.metrics_listen
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        await runner.cleanup()
        raise ListenError(host, port, e) from e
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    election = asyncio.create_task(_lead(reclaimer, api, args))
    await asyncio.wait([election, asyncio.create_task(stop.wait())],
                       return_when=asyncio.FIRST_COMPLETED)
    failed = election.done() and not election.cancelled() and election.exception()
    if failed:
        log.error("leader election failed; exiting so the pod restarts", exc_info=failed)
    election.cancel()
    await asyncio.wait([election], timeout=5)  # lets it hand the Lease back
    await runner.cleanup()
    return 1 if failed else 0


async def _lead(reclaimer: Reclaimer, api, args: argparse.Namespace) -> None:  # noqa: ANN001
    """Only the Lease holder cycles. Every write checks the Lease with the API server first
    (the guard is the reclaimer's fence); a holder that cannot renew cancels its cycles."""
    identity = f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
    guard = LeaseGuard(api, args.lease_namespace, args.lease_name, identity,
                       int(args.lease_duration))
    reclaimer.fence = guard
    try:
        while True:
            log.info("waiting for the Lease %s/%s as %s", args.lease_namespace, args.lease_name,
                     identity)
            await guard.acquire()
            reclaimer.metrics.leader.set(1)
            reclaimer.reread_ledger()
            log.info("leading as %s (Lease %s/%s)", identity, args.lease_namespace,
                     args.lease_name)
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


def ledger_name(lease_name: str) -> str:
    """The ConfigMap beside the Lease that keeps the last hour's reclaims."""
    return f"{lease_name}-reclaims"


async def restore(args: argparse.Namespace) -> int:
    try:
        namespace, kind, name = args.target.split("/")
    except ValueError:
        raise SettingsError("expected NAMESPACE/KIND/NAME (KIND: Deployment, StatefulSet or "
                            f"Job), got {args.target!r}") from None
    api = await connect(args.kubeconfig, args.context)
    try:
        print(await Restorer(api).restore(namespace, kind, name))
        return 0
    except ValueError as e:
        log.error("%s", e)
        return 1
    except ApiException as e:
        log.error("restoring %s failed: HTTP %s %s", args.target, e.status, e.reason)
        return 1
    finally:
        await api.close()


def default_namespace() -> str:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip()
    except OSError:
        return os.environ.get("POD_NAMESPACE", "default")
