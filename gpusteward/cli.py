"""The `gpusteward` command: one console script, one subcommand per app.

Bad flags or an invalid policy exit 2 naming every problem; nothing starts half-configured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpusteward.adapters.connectflags import (
    add_connection_flags,
    add_kube_flags,
    prometheus_connection,
)
from gpusteward.adapters.errors import PrometheusSettingsError
from gpusteward.core.addresses import parse_hostport
from gpusteward.core.policy import Policy, PolicyError, load_policy

if TYPE_CHECKING:
    from gpusteward.adapters.promconnection import PrometheusConnection

EXIT_USAGE = 2


def _hostport(text: str) -> tuple[str, int]:
    try:
        return parse_hostport(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _positive_mb(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of MiB, got {text!r}")
    return int(text)


def _common(p: argparse.ArgumentParser) -> None:
    add_connection_flags(p)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpusteward", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    ext = sub.add_parser("extender", help="serve the kube-scheduler HTTP extender")
    ext.add_argument("--policy", required=True, help="policy YAML file")
    ext.add_argument("--listen", type=_hostport, default=("0.0.0.0", 8888), metavar="HOST:PORT")
    ext.add_argument("--max-body-mb", type=_positive_mb, default=32,
                     help="largest request body accepted (full-node mode sends whole Nodes; "
                     "docs/operations.md sizes it from the fleet)")
    ext.add_argument("--tls-cert-file", help="serve HTTPS with this certificate (PEM)")
    ext.add_argument("--tls-key-file", help="the certificate's private key (PEM)")
    ext.add_argument("--tls-client-ca-file",
                     help="accept only clients with a certificate signed by this CA (the "
                     "scheduler's extender tlsConfig certFile/keyFile)")
    ext.add_argument("--metrics-listen", type=_hostport, metavar="HOST:PORT",
                     help="serve /metrics, /healthz and /readyz on a port of their own (plain "
                     "HTTP), so the scheduler port can admit only the scheduler")
    _common(ext)

    rec = sub.add_parser("reclaimer", help="reclaim GPUs that pods hold idle")
    rec.add_argument("--policy", help="policy YAML file (required unless restoring)")
    rec.add_argument("--mode", choices=["observe", "warn", "enforce"],
                     help="override the policy's reclaim.mode")
    rec.add_argument("--once", action="store_true", help="run one cycle and exit (no Lease)")
    rec.add_argument("--metrics-listen", type=_hostport, default=("0.0.0.0", 9090),
                     metavar="HOST:PORT", help="/healthz and /metrics")
    rec.add_argument("--lease-namespace", help="namespace of the leader-election Lease "
                     "(default: the pod's namespace, else $POD_NAMESPACE, else default)")
    rec.add_argument("--lease-name", default="gpusteward-reclaimer")
    rec.add_argument("--lease-duration", type=int, default=15, metavar="SECONDS",
                     help="a standby takes over this long after the leader stops renewing")
    _common(rec)
    rec_sub = rec.add_subparsers(dest="reclaimer_command")
    restore = rec_sub.add_parser("restore", help="undo a scale-down or Job suspension")
    restore.add_argument("target", metavar="NAMESPACE/KIND/NAME")
    add_kube_flags(restore)

    pol = sub.add_parser("policy", help="policy file tools")
    pol_sub = pol.add_subparsers(dest="policy_command", required=True)
    check = pol_sub.add_parser("check", help="validate a policy file (exit 0 valid, 2 invalid)")
    check.add_argument("file")
    pol_sub.add_parser("schema", help="print the policy's JSON Schema (deploy/policy.schema.json)")

    from gpusteward.agent.cli import add_agent_parser
    from gpusteward.report.cli import add_report_parser
    from gpusteward.sandbox.cli import add_sandbox_parser

    add_report_parser(sub)
    add_agent_parser(sub)
    add_sandbox_parser(sub)
    return parser


def _load(path: str) -> Policy:
    try:
        return load_policy(path)
    except PolicyError as e:
        print(e, file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from e


def _prometheus(args: argparse.Namespace, policy: Policy) -> PrometheusConnection | None:
    try:
        return prometheus_connection(args, policy.telemetry.prometheus_url, os.environ)
    except PrometheusSettingsError as e:
        print(f"gpusteward {args.command}: {e}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from e


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "policy":
        if args.policy_command == "schema":
            from gpusteward.core.policyschema import policy_schema

            print(json.dumps(policy_schema(), indent=2))
            return 0
        _load(args.file)
        print(f"{args.file}: valid")
        return 0
    if args.command == "extender":
        policy = _load(args.policy)
        _setup_logging(args.log_level)
        from gpusteward.extender.serve import serve

        return asyncio.run(serve(policy, args, _prometheus(args, policy)))
    if args.command == "reclaimer":
        return _reclaimer(args)
    if args.command == "report":
        from gpusteward.report.cli import run_report

        return run_report(args)
    if args.command == "agent":
        from gpusteward.agent.cli import run_agent

        return run_agent(args)
    if args.command == "sandbox":
        from gpusteward.sandbox.cli import run_sandbox_command

        return run_sandbox_command(args)
    raise AssertionError(args.command)


def _reclaimer(args: argparse.Namespace) -> int:
    from gpusteward.reclaimer import serve

    _setup_logging(getattr(args, "log_level", "info"))
    if args.reclaimer_command == "restore":
        return asyncio.run(serve.restore(args))
    if not args.policy:
        print("gpusteward reclaimer: --policy is required", file=sys.stderr)
        return EXIT_USAGE
    policy = _load(args.policy)
    args.lease_namespace = args.lease_namespace or serve.default_namespace()
    return asyncio.run(serve.serve(policy, args, _prometheus(args, policy)))


if __name__ == "__main__":
    raise SystemExit(main())
