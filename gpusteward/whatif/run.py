"""`gpusteward whatif` once its flags are parsed: read history once per kind of policy,
replay each policy over it, write the comparison. Exit codes: see ``whatif.cli``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from gpusteward.adapters.history import HistoryReader
from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.promconnection import PrometheusConnection
from gpusteward.core.policy import Policy, PolicyError
from gpusteward.core.whatif.history import History
from gpusteward.core.whatif.outcome import Outcome
from gpusteward.core.whatif.replay import replay
from gpusteward.whatif import render
from gpusteward.whatif.cli import WhatIfSettings

EXIT_USAGE = 2


def run_whatif(args: argparse.Namespace) -> int:
    try:
        settings = WhatIfSettings.from_args(args, os.environ)
    except PolicyError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    outcomes = asyncio.run(_replay_all(settings.policies, settings.prometheus, settings.start,
                                       settings.end))
    sys.stdout.write(render.RENDERERS[settings.format](outcomes, settings.top))
    return 0


def history_key(policy: Policy) -> str:
    """What a policy's history depends on: policies equal in it share one read."""
    return repr((policy.reclaim.interval, policy.telemetry, policy.resources,
                 policy.card_tiers, sorted(policy.reclaim.exclude_pod_labels),
                 sorted(policy.health.ignored_xids), policy.health.xid_window))


async def _replay_all(policies: Sequence[tuple[str, Policy]], url: PrometheusConnection,
                      start: float, end: float) -> list[Outcome]:
    read: dict[str, History] = {}
    outcomes = []
    for name, policy in policies:
        key = history_key(policy)
        if key not in read:
            source = PrometheusClient(url, policy.telemetry)
            read[key] = await HistoryReader(source, policy).read(start, end)
        outcomes.append(replay(read[key], policy, name))
    return outcomes
