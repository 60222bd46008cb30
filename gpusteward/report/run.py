"""`gpusteward report` once its settings are made: read the cluster and Prometheus through the
adapters, build the pure report, write it as asked. Exit codes: see ``report.cli``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import TextIO

from kubernetes_asyncio import client

from gpusteward.adapters.kube import connect
from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.snapshot import SnapshotReader
from gpusteward.core.report.aggregate import build_report
from gpusteward.report import render
from gpusteward.report.cli import ReportSettings
from gpusteward.report.html import to_html
from gpusteward.report.usage import UsageReader

__all__ = ["EXIT_NO_TELEMETRY", "ProgressLine", "build_usage_reader", "run_report",
           "write_report"]

EXIT_NO_TELEMETRY = 3


def run_report(args: argparse.Namespace) -> int:
    return asyncio.run(write_report(ReportSettings.from_args(args, os.environ)))


def build_usage_reader(settings: ReportSettings, api: client.ApiClient) -> UsageReader:
    """The report's reader wired to its adapters: the reclaimer's snapshot and Prometheus."""
    policy = settings.policy
    source = PrometheusClient(settings.prometheus, policy.telemetry)
    return UsageReader(SnapshotReader(api, source, policy, dra_driver=settings.dra_driver),
                       source, policy)


async def write_report(settings: ReportSettings) -> int:
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
