"""`gpusteward whatif` once its flags are parsed: read history once per kind of policy,
replay each policy over it, write the comparison. Exit codes: see ``whatif.cli``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from gpusteward.adapters.connectflags import prometheus_connection
from gpusteward.adapters.errors import SettingsError
from gpusteward.adapters.history import HistoryReader
from gpusteward.adapters.policyfile import load_policy
from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.core.policy import Policy, PolicyError
from gpusteward.core.whatif.history import History
from gpusteward.core.whatif.outcome import Outcome
from gpusteward.core.whatif.replay import replay
from gpusteward.whatif import render

EXIT_USAGE = 2


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
    read: dict[str, History] = {}
    outcomes = []
    for name, policy in policies:
        key = history_key(policy)
        if key not in read:
            source = PrometheusClient(url, policy.telemetry)
            read[key] = await HistoryReader(source, policy).read(start, end)
        outcomes.append(replay(read[key], policy, name))
    return outcomes
