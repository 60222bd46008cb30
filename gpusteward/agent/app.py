"""The agent's aiohttp app: a background collector and two thin handlers.

The collector reads NVML, asks the kubelet which pod holds which GPU, maps the processes of
shared GPUs to pods (their UIDs from /proc, names from the API server when the agent may ask)
and renders the exposition once per interval; ``/metrics`` only returns the last text, so a slow
or lost GPU never delays a scrape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from aiohttp import web

from gpusteward.adapters import buildinfo
from gpusteward.adapters.background import every, running
from gpusteward.adapters.dradevices import DraDevices, slice_lister
from gpusteward.adapters.errors import KubeConfigError
from gpusteward.adapters.kube import connect
from gpusteward.adapters.nvml import NvmlReader, NvmlUnavailable
from gpusteward.adapters.pidmap import read_owners
from gpusteward.adapters.podresources import (
    PodResourcesClient,
    PodResourcesUnavailable,
)
from gpusteward.agent.cli import AgentSettings
from gpusteward.agent.collect import AgentView, collect, shared, unavailable_view
from gpusteward.agent.exposition import render
from gpusteward.agent.poddirectory import PodDirectory, api_lister
from gpusteward.core.nodereadings import DeviceAssignment, NvmlSnapshot, PidOwner, Problem

log = logging.getLogger("gpusteward.agent")

# The text format's media type, version and charset as prometheus/common's expfmt writes it
# (FmtText): Prometheus 3 fails a scrape whose Content-Type is missing or not one it knows,
# where 2.x fell back to text (Prometheus 3.0 migration guide, "Scrape protocols"; CHANGELOG
# 3.0.0, #15136).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUILD_INFO = buildinfo.exposition()


@dataclass
class AgentDeps:
    nvml: NvmlReader = field(default_factory=NvmlReader)
    pod_resources: PodResourcesClient | None = None
    pods: PodDirectory | None = None
    dra: DraDevices | None = None  # UUIDs of GPUs held through DRA claims


@dataclass
class Exported:
    """What the handlers read: the last rendered text and how the last collection went."""

    text: str = ""
    view: AgentView | None = None
    collected_at: float = 0.0
    pod_resources_ok: bool | None = None


SETTINGS = web.AppKey("settings", AgentSettings)
DEPS = web.AppKey("deps", AgentDeps)
EXPORTED = web.AppKey("exported", Exported)


async def _assignments(
    deps: AgentDeps, exported: Exported, socket: str
) -> tuple[tuple[DeviceAssignment, ...], list[Problem]]:
    client = deps.pod_resources or PodResourcesClient(socket)
    try:
        held = await client.list(deps.dra)
    except PodResourcesUnavailable as e:
        if exported.pod_resources_ok is not False:
            log.warning("exporting GPU metrics without pod labels: %s", e)
        exported.pod_resources_ok = False
        return (), [Problem.POD_RESOURCES_UNAVAILABLE]
    if exported.pod_resources_ok is False:
        log.info("kubelet pod-resources socket answers again; pod labels are back")
    exported.pod_resources_ok = True
    return held, []


async def collect_once(settings: AgentSettings, deps: AgentDeps, exported: Exported) -> None:
    """One collection; NVML being unavailable is published, never raised."""
    try:
        if not deps.nvml.started:
            await deps.nvml.start()
        snapshot = await deps.nvml.read()
    except NvmlUnavailable as e:
        log.error("NVML unavailable on %s: %s", settings.node, e, extra={"node": settings.node})
        _publish(exported, unavailable_view(settings.node, e.reason), settings)
        return
    held, problems = await _assignments(deps, exported, settings.pod_resources_socket)
    owners = await _owners(snapshot, held, settings, deps, problems)
    _publish(exported, collect(snapshot, settings.node, held, owners, problems), settings)


async def _owners(snapshot: NvmlSnapshot, held: tuple[DeviceAssignment, ...],
                  settings: AgentSettings, deps: AgentDeps,
                  problems: list[Problem]) -> dict[int, PidOwner]:
    """The pods of the processes on shared GPUs (the only ones split per pod)."""
    sharing = shared(held)
    pids = {p.pid for gpu in snapshot.gpus if gpu.uuid in sharing for p in gpu.processes}
    owners = await asyncio.to_thread(read_owners, pids, settings.proc_root) if pids else {}
    if not owners:
        return owners
    if deps.pods is not None:
        names = await deps.pods.resolve(o.pod_uid for o in owners.values())
        owners = {pid: replace(o, pod=names.get(o.pod_uid)) for pid, o in owners.items()}
    if deps.pods is None or deps.pods.ok is False:
        problems.append(Problem.POD_NAMES_FROM_HOSTNAME)
    return owners


def _publish(exported: Exported, view: AgentView, settings: AgentSettings) -> None:
    exported.view = view
    exported.text = render(view, settings.node_label)
    exported.collected_at = time.time()


async def _pod_directory(settings: AgentSettings) -> tuple[PodDirectory | None, Any]:
    """A directory over the API server, or None (with a warning) when there is no access."""
    if not settings.kube_api:
        return None, None
    try:
        api = await connect(settings.kubeconfig)
    except KubeConfigError as e:
        log.warning("no API server access, so pods sharing a GPU are named from HOSTNAME: %s", e)
        return None, None
    return PodDirectory(api_lister(api, settings.node)), api


async def _with_api(settings: AgentSettings, deps: AgentDeps) -> Any:
    """The API server's pod directory and DRA device UUIDs, when the agent may use it."""
    deps.pods, api = await _pod_directory(settings)
    if api is not None and deps.dra is None:
        deps.dra = DraDevices(slice_lister(api, settings.node))
    return api


async def _collector(app: web.Application) -> AsyncIterator[None]:
    settings, deps, exported = app[SETTINGS], app[DEPS], app[EXPORTED]
    api = None
    if deps.pods is None:
        api = await _with_api(settings, deps)

    once = partial(collect_once, settings, deps, exported)

    def crashed() -> None:  # keep serving the last text; the next cycle tries again
        log.exception("collection failed on %s", settings.node)

    await once()  # serve real data from the first scrape on
    async with running(every(settings.interval, once, crashed, wait_first=True),
                       name="gpusteward-agent-collector"):
        yield
    with contextlib.suppress(NvmlUnavailable):
        await deps.nvml.close()
    if api is not None:
        await api.close()


async def metrics(request: web.Request) -> web.Response:
    text = request.app[EXPORTED].text + BUILD_INFO
    # body, not text=: aiohttp's content_type takes no parameters but the charset
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})


async def healthz(request: web.Request) -> web.Response:
    exported = request.app[EXPORTED]
    age = time.time() - exported.collected_at
    stale = age > 3 * request.app[SETTINGS].interval + 10
    if exported.view is None or stale:
        return web.Response(status=503, text=f"no collection for {age:.0f}s\n")
    if exported.view.nvml_error:
        return web.Response(text=f"serving an error: NVML {exported.view.nvml_error}\n")
    return web.Response(text="ok\n")


def create_app(settings: AgentSettings, deps: AgentDeps | None = None) -> web.Application:
    app = web.Application()
    app[SETTINGS] = settings
    app[DEPS] = deps or AgentDeps()
    app[EXPORTED] = Exported()
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz)])
    app.cleanup_ctx.append(_collector)
    return app
