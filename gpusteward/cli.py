"""The `gpusteward` command: one console script, one subcommand per app.

Exit codes: 0 ok; 1 a runtime failure (an API server or port that does not answer); 2 a usage
error (bad flags or variables, an invalid policy naming every problem, no kubeconfig);
`report` only: 3 the report was written but telemetry was unavailable. Every failure a user
can cause is one line on stderr; nothing starts half-configured.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gpusteward.adapters.connectflags import EnvParser
from gpusteward.adapters.errors import AdapterError, SettingsError
from gpusteward.adapters.logs import add_log_flags, configure
from gpusteward.adapters.policyfile import load_policy
from gpusteward.agent.cli import add_agent_parser
from gpusteward.core.policy import PolicyError
from gpusteward.core.policyschema import policy_schema
from gpusteward.extender.cli import add_extender_parser
from gpusteward.reclaimer.cli import add_reclaimer_parser
from gpusteward.report.cli import add_report_parser
from gpusteward.sandbox.cli import add_sandbox_parser
from gpusteward.whatif.cli import add_whatif_parser

EXIT_RUNTIME, EXIT_USAGE = 1, 2
log = logging.getLogger("gpusteward")

# What runs each app's command, as "module:function", imported only once the command line names
# that command: the one place gpusteward defers imports, for start-up time. Every parser comes
# from its app's cli module, which declares flags and settings with argparse and the core alone;
# the modules named here load the SDKs the apps run on (kubernetes_asyncio, aiohttp, grpc,
# pynvml, requests, prometheus_client: about 1 s and 90 MB together), which `--version`,
# `--help` and `policy check` in a CI job or a pre-commit hook should not pay
# (tests/unit/test_startup_imports.py holds the boundary, benchmarks/bench_startup.py times it).
RUNS = {
    "extender": "gpusteward.extender.serve:run_extender",
    "reclaimer": "gpusteward.reclaimer.serve:run_reclaimer",
    "report": "gpusteward.report.run:run_report",
    "whatif": "gpusteward.whatif.run:run_whatif",
    "agent": "gpusteward.agent.serve:run_agent",
    "sandbox": "gpusteward.sandbox.commands:run",
}
# The same for `--version`: importlib.metadata (some 30 ms) only when the version is asked for.
VERSION = "gpusteward.adapters.version:describe"


def resolve(target: str) -> Callable[..., Any]:
    """The function a "module:function" of ``RUNS`` names, its module imported now."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class _VersionAction(argparse._VersionAction):
    """argparse's ``--version``, its text looked up only when the flag is given."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        self.version = f"gpusteward {resolve(VERSION)()}"
        super().__call__(parser, namespace, values, option_string)


def build_parser() -> argparse.ArgumentParser:
    parser = EnvParser(prog="gpusteward", description=__doc__)
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    # Each app registers its own subcommand; RUNS says how it runs.
    add_extender_parser(sub)
    add_reclaimer_parser(sub)
    _add_policy_parser(sub)
    add_report_parser(sub)
    add_whatif_parser(sub)
    add_agent_parser(sub)
    add_sandbox_parser(sub)
    for leaf in _leaves(parser):
        if not any("--log-level" in a.option_strings for a in leaf._actions):
            add_log_flags(leaf)
    return parser


def _add_policy_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    pol = sub.add_parser("policy", help="policy file tools")
    pol_sub = pol.add_subparsers(dest="policy_command", required=True)
    check = pol_sub.add_parser("check", help="validate a policy file (exit 0 valid, 2 invalid)")
    check.add_argument("file", help="the policy YAML file")
    pol_sub.add_parser("schema", help="print the policy's JSON Schema (deploy/policy.schema.json)")
    return pol


def _run_policy(args: argparse.Namespace) -> int:
    if args.policy_command == "schema":
        print(json.dumps(policy_schema(), indent=2))
        return 0
    load_policy(args.file)
    print(f"{args.file}: valid")
    return 0


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers that end a command line (extender, policy check, sandbox up, ...)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    below = [leaf for child in subs[0].choices.values() for leaf in _leaves(child)]
    # `reclaimer` runs alone too (its `restore` is optional)
    return below if subs[0].required else [parser, *below]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure(args.log_level, args.log_format)
    try:
        run: Callable[[argparse.Namespace], int] = (
            _run_policy if args.command == "policy" else resolve(RUNS[args.command]))
        return run(args)
    except KeyboardInterrupt:
        return 130
    except PolicyError as e:  # every problem of the file, one per line
        print(e, file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from e
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
    if _raised_by(e, "aiohttp", "ClientError"):
        # the Kubernetes client is the commands' only aiohttp client (Prometheus: requests)
        return EXIT_RUNTIME, f"cannot reach the API server: {e or type(e).__name__}"
    if isinstance(e, OSError):  # TimeoutError too
        where = f"{e.filename}: " if e.filename else ""
        return EXIT_RUNTIME, where + (e.strerror or str(e) or type(e).__name__)
    if _raised_by(e, "kubernetes_asyncio.client.exceptions", "ApiException"):
        answer: Any = e  # an ApiException
        return EXIT_RUNTIME, f"the API server answered HTTP {answer.status} {answer.reason}"
    return EXIT_RUNTIME, None


def _raised_by(e: Exception, module: str, name: str) -> bool:
    """Whether ``e`` is a ``module.name``, importing nothing: a library this command never
    loaded cannot have raised it (``policy check`` loads no HTTP client, ``report`` both)."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(e, getattr(loaded, name))


if __name__ == "__main__":
    raise SystemExit(main())
