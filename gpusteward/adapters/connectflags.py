"""The command-line flags (and their environment variables) that say how to reach the API
server and Prometheus; one group, the same for every command that talks to them; and the
value types the apps' flags share. Each flag's variable: adapters/envflags.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path

from gpusteward.adapters.addresses import parse_hostport
from gpusteward.adapters.envflags import ENV, FALSE, TRUE
from gpusteward.adapters.errors import PrometheusSettingsError
from gpusteward.adapters.promconnection import PrometheusConnection, parse_header
from gpusteward.core.typedconfig import Duration, duration_text


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
    if text not in TRUE + FALSE:
        raise PrometheusSettingsError(f"${name}={text!r}: expected true or false")
    return text in TRUE


def _path(text: str | None) -> Path | None:
    return Path(text).expanduser() if text else None
