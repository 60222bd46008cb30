"""`gpusteward report`: flags, wiring of the adapters to the pure report, and output.

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
import asyncio
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from gpusteward.adapters.connectflags import (
    add_connection_flags,
    duration_flag,
    prometheus_connection,
    whole_number,
)
from gpusteward.adapters.errors import SettingsError
from gpusteward.core.policy import Policy, load_policy, parse_policy
from gpusteward.core.report.model import DIMENSIONS

if TYPE_CHECKING:
    from kubernetes_asyncio import client

    from gpusteward.adapters.promconnection import PrometheusConnection
    from gpusteward.report.usage import UsageReader

EXIT_NO_TELEMETRY = 3
MAX_SLOTS = 2_000  # default step: the window in at most this many slots


def _currency(text: str) -> str:
    if not 0 < len(text.strip()) <= 8:
        raise argparse.ArgumentTypeError(f"expected a symbol or code of 1 to 8 characters, "
                                          f"got {text!r}")
    return text.strip()


def add_report_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("report", help="allocated vs actually used GPUs, idle cost, queue")
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
    return p


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


def run_report(args: argparse.Namespace) -> int:
    return asyncio.run(write_report(ReportSettings.from_args(args, os.environ)))


def build_usage_reader(settings: ReportSettings, api: client.ApiClient) -> UsageReader:
    """The report's reader wired to its adapters: the reclaimer's snapshot and Prometheus."""
    from gpusteward.adapters.prometheus import PrometheusSource
    from gpusteward.adapters.snapshot import SnapshotReader
    from gpusteward.report.usage import UsageReader

    policy = settings.policy
    source = PrometheusSource(settings.prometheus, policy.telemetry, policy.health)
    return UsageReader(SnapshotReader(api, source, policy, dra_driver=settings.dra_driver),
                       source, policy)


async def write_report(settings: ReportSettings) -> int:
    from gpusteward.adapters.kube import connect
    from gpusteward.core.report.aggregate import build_report
    from gpusteward.report import render
    from gpusteward.report.html import to_html

    api = await connect(settings.kubeconfig, settings.context)
    reader = build_usage_reader(settings, api)
    progress = ProgressLine(sys.stderr)
    try:
        async with progress:
            inp = await reader.read(settings.window, settings.step, progress.update)
    finally:
        await api.close()
    report = build_report(inp, settings.policy, by=settings.by, top=settings.top)
    look = render.Presentation(cluster=settings.cluster_name, currency=settings.currency)
    if settings.format == "csv":
        sys.stdout.write(render.to_csv(report))
    else:
        sys.stdout.write({"table": render.to_table, "json": render.to_json}[settings.format](
            report, look))
    if settings.html:
        settings.html.write_text(to_html(report, look))
        print(f"gpusteward report: wrote {settings.html}", file=sys.stderr)
    if not report.telemetry_ok:
        print(f"gpusteward report: telemetry unavailable, usage shown as unknown: "
              f"{report.telemetry_problem}", file=sys.stderr)
        return EXIT_NO_TELEMETRY
    return 0


class ProgressLine:
    """A spinner with elapsed time on a terminal, one line per finished query otherwise."""

    FRAMES = "|/-\\"

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.tty = stream.isatty()
        self.done, self.total = 0, 0
        self.started = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def update(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        if not self.tty and total and done:
            self.stream.write(f"gpusteward report: Prometheus range query {done}/{total} done "
                              f"({time.monotonic() - self.started:.1f}s)\n")

    def _line(self, frame: int) -> str:
        return (f"\r{self.FRAMES[frame % 4]} reading the cluster and Prometheus: range query "
                f"{self.done}/{self.total or '?'} ({time.monotonic() - self.started:.1f}s)")

    async def _spin(self) -> None:
        frame = 0
        while True:
            self.stream.write(self._line(frame))
            self.stream.flush()
            frame += 1
            await asyncio.sleep(0.2)

    async def __aenter__(self) -> ProgressLine:
        if self.tty:
            self._task = asyncio.create_task(self._spin())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            self.stream.write("\r\033[K")
            self.stream.flush()
