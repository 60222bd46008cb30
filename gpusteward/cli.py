"""The `gpusteward` command: one console script, one subcommand per app.

Exit codes: 0 ok; 1 a runtime failure (an API server or port that does not answer); 2 a usage
error (bad flags or variables, an invalid policy naming every problem, no kubeconfig);
`report` only: 3 the report was written but telemetry was unavailable. Every failure a user
can cause is one line on stderr; nothing starts half-configured.
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

import aiohttp

from gpusteward.adapters import buildinfo
from gpusteward.adapters.connectflags import (
    EnvParser,
    add_connection_flags,
    add_kube_flags,
    prometheus_connection,
)
from gpusteward.adapters.errors import AdapterError, SettingsError
from gpusteward.adapters.logs import add_log_flags, configure
from gpusteward.core.addresses import parse_hostport
from gpusteward.core.policy import Policy, PolicyError, load_policy

if TYPE_CHECKING:
    from gpusteward.adapters.promconnection import PrometheusConnection

EXIT_RUNTIME, EXIT_USAGE = 1, 2
log = logging.getLogger("gpusteward")


def _hostport(text: str) -> tuple[str, int]:
    try:
        return parse_hostport(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _positive_mb(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of MiB, got {text!r}")
    return int(text)


def _lease_seconds(text: str) -> int:
    # client-go's rule: the renew deadline (2/3 of it) must exceed 1.2 retry periods (>= 1 s)
    if not text.isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(f"expected a whole number of seconds >= 2, got {text!r}")
    return int(text)


def _common(p: argparse.ArgumentParser) -> None:
    add_connection_flags(p)


def build_parser() -> argparse.ArgumentParser:
    parser = EnvParser(prog="gpusteward", description=__doc__)
    parser.add_argument("--version", action="version",
                        version=f"gpusteward {buildinfo.version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    ext = sub.add_parser("extender", help="serve the kube-scheduler HTTP extender")
    ext.add_argument("--policy", required=True, metavar="FILE", help="policy YAML file")
    ext.add_argument("--listen", type=_hostport, default="0.0.0.0:8888", metavar="HOST:PORT",
                     help="address the scheduler calls")
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
    rec.add_argument("--policy", metavar="FILE",
                     help="policy YAML file (required unless restoring)")
    rec.add_argument("--mode", choices=["observe", "warn", "enforce"],
                     help="override the policy's reclaim.mode")
    rec.add_argument("--once", action="store_true", help="run one cycle and exit (no Lease)")
    rec.add_argument("--metrics-listen", type=_hostport, default="0.0.0.0:8080",
                     metavar="HOST:PORT", help="/healthz and /metrics")
    rec.add_argument("--lease-namespace", help="namespace of the leader-election Lease "
                     "(default: the pod's namespace, else $POD_NAMESPACE, else default)")
    rec.add_argument("--lease-name", default="gpusteward-reclaimer",
                     help="the leader-election Lease (its ConfigMap <name>-reclaims keeps the "
                          "last hour's reclaims)")
    rec.add_argument("--lease-duration", type=_lease_seconds, default=15, metavar="SECONDS",
                     help="a standby takes over this long after the leader stops renewing")
    _common(rec)
    rec_sub = rec.add_subparsers(dest="reclaimer_command")
    restore = rec_sub.add_parser("restore", help="undo a scale-down or Job suspension")
    restore.add_argument("target", metavar="NAMESPACE/KIND/NAME")
    add_kube_flags(restore)

    pol = sub.add_parser("policy", help="policy file tools")
    pol_sub = pol.add_subparsers(dest="policy_command", required=True)
    check = pol_sub.add_parser("check", help="validate a policy file (exit 0 valid, 2 invalid)")
    check.add_argument("file", help="the policy YAML file")
    pol_sub.add_parser("schema", help="print the policy's JSON Schema (deploy/policy.schema.json)")

    from gpusteward.agent.cli import add_agent_parser
    from gpusteward.report.cli import add_report_parser
    from gpusteward.sandbox.cli import add_sandbox_parser
    from gpusteward.whatif.cli import add_whatif_parser

    add_report_parser(sub)
    add_whatif_parser(sub)
    add_agent_parser(sub)
    add_sandbox_parser(sub)
    for leaf in _leaves(parser):
        if not any("--log-level" in a.option_strings for a in leaf._actions):
            add_log_flags(leaf)
    return parser


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers that end a command line (extender, policy check, sandbox up, ...)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    below = [leaf for child in subs[0].choices.values() for leaf in _leaves(child)]
    # `reclaimer` runs alone too (its `restore` is optional)
    return below if subs[0].required else [parser, *below]


def _load(path: str) -> Policy:
    try:
        return load_policy(path)
    except PolicyError as e:
        print(e, file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from e


def _prometheus(args: argparse.Namespace, policy: Policy) -> PrometheusConnection | None:
    return prometheus_connection(args, policy.telemetry.prometheus_url, os.environ)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure(args.log_level, args.log_format)
    try:
        return _run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the one place a failure becomes a line and an exit code
        code, line = failure(e)
        if line is None:
            log.exception("gpusteward %s failed unexpectedly (a bug; please report it)",
                          args.command)
            return code
        print(f"gpusteward {args.command}: {line}", file=sys.stderr)
        return code


def failure(e: Exception) -> tuple[int, str | None]:
    """Exit code and line for an error that ended a command (line None: a bug)."""
    if isinstance(e, SettingsError):
        return EXIT_USAGE, str(e)
    if isinstance(e, AdapterError):
        return EXIT_RUNTIME, str(e)
    if isinstance(e, aiohttp.ClientError):
        # the Kubernetes client is the commands' only aiohttp client (Prometheus: requests)
        return EXIT_RUNTIME, f"cannot reach the API server: {e or type(e).__name__}"
    if isinstance(e, OSError):  # TimeoutError too
        where = f"{e.filename}: " if e.filename else ""
        return EXIT_RUNTIME, where + (e.strerror or str(e) or type(e).__name__)
    from kubernetes_asyncio.client.exceptions import ApiException  # loaded on failure only

    if isinstance(e, ApiException):
        return EXIT_RUNTIME, f"the API server answered HTTP {e.status} {e.reason}"
    return EXIT_RUNTIME, None


def _run(args: argparse.Namespace) -> int:
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
        from gpusteward.extender.serve import serve

        return asyncio.run(serve(policy, args, _prometheus(args, policy)))
    if args.command == "reclaimer":
        return _reclaimer(args)
    if args.command == "report":
        from gpusteward.report.cli import run_report

        return run_report(args)
    if args.command == "whatif":
        from gpusteward.whatif.cli import run_whatif

        return run_whatif(args)
    if args.command == "agent":
        from gpusteward.agent.cli import run_agent

        return run_agent(args)
    if args.command == "sandbox":
        from gpusteward.sandbox.cli import run_sandbox_command

        return run_sandbox_command(args)
    raise AssertionError(args.command)


def _reclaimer(args: argparse.Namespace) -> int:
    from gpusteward.reclaimer import serve

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
