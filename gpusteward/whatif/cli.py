"""`gpusteward whatif`: flags, reading history once per kind of policy, replay, output.

    gpusteward whatif --policy FILE [--policy OTHER ...] [--window 7d] [--end TIME]
                      [--format table|json|csv|html] [--top N] [--prometheus-url URL] ...

Exit 0 with the comparison; 1 when Prometheus does not answer or holds no history for the
window (the message says which series were missing); 2 for bad flags or an invalid policy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from gpusteward.adapters.connectflags import (
    add_connection_flags,
    duration_flag,
    prometheus_connection,
)
from gpusteward.adapters.errors import SettingsError
from gpusteward.core.policy import Policy, PolicyError, load_policy
from gpusteward.core.times import parse_time
from gpusteward.core.whatif.history import History
from gpusteward.core.whatif.outcome import Outcome
from gpusteward.core.whatif.replay import replay

EXIT_USAGE = 2
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


def add_whatif_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "whatif", help="replay policies over recorded history: what they would have freed")
    p.add_argument("--policy", action="append", required=True, metavar="FILE",
                   help="a policy YAML file; repeat to compare policies side by side")
    p.add_argument("--window", type=duration_flag(60), default="7d", metavar="DURATION",
                   help="how much history to replay, ending at --end (e.g. 6h, 7d)")
    p.add_argument("--end", type=_time, metavar="TIME",
                   help="the end of the replayed window, RFC 3339 (default: now)")
    p.add_argument("--format", choices=FORMATS, default="table", help="what stdout gets")
    p.add_argument("--top", type=_count, default=10, metavar="N",
                   help="how many reclaims, comebacks and earlier starts to list per policy")
    add_connection_flags(p)
    return p


def run_whatif(args: argparse.Namespace) -> int:
    try:
        policies = list(zip(_names(args.policy), map(load_policy, args.policy), strict=True))
    except PolicyError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    url = prometheus_connection(args, policies[0][1].telemetry.prometheus_url, os.environ)
    if url is None:
        raise SettingsError("no Prometheus URL (--prometheus-url, PROMETHEUS_URL or the "
                            "policy's telemetry.prometheusUrl)")
    end = args.end if args.end is not None else time.time()
    outcomes = asyncio.run(_replay_all(policies, url, end - args.window, end))
    from gpusteward.whatif import render

    sys.stdout.write(render.RENDERERS[args.format](outcomes, args.top))
    return 0


def _names(files: list[str]) -> list[str]:
    """Each policy's column: its file name, or its path where two share a name."""
    names = [Path(f).name for f in files]
    return names if len(set(names)) == len(names) else files


def history_key(policy: Policy) -> str:
    """What a policy's history depends on: policies equal in it share one read."""
    return repr((policy.reclaim.interval, policy.telemetry, policy.resources,
                 policy.card_tiers, sorted(policy.reclaim.exclude_pod_labels)))


async def _replay_all(policies: list[tuple[str, Policy]], url: Any, start: float,
                      end: float) -> list[Outcome]:
    from gpusteward.adapters.history import HistoryReader
    from gpusteward.adapters.prometheus import PrometheusSource

    read: dict[str, History] = {}
    outcomes = []
    for name, policy in policies:
        key = history_key(policy)
        if key not in read:
            source = PrometheusSource(url, policy.telemetry, policy.health)
            read[key] = await HistoryReader(source, policy).read(start, end)
        outcomes.append(replay(read[key], policy, name))
    return outcomes
