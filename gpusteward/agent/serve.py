"""Run the agent: start NVML (or decide what a missing driver means), then serve /metrics."""

from __future__ import annotations

import argparse
import asyncio
import logging

from aiohttp import web

from gpusteward.adapters.errors import ListenError
from gpusteward.adapters.nvml import NvmlReader, NvmlUnavailable
from gpusteward.agent.app import AgentDeps, create_app
from gpusteward.agent.cli import AgentSettings

log = logging.getLogger("gpusteward.agent")

EXIT_NO_DRIVER = 1

__all__ = ["EXIT_NO_DRIVER", "run_agent"]


def run_agent(args: argparse.Namespace) -> int:
    settings = AgentSettings.from_args(args)
    reader = NvmlReader(xid_hold=settings.xid_hold)
    try:
        asyncio.run(reader.start())
    except NvmlUnavailable as e:
        if settings.on_missing_driver == "exit":
            log.error("NVML unavailable on %s (%s): %s; exiting", settings.node, e.reason, e)
            return EXIT_NO_DRIVER
        log.error("NVML unavailable on %s (%s): %s; serving the error and retrying every %gs",
                  settings.node, e.reason, e, settings.interval)
    host, port = settings.listen
    try:
        web.run_app(create_app(settings, AgentDeps(nvml=reader)), host=host, port=port,
                    print=None, access_log=None)
    except OSError as e:
        raise ListenError(host, port, e) from e
    return 0
