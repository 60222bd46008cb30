"""The `gpusteward` command: one console script, one subcommand per app.

Exit codes: 0 ok; 1 a runtime failure (an API server or port that does not answer); 2 a usage
error (bad flags or variables, an invalid policy naming every problem, no kubeconfig);
`report` only: 3 the report was written but telemetry was unavailable. Every failure a user
can cause is one line on stderr; nothing starts half-configured.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

from gpusteward.adapters.envflags import EnvParser
from gpusteward.adapters.errors import AdapterError, SettingsError
from gpusteward.adapters.logs import add_log_flags, configure

EXIT_RUNTIME, EXIT_USAGE = 1, 2
log = logging.getLogger("gpusteward")


class Command(NamedTuple):
    help: str
    flags: str  # "module:function" adding the command's flags to its parser (its app's cli)
    run: str  # "module:function" running it


# Every subcommand. Both of its functions are imported through importlib only once the command
# line names the command: the one place gpusteward defers imports, for start-up time. The run
# functions load the SDKs the apps run on (kubernetes_asyncio, aiohttp, grpc, pynvml, requests,
# prometheus_client: about 1 s and 90 MB together), and the flag modules the core and the
# light adapters (msgspec, ssl: some 0.1 s), which `--version`, `--help` and `policy check` in a
# CI job or a pre-commit hook should not pay for commands they do not run
# (tests/unit/test_startup_imports.py holds the boundary, benchmarks/bench_startup.py times it).
COMMANDS = {
    "extender": Command("serve the kube-scheduler HTTP extender",
                        "gpusteward.extender.cli:add_extender_flags",
                        "gpusteward.extender.serve:run_extender"),
    "reclaimer": Command("reclaim GPUs that pods hold idle",
                         "gpusteward.reclaimer.cli:add_reclaimer_flags",
                         "gpusteward.reclaimer.serve:run_reclaimer"),
    "policy": Command("policy file tools", "gpusteward.policytools:add_policy_flags",
                      "gpusteward.policytools:run_policy"),
    "report": Command("allocated vs actually used GPUs, idle cost, queue",
                      "gpusteward.report.cli:add_report_flags", "gpusteward.report.run:run_report"),
    "whatif": Command("replay policies over recorded history: what they would have freed",
                      "gpusteward.whatif.cli:add_whatif_flags", "gpusteward.whatif.run:run_whatif"),
    "agent": Command("serve dcgm-exporter-compatible GPU metrics read through NVML (per node)",
                     "gpusteward.agent.cli:add_agent_flags", "gpusteward.agent.serve:run_agent"),
    "sandbox": Command("local real control plane with simulated GPU nodes",
                       "gpusteward.sandbox.cli:add_sandbox_flags",
                       "gpusteward.sandbox.commands:run"),
}
# The same for `--version`: importlib.metadata is not needed, the version is the package's own.
VERSION = "gpusteward.adapters.version:describe"


def resolve(target: str) -> Callable[..., Any]:
    """The function a "module:function" of ``COMMANDS`` names, its module imported now."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class _VersionAction(argparse._VersionAction):
    """argparse's ``--version``, its text looked up only when the flag is given."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        self.version = f"gpusteward {resolve(VERSION)()}"
        super().__call__(parser, namespace, values, option_string)


class _Commands(argparse._SubParsersAction):
    """The subcommands, each registered with its help alone and given its flags when the
    command line names it (or a caller asks for every command: ``fill``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._filled: set[str] = set()

    def fill(self, name: str) -> None:
        if name in self._filled:
            return
        self._filled.add(name)
        parser = self.choices[name]
        resolve(COMMANDS[name].flags)(parser)
        for leaf in _leaves(parser):
            if not any("--log-level" in a.option_strings for a in leaf._actions):
                add_log_flags(leaf)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        self.fill(values[0])  # argparse has checked it is a command by now
        super().__call__(parser, namespace, values, option_string)


def build_parser(every_command: bool = False) -> argparse.ArgumentParser:
    """The command line's parser; ``every_command``: with every command's flags added now
    (to walk them all), not only once a command line names one."""
    parser = EnvParser(prog="gpusteward", description=__doc__)
    parser.add_argument("--version", action=_VersionAction)
    sub = cast(_Commands, parser.add_subparsers(dest="command", required=True, action=_Commands))
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.help)
        if every_command:
            sub.fill(name)
    return parser


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
        run: Callable[[argparse.Namespace], int] = resolve(COMMANDS[args.command].run)
        return run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the one place a failure becomes a line and an exit code
        if _raised_by(e, "gpusteward.core.policy", "PolicyError"):
            print(e, file=sys.stderr)  # every problem of the file, one per line
            raise SystemExit(EXIT_USAGE) from e
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
