"""`gpusteward report`: its flags and the typed settings they make (``report.run`` reads,
builds and writes the report). Flags and settings only, loaded only when
the command line names `report`.

    gpusteward report [--policy FILE] [--window 24h] [--step 5m]
                      [--by team|card|node|namespace|class] [--format table|json|csv]
                      [--html FILE] [--top N] [--cluster-name NAME] [--currency SYMBOL]
                      [--kubeconfig FILE] [--context NAME] [--prometheus-url URL]
                      [--prometheus-ca-file FILE] [--prometheus-bearer-token-file FILE] ...

Exit 0 with a report; 3 with the report written but telemetry unavailable (usage shown as
unknown), so a cron job can tell a failed report from an empty one; 1 when the API server does
not answer; 2 for bad flags, an invalid policy, no kubeconfig or no Prometheus URL.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpusteward.adapters.connectflags import (
    add_connection_flags,
    duration_flag,
    prometheus_connection,
    whole_number,
)
from gpusteward.adapters.errors import SettingsError
from gpusteward.adapters.policyfile import load_policy
from gpusteward.adapters.promconnection import PrometheusConnection
from gpusteward.core.policy import Policy, parse_policy
from gpusteward.core.report.model import DIMENSIONS

MAX_SLOTS = 2_000  # default step: the window in at most this many slots


def _currency(text: str) -> str:
    if not 0 < len(text.strip()) <= 8:
        raise argparse.ArgumentTypeError(f"expected a symbol or code of 1 to 8 characters, "
                                          f"got {text!r}")
    return text.strip()


def add_report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", metavar="FILE",
                   help="policy YAML file (default: the built-in defaults)")
    p.add_argument("--window", type=duration_flag(1), default="24h", metavar="DURATION",
                   help="how far back to look, e.g. 6h, 24h, 7d")
    p.add_argument("--step", type=duration_flag(1), metavar="DURATION",
                   help="resolution of the utilization samples (default: the scrape interval, "
                   f"or coarser to keep the window within {MAX_SLOTS} slots)")
    p.add_argument("--by", choices=DIMENSIONS, default="team", help="group rows by")
    p.add_argument("--format", choices=("table", "json", "csv"), default="table",
                   help="what is written to stdout")
    p.add_argument("--html", type=Path, metavar="FILE",
                   help="also write a self-contained HTML report with charts")
    p.add_argument("--top", type=whole_number(0), default=10, metavar="N",
                   help="how many idle pods to list")
    p.add_argument("--cluster-name", default="", metavar="NAME",
                   help="the cluster the report is about, in its title (default: none)")
    p.add_argument("--currency", type=_currency, default="$", metavar="SYMBOL",
                   help="the unit of the policy's costPerGpuHour, e.g. €, EUR (nothing is "
                        "converted)")
    add_connection_flags(p)


def step_for(window: float, step: float | None, policy: Policy) -> float:
    if step is not None:
        return step
    scrape = float(policy.telemetry.scrape_interval)
    return float(max(int(scrape), -(-int(window) // MAX_SLOTS)))


@dataclass(frozen=True)
class ReportSettings:
    policy: Policy
    prometheus: PrometheusConnection
    window: float = 86_400.0  # seconds back from now
    step: float = 60.0  # seconds between utilization samples
    by: str = "team"
    format: str = "table"
    html: Path | None = None
    top: int = 10
    cluster_name: str = ""
    currency: str = "$"
    kubeconfig: str | None = None
    context: str | None = None
    dra_driver: str = "gpu.nvidia.com"  # the DRA driver whose ResourceSlice devices are GPUs

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str]) -> ReportSettings:
        """The checked settings; raises PolicyError or SettingsError naming what is wrong."""
        policy = load_policy(args.policy) if args.policy else parse_policy({})
        prometheus = prometheus_connection(args, policy.telemetry.prometheus_url, env)
        if prometheus is None:
            raise SettingsError("no Prometheus URL (--prometheus-url, PROMETHEUS_URL or the "
                                "policy's telemetry.prometheusUrl)")
        return cls(policy=policy, prometheus=prometheus, window=args.window,
                   step=step_for(args.window, args.step, policy), by=args.by,
                   format=args.format, html=args.html, top=args.top,
                   cluster_name=args.cluster_name, currency=args.currency,
                   kubeconfig=args.kubeconfig, context=args.context,
                   dra_driver=args.dra_driver)
