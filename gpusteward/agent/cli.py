"""``gpusteward agent``: flags, the missing-driver decision, and serving.

Wired into the main command by ``gpusteward.cli`` through ``add_agent_parser`` and
``run_agent``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from aiohttp import web

from gpusteward.adapters.connectflags import hostport
from gpusteward.adapters.errors import ListenError, SettingsError
from gpusteward.adapters.logs import add_log_flags
from gpusteward.adapters.nvml import NvmlReader, NvmlUnavailable
from gpusteward.adapters.podresources import DEFAULT_SOCKET
from gpusteward.agent.app import AgentDeps, AgentSettings, create_app

log = logging.getLogger("gpusteward.agent")

EXIT_NO_DRIVER = 1
ON_MISSING_DRIVER = ("exit", "serve-error")

__all__ = ["add_agent_parser", "run_agent"]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def add_agent_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "agent", help="serve dcgm-exporter-compatible GPU metrics read through NVML (per node)"
    )
    p.add_argument("--listen", type=hostport, default="0.0.0.0:9400", metavar="HOST:PORT",
                   help="/metrics and /healthz (9400 is dcgm-exporter's port)")
    p.add_argument("--node-name",
                   help="value of the Hostname label (default $NODE_NAME; required)")
    p.add_argument("--interval", type=_seconds, default=15.0, metavar="SECONDS",
                   help="seconds between NVML reads (default 15)")
    p.add_argument("--xid-hold", type=_seconds, default=300.0, metavar="SECONDS",
                   help="how long DCGM_FI_DEV_XID_ERRORS shows an XID after its last event "
                        "(default 300, dcgm-exporter's XID count window)")
    p.add_argument("--pod-resources-socket", default=DEFAULT_SOCKET, metavar="PATH",
                   help=f"kubelet PodResources socket (default {DEFAULT_SOCKET})")
    p.add_argument("--kube-api", choices=("auto", "off"), default="auto",
                   help="name the pods sharing a GPU through the API server (list pods on this "
                        "node; default auto: when credentials exist) or only from HOSTNAME")
    p.add_argument("--kubeconfig", help="default $KUBECONFIG, else the in-cluster account")
    p.add_argument("--on-missing-driver", choices=ON_MISSING_DRIVER, default="exit",
                   help="no NVML library or driver: exit non-zero (default) or keep serving "
                        "gpusteward_agent_nvml_up 0 and retry every interval")
    add_log_flags(p)
    return p


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
