"""``gpusteward agent``: its flags and the typed settings they make.

Wired into the main command by its ``gpusteward.cli.COMMANDS`` entry, which names
``add_agent_flags`` and ``serve.run_agent`` (the missing-driver decision, and serving). Flags and
settings only (argparse, no NVML, gRPC or aiohttp): loaded only when the command line names
this command.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from gpusteward.adapters.connectflags import hostport
from gpusteward.adapters.errors import SettingsError
from gpusteward.adapters.logs import add_log_flags

ON_MISSING_DRIVER = ("exit", "serve-error")
# adapters.podresources.DEFAULT_SOCKET, the kubelet's (a test holds the two equal; that module
# loads gRPC, which a flag should not)
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

__all__ = ["ON_MISSING_DRIVER", "AgentSettings", "add_agent_flags"]


@dataclass(frozen=True)
class AgentSettings:
    node: str
    interval: float = 15.0  # seconds between NVML reads; dcgm-exporter's chart scrapes at 15 s
    pod_resources_socket: str = POD_RESOURCES_SOCKET
    proc_root: Path = Path("/proc")  # the host's /proc (hostPID) to map GPU PIDs to pods
    node_label: str = "Hostname"  # dcgm-exporter's released name for the node label
    kube_api: bool = False  # name shared GPUs' pods through the API server (else HOSTNAME)
    kubeconfig: str | None = None  # None: $KUBECONFIG, else the in-cluster service account
    listen: tuple[str, int] = ("0.0.0.0", 9400)
    xid_hold: float = 300.0  # how long the XID gauge shows an XID after its last event
    on_missing_driver: str = "exit"  # or "serve-error" (ON_MISSING_DRIVER)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AgentSettings:
        """The checked settings (variables are already the flags' defaults: connectflags);
        raises SettingsError naming what is wrong."""
        if not args.node_name:
            raise SettingsError("--node-name or $NODE_NAME is required "
                                "(the Hostname label must be the Kubernetes node name)")
        return cls(node=args.node_name, interval=args.interval,
                   pod_resources_socket=args.pod_resources_socket,
                   kube_api=args.kube_api == "auto", kubeconfig=args.kubeconfig,
                   listen=args.listen, xid_hold=args.xid_hold,
                   on_missing_driver=args.on_missing_driver)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def add_agent_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", type=hostport, default="0.0.0.0:9400", metavar="HOST:PORT",
                   help="/metrics and /healthz (9400 is dcgm-exporter's port)")
    p.add_argument("--node-name",
                   help="value of the Hostname label (default $NODE_NAME; required)")
    p.add_argument("--interval", type=_seconds, default=15.0, metavar="SECONDS",
                   help="seconds between NVML reads (default 15)")
    p.add_argument("--xid-hold", type=_seconds, default=300.0, metavar="SECONDS",
                   help="how long DCGM_FI_DEV_XID_ERRORS shows an XID after its last event "
                        "(default 300, dcgm-exporter's XID count window)")
    p.add_argument("--pod-resources-socket", default=POD_RESOURCES_SOCKET, metavar="PATH",
                   help=f"kubelet PodResources socket (default {POD_RESOURCES_SOCKET})")
    p.add_argument("--kube-api", choices=("auto", "off"), default="auto",
                   help="name the pods sharing a GPU through the API server (list pods on this "
                        "node; default auto: when credentials exist) or only from HOSTNAME")
    p.add_argument("--kubeconfig", help="default $KUBECONFIG, else the in-cluster account")
    p.add_argument("--on-missing-driver", choices=ON_MISSING_DRIVER, default="exit",
                   help="no NVML library or driver: exit non-zero (default) or keep serving "
                        "gpusteward_agent_nvml_up 0 and retry every interval")
    add_log_flags(p)
