"""Run the agent: start NVML (or decide what a missing driver means), then serve /metrics."""

from __future__ import annotations

import argparse
import asyncio
import logging

from aiohttp import web

from gpusteward.adapters.errors import ListenError, SettingsError
from gpusteward.adapters.nvml import NvmlReader, NvmlUnavailable
from gpusteward.agent.app import AgentDeps, AgentSettings, create_app

log = logging.getLogger("gpusteward.agent")

EXIT_NO_DRIVER = 1

__all__ = ["EXIT_NO_DRIVER", "run_agent"]


def run_agent(args: argparse.Namespace) -> int:
    if not args.node_name:
        raise SettingsError("--node-name or $NODE_NAME is required "
                            "(the Hostname label must be the Kubernetes node name)")
    reader = NvmlReader(xid_hold=args.xid_hold)
    try:
        asyncio.run(reader.start())
    except NvmlUnavailable as e:
        if args.on_missing_driver == "exit":
            log.error("NVML unavailable on %s (%s): %s; exiting", args.node_name, e.reason, e)
            return EXIT_NO_DRIVER
        log.error("NVML unavailable on %s (%s): %s; serving the error and retrying every %gs",
                  args.node_name, e.reason, e, args.interval)
    settings = AgentSettings(node=args.node_name, interval=args.interval,
                             pod_resources_socket=args.pod_resources_socket,
                             kube_api=args.kube_api == "auto", kubeconfig=args.kubeconfig)
    host, port = args.listen
    try:
        web.run_app(create_app(settings, AgentDeps(nvml=reader)), host=host, port=port,
                    print=None, access_log=None)
    except OSError as e:
        raise ListenError(host, port, e) from e
    return 0
