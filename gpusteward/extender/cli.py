"""``gpusteward extender``: its flags and the typed settings they make.

Wired into the main command by its ``gpusteward.cli.COMMANDS`` entry, which names
``add_extender_flags`` and ``serve.run_extender``; ``serve.build_extender`` and ``serve.serve``
take the settings. Flags and settings only (argparse, the core's policy): loaded only when the
command line names this command.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass

from gpusteward.adapters.connectflags import (
    add_connection_flags,
    hostport,
    prometheus_connection,
    whole_number,
)
from gpusteward.adapters.policyfile import load_policy
from gpusteward.adapters.promconnection import PrometheusConnection
from gpusteward.core.policy import Policy

__all__ = ["ExtenderSettings", "TlsFiles", "add_extender_flags"]


def add_extender_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", required=True, metavar="FILE", help="policy YAML file")
    p.add_argument("--listen", type=hostport, default="0.0.0.0:8888", metavar="HOST:PORT",
                   help="address the scheduler calls")
    p.add_argument("--max-body-mb", type=whole_number(1, "MiB"), default=32,
                   help="largest request body accepted (full-node mode sends whole Nodes; "
                   "docs/operations.md sizes it from the fleet)")
    p.add_argument("--tls-cert-file", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-key-file", help="the certificate's private key (PEM)")
    p.add_argument("--tls-client-ca-file",
                   help="accept only clients with a certificate signed by this CA (the "
                   "scheduler's extender tlsConfig certFile/keyFile)")
    p.add_argument("--metrics-listen", type=hostport, metavar="HOST:PORT",
                   help="serve /metrics, /healthz and /readyz on a port of their own (plain "
                   "HTTP), so the scheduler port can admit only the scheduler")
    p.add_argument("--shutdown-delay", type=whole_number(0, "seconds"), default=5,
                   metavar="SECONDS",
                   help="after SIGTERM, keep answering this long with readiness off and "
                   "connections closed after each answer, while the pod leaves the Service's "
                   "endpoints (default 5; keep it below terminationGracePeriodSeconds)")
    p.add_argument("--first-byte-timeout", type=whole_number(1, "seconds"), default=5,
                   metavar="SECONDS",
                   help="close a new connection that sends nothing (with TLS: does not finish "
                   "its handshake) within this (default 5; kube-scheduler writes at once)")
    p.add_argument("--header-timeout", type=whole_number(1, "seconds"), default=5,
                   metavar="SECONDS",
                   help="close a connection whose request headers are not complete this long "
                   "after their first byte (default 5; the 10 s deadline for the whole request "
                   "applies too)")
    add_connection_flags(p)


@dataclass(frozen=True)
class TlsFiles:
    """The scheduler port's TLS files (all None: plain HTTP); ``serve.server_tls`` loads them."""

    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None


@dataclass(frozen=True)
class ExtenderSettings:
    policy: Policy
    prometheus: PrometheusConnection | None  # None: load and health terms stay neutral
    listen: tuple[str, int] = ("0.0.0.0", 8888)
    metrics_listen: tuple[str, int] | None = None  # None: /metrics on the scheduler port
    max_body_bytes: int = 32 << 20
    tls: TlsFiles = TlsFiles()
    kubeconfig: str | None = None
    context: str | None = None
    dra_driver: str = "gpu.nvidia.com"  # the DRA driver whose ResourceSlice devices are GPUs
    shutdown_delay: float = 5.0  # seconds answering after SIGTERM (serve.drain)
    first_byte_timeout: float = 5.0  # seconds from accept to a connection's first byte
    header_timeout: float = 5.0  # seconds from a request's first byte to its headers' end

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str]) -> ExtenderSettings:
        """The checked settings; raises PolicyError or SettingsError naming what is wrong."""
        policy = load_policy(args.policy)
        return cls(
            policy=policy,
            prometheus=prometheus_connection(args, policy.telemetry.prometheus_url, env),
            listen=args.listen, metrics_listen=args.metrics_listen,
            max_body_bytes=args.max_body_mb << 20,
            tls=TlsFiles(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file),
            kubeconfig=args.kubeconfig, context=args.context, dra_driver=args.dra_driver,
            shutdown_delay=args.shutdown_delay, first_byte_timeout=args.first_byte_timeout,
            header_timeout=args.header_timeout)
