"""Run the extender for real: connect the adapters, then serve until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from aiohttp import web

from gpusteward.adapters.errors import KubeConfigError
from gpusteward.adapters.kube import Watcher, connect
from gpusteward.adapters.promconnection import PrometheusConnection
from gpusteward.adapters.prometheus import PrometheusSource
from gpusteward.adapters.snapshot import SnapshotReader
from gpusteward.core.fleet import FleetStore
from gpusteward.core.policy import Policy
from gpusteward.extender.app import Extender, create_app
from gpusteward.extender.view import PlacementView

log = logging.getLogger("gpusteward.extender")


async def serve(policy: Policy, args: argparse.Namespace,
                prometheus: PrometheusConnection | None) -> int:
    try:
        api = await connect(args.kubeconfig, args.context)
    except KubeConfigError as e:
        log.error("%s", e)
        return 2
    fleet = FleetStore()
    view = PlacementView(policy, fleet)
    telemetry = evidence = None
    if prometheus:
        telemetry = PrometheusSource(prometheus, policy.telemetry, policy.health)
        evidence = SnapshotReader(api, telemetry, policy)  # the reclaimer's idle evidence
    else:
        log.warning("no Prometheus URL (--prometheus-url, PROMETHEUS_URL or policy): "
                    "load and health terms stay neutral")
    watches = [Watcher(api, fleet, kind, policy.resources) for kind in ("nodes", "pods")]
    extender = Extender(view, telemetry, watches, float(policy.telemetry.refresh),
                        evidence=evidence)
    app = create_app(extender, max_body_bytes=args.max_body_mb << 20)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = args.listen
    await web.TCPSite(runner, host, port).start()
    log.info("extender listening on %s:%d (prometheus: %s)", host, port,
             prometheus.describe() if prometheus else "none")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await runner.cleanup()
    await api.close()
    return 0
