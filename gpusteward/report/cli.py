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
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gpusteward.adapters.connectflags import add_connection_flags, prometheus_connection
from gpusteward.adapters.errors import SettingsError
from gpusteward.core.policy import Policy, PolicyError, load_policy, parse_policy
from gpusteward.core.report.model import DIMENSIONS
from gpusteward.core.typedconfig import Duration

if TYPE_CHECKING:
    from gpusteward.adapters.promconnection import PrometheusConnection

EXIT_USAGE = 2
EXIT_NO_TELEMETRY = 3
MAX_SLOTS = 2_000  # default step: the window in at most this many slots


def _duration(text: str) -> float:
    try:
        seconds = float(Duration.parse(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    if seconds < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1s, got {text!r}")
    return float(int(seconds))


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def _currency(text: str) -> str:
    if not 0 < len(text.strip()) <= 8:
        raise argparse.ArgumentTypeError(f"expected a symbol or code of 1 to 8 characters, "
                                          f"got {text!r}")
    return text.strip()


def add_report_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("report", help="allocated vs actually used GPUs, idle cost, queue")
    p.add_argument("--policy", metavar="FILE",
                   help="policy YAML file (default: the built-in defaults)")
    p.add_argument("--window", type=_duration, default="24h", metavar="DURATION",
                   help="how far back to look, e.g. 6h, 24h, 7d")
    p.add_argument("--step", type=_duration, metavar="DURATION",
                   help="resolution of the utilization samples (default: the scrape interval, "
                   f"or coarser to keep the window within {MAX_SLOTS} slots)")
    p.add_argument("--by", choices=DIMENSIONS, default="team", help="group rows by")
    p.add_argument("--format", choices=("table", "json", "csv"), default="table",
                   help="what is written to stdout")
    p.add_argument("--html", type=Path, metavar="FILE",
                   help="also write a self-contained HTML report with charts")
    p.add_argument("--top", type=_count, default=10, metavar="N",
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


def run_report(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy) if args.policy else parse_policy({})
    except PolicyError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    prometheus = prometheus_connection(args, policy.telemetry.prometheus_url, os.environ)
    if prometheus is None:
        raise SettingsError("no Prometheus URL (--prometheus-url, PROMETHEUS_URL or the "
                            "policy's telemetry.prometheusUrl)")
    return asyncio.run(_report(args, policy, prometheus))


async def _report(args: argparse.Namespace, policy: Policy,
                  prometheus: PrometheusConnection) -> int:
    from gpusteward.adapters.kube import connect
    from gpusteward.adapters.prometheus import PrometheusSource
    from gpusteward.adapters.snapshot import SnapshotReader
    from gpusteward.adapters.usage import UsageReader
    from gpusteward.core.report.aggregate import build_report
    from gpusteward.report import render
    from gpusteward.report.html import to_html

    api = await connect(args.kubeconfig, args.context)
    source = PrometheusSource(prometheus, policy.telemetry, policy.health)
    reader = UsageReader(SnapshotReader(api, source, policy, dra_driver=args.dra_driver),
                         source, policy)
    progress = ProgressLine(sys.stderr)
    try:
        async with progress:
            inp = await reader.read(args.window, step_for(args.window, args.step, policy),
                                    progress.update)
    finally:
        await api.close()
    report = build_report(inp, policy, by=args.by, top=args.top)
    look = render.Presentation(cluster=args.cluster_name, currency=args.currency)
    if args.format == "csv":
        sys.stdout.write(render.to_csv(report))
    else:
        sys.stdout.write({"table": render.to_table, "json": render.to_json}[args.format](
            report, look))
    if args.html:
        args.html.write_text(to_html(report, look))
        print(f"gpusteward report: wrote {args.html}", file=sys.stderr)
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
