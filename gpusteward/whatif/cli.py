"""`gpusteward whatif`: its flags (``whatif.run`` reads history once per kind of policy,
replays each and writes the comparison). Flags only: every command builds this parser.

    gpusteward whatif --policy FILE [--policy OTHER ...] [--window 7d] [--end TIME]
                      [--format table|json|csv|html] [--top N] [--prometheus-url URL] ...

Exit 0 with the comparison; 1 when Prometheus does not answer or holds no history for the
window (the message says which series were missing); 2 for bad flags or an invalid policy.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpusteward.adapters.connectflags import add_connection_flags, duration_flag
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
