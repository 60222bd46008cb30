"""Every flag reads an environment variable too, through ``EnvParser``: ``--some-flag`` reads
``GPUSTEWARD_SOME_FLAG`` (``env_name``), the flag wins, and ``--help`` shows the variable and
the default of each flag.

Light on purpose (argparse and os): `gpusteward --version` and `--help` build their parser
from this module alone (gpusteward/cli.py).
"""

from __future__ import annotations

import argparse
import os
from typing import Any, NoReturn

# flag dest -> environment variable (the flag wins when both are set)
ENV = {
    "prometheus_url": "PROMETHEUS_URL",
    "prometheus_ca_file": "GPUSTEWARD_PROMETHEUS_CA_FILE",
    "prometheus_insecure_skip_verify": "GPUSTEWARD_PROMETHEUS_INSECURE_SKIP_VERIFY",
    "prometheus_bearer_token_file": "GPUSTEWARD_PROMETHEUS_BEARER_TOKEN_FILE",
    "prometheus_basic_auth_user": "GPUSTEWARD_PROMETHEUS_BASIC_AUTH_USER",
    "prometheus_basic_auth_password_file": "GPUSTEWARD_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE",
    "prometheus_header": "GPUSTEWARD_PROMETHEUS_HEADERS",
}
TRUE, FALSE = ("1", "true", "yes"), ("", "0", "false", "no")
# Variables read where the setting is used rather than as the flag's default: the Prometheus
# ones by prometheus_connection (which checks them together), $KUBECONFIG by
# adapters.kubeconfig (a path list, merged as kubectl merges it).
OTHER_NAMES = {"kubeconfig": "KUBECONFIG", "node_name": "NODE_NAME"}
_READ_WHERE_USED = {*ENV, "kubeconfig"}


def env_name(dest: str) -> str:
    """The environment variable of the flag stored in ``dest``."""
    return ENV.get(dest) or OTHER_NAMES.get(dest) or "GPUSTEWARD_" + dest.upper()


def _flag_value(action: argparse.Action, text: str) -> Any:
    """A variable's text converted and checked as the flag's own value would be."""
    if action.nargs == 0:  # a switch
        if text.strip().lower() not in TRUE + FALSE:
            raise argparse.ArgumentTypeError("expected true or false")
        return text.strip().lower() in TRUE
    convert = action.type if callable(action.type) else str
    values = [convert(line) for line in text.splitlines() if line.strip()]
    for value in values:
        if action.choices is not None and value not in action.choices:
            raise argparse.ArgumentTypeError(
                "expected one of " + ", ".join(map(str, action.choices)))
    if isinstance(action, argparse._AppendAction):
        return values
    if len(values) != 1:
        raise argparse.ArgumentTypeError("expected one value")
    return values[0]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each flag's help ends with its variable and its default (unless it says them)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        name = env_name(action.dest)
        if not action.option_strings or action.default == argparse.SUPPRESS \
                or f"${name}" in text:
            return text
        shown = action.default
        if action.nargs == 0:
            shown = "on" if shown else "off"
        elif shown is None:
            shown = "none"
        if "%" not in text and "default" not in text:
            text += f" [${name}; default: {shown}]".replace("%", "%%")
        else:
            text += f" [${name}]"
        return text.strip()


class EnvParser(argparse.ArgumentParser):
    """Flags default to their environment variable; a usage error is one line, exit 2."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        # Runs for the parsers a command line uses only, so another command's variable with
        # a bad value never stops this one.
        for action in self._actions:
            name = env_name(action.dest)
            if not action.option_strings or action.dest in _READ_WHERE_USED \
                    or name not in os.environ or action.default == argparse.SUPPRESS:
                continue
            try:
                action.default = _flag_value(action, os.environ[name])
            except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
                self.error(f"${name}={os.environ[name]!r}: {e}")
            action.required = False
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")
