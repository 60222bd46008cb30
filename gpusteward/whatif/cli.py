"""`gpusteward whatif`: its flags and the typed settings they make (``whatif.run`` reads history
once per kind of policy, replays each and writes the comparison). Flags and settings only:
loaded only when the command line names `whatif`.

    gpusteward whatif --policy FILE [--policy OTHER ...] [--window 7d] [--end TIME]
                      [--format table|json|csv|html] [--top N] [--prometheus-url URL] ...

Exit 0 with the comparison; 1 when Prometheus does not answer or holds no history for the
window (the message says which series were missing); 2 for bad flags or an invalid policy.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpusteward.adapters.connectflags import (
    add_prometheus_flags,
    duration_flag,
    prometheus_connection,
)
from gpusteward.adapters.errors import SettingsError
from gpusteward.adapters.policyfile import load_policy
from gpusteward.adapters.promconnection import PrometheusConnection
from gpusteward.core.policy import Policy
from gpusteward.core.times import parse_time

FORMATS = ("table", "json", "csv", "html")


def _time(text: str) -> float:
    try:
        value = parse_time(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected an RFC 3339 time, got {text!r}") from e
    assert value is not None
    return value


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def add_whatif_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", action="append", required=True, metavar="FILE",
                   help="a policy YAML file; repeat to compare policies side by side")
    p.add_argument("--window", type=duration_flag(60), default="7d", metavar="DURATION",
                   help="how much history to replay, ending at --end (e.g. 6h, 7d)")
    p.add_argument("--end", type=_time, metavar="TIME",
                   help="the end of the replayed window, RFC 3339 (default: now)")
    p.add_argument("--format", choices=FORMATS, default="table", help="what stdout gets")
    p.add_argument("--top", type=_count, default=10, metavar="N",
                   help="how many reclaims, comebacks and earlier starts to list per policy")
    add_prometheus_flags(p)  # it replays Prometheus' history alone: no API server


@dataclass(frozen=True)
class WhatIfSettings:
    policies: tuple[tuple[str, Policy], ...]  # (column name, policy), in the order given
    prometheus: PrometheusConnection
    start: float
    end: float
    format: str = "table"
    top: int = 10

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str],
                  clock: Callable[[], float] = time.time) -> WhatIfSettings:
        """The checked settings; raises PolicyError or SettingsError naming what is wrong.
        The first policy's telemetry.prometheusUrl is the default Prometheus."""
        policies = tuple(zip(_names(args.policy), map(load_policy, args.policy), strict=True))
        prometheus = prometheus_connection(args, policies[0][1].telemetry.prometheus_url, env)
        if prometheus is None:
            raise SettingsError("no Prometheus URL (--prometheus-url, PROMETHEUS_URL or the "
                                "policy's telemetry.prometheusUrl)")
        end = args.end if args.end is not None else clock()
        return cls(policies=policies, prometheus=prometheus, start=end - args.window, end=end,
                   format=args.format, top=args.top)


def _names(files: list[str]) -> list[str]:
    """Each policy's column: its file name, or its path where two share a name."""
    names = [Path(f).name for f in files]
    return names if len(set(names)) == len(names) else files
