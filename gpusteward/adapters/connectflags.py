"""The command-line flags (and their environment variables) that say how to reach the API
server and Prometheus; one group, the same for every command that talks to them.

Every other flag reads an environment variable too, through ``EnvParser``: ``--some-flag``
reads ``GPUSTEWARD_SOME_FLAG`` (``env_name``), the flag wins, and ``--help`` shows the variable
and the default of each flag.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from gpusteward.adapters.addresses import parse_hostport
from gpusteward.adapters.errors import PrometheusSettingsError
from gpusteward.adapters.promconnection import PrometheusConnection, parse_header
from gpusteward.core.typedconfig import Duration, duration_text

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
_TRUE, _FALSE = ("1", "true", "yes"), ("", "0", "false", "no")
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
        if text.strip().lower() not in _TRUE + _FALSE:
            raise argparse.ArgumentTypeError("expected true or false")
        return text.strip().lower() in _TRUE
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


def hostport(text: str) -> tuple[str, int]:
    """A listen flag's value (``HOST:PORT``), as argparse wants a bad one reported."""
    try:
        return parse_hostport(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def whole_number(least: int, unit: str = "") -> Callable[[str], int]:
    """A flag type: plain digits (no sign, no spaces) making at least ``least``."""
    # Not core.kubewire.parse_count: a flag takes no quantity suffix, padding or JSON number.
    what = f"a whole number of {unit}" if unit else "a whole number"

    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or int(text) < least:
            raise argparse.ArgumentTypeError(f"expected {what} >= {least}, got {text!r}")
        return int(text)
    return parse


def duration_flag(least: int = 1) -> Callable[[str], float]:
    """A flag type: a duration (90s, 5m, 24h, 7d) of at least ``least`` whole seconds."""
    def parse(text: str) -> float:
        try:
            seconds = float(Duration.parse(text))
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from e
        if seconds < least:
            raise argparse.ArgumentTypeError(
                f"expected at least {duration_text(least)}, got {text!r}")
        return float(int(seconds))
    return parse


def add_kube_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("API server")
    group.add_argument("--kubeconfig", metavar="FILE",
                       help="kubeconfig file (default: $KUBECONFIG, a path list merged as "
                            "kubectl merges it, else ~/.kube/config, else in-cluster)")
    group.add_argument("--context", metavar="NAME",
                       help="kubeconfig context (default: its current-context)")


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    """--kubeconfig, --context and --dra-driver, and every Prometheus connection flag."""
    add_kube_flags(parser)
    parser.add_argument("--dra-driver", default="gpu.nvidia.com", metavar="NAME",
                        help="the DRA driver whose ResourceSlice devices are GPUs "
                             "(NVIDIA's DRA driver for GPUs: gpu.nvidia.com)")
    add_prometheus_flags(parser)


def add_prometheus_flags(parser: argparse.ArgumentParser) -> None:
    """Every Prometheus connection flag (a command that reads no API server takes only these)."""
    group = parser.add_argument_group(
        "Prometheus (or Thanos, Mimir); each flag also reads the environment variable shown")
    group.add_argument("--prometheus-url", metavar="URL",
                       help=f"base URL [${ENV['prometheus_url']}; default: the policy's "
                            "telemetry.prometheusUrl]")
    group.add_argument("--prometheus-ca-file", metavar="FILE",
                       help="PEM CA bundle that signed its TLS certificate "
                            f"[${ENV['prometheus_ca_file']}; default: the system's CAs]")
    group.add_argument("--prometheus-insecure-skip-verify", action="store_true", default=None,
                       help="do not verify its TLS certificate (testing only) "
                            f"[${ENV['prometheus_insecure_skip_verify']}=true; "
                            "default: verify]")
    group.add_argument("--prometheus-bearer-token-file", metavar="FILE",
                       help="send 'Authorization: Bearer' with this file's content, read "
                            "again when it changes (a projected ServiceAccount token) "
                            f"[${ENV['prometheus_bearer_token_file']}; default: none]")
    group.add_argument("--prometheus-basic-auth-user", metavar="USER",
                       help=f"basic auth user [${ENV['prometheus_basic_auth_user']}; "
                            "default: none]")
    group.add_argument("--prometheus-basic-auth-password-file", metavar="FILE",
                       help="basic auth password, read again when it changes "
                            f"[${ENV['prometheus_basic_auth_password_file']}; default: none]")
    group.add_argument("--prometheus-header", action="append", metavar="'NAME: VALUE'",
                       help="extra request header, repeatable, e.g. 'X-Scope-OrgID: team-a' "
                            f"[${ENV['prometheus_header']}, one per line; default: none]")


def prometheus_connection(args: argparse.Namespace, policy_url: str | None,
                          env: Mapping[str, str]) -> PrometheusConnection | None:
    """The checked connection settings, or None when no URL is configured anywhere.

    Raises PrometheusSettingsError (one line) for a bad value."""
    def setting(dest: str) -> str | None:
        flag = getattr(args, dest, None)
        return flag if flag is not None else env.get(ENV[dest]) or None

    url = setting("prometheus_url") or policy_url
    if not url:
        return None
    headers = args.prometheus_header or env.get(ENV["prometheus_header"], "").splitlines()
    connection = PrometheusConnection(
        url=url,
        ca_file=_path(setting("prometheus_ca_file")),
        insecure_skip_verify=_insecure(args, env),
        bearer_token_file=_path(setting("prometheus_bearer_token_file")),
        basic_auth_user=setting("prometheus_basic_auth_user"),
        basic_auth_password_file=_path(setting("prometheus_basic_auth_password_file")),
        headers=tuple(parse_header(h) for h in headers if h.strip()),
    )
    connection.check()
    return connection


def _insecure(args: argparse.Namespace, env: Mapping[str, str]) -> bool:
    if args.prometheus_insecure_skip_verify:
        return True
    name = ENV["prometheus_insecure_skip_verify"]
    text = env.get(name, "").strip().lower()
    if text not in _TRUE + _FALSE:
        raise PrometheusSettingsError(f"${name}={text!r}: expected true or false")
    return text in _TRUE


def _path(text: str | None) -> Path | None:
    return Path(text).expanduser() if text else None
