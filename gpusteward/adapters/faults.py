"""The GPU faults telemetry shows (adapters/promql.fault_queries), per pod holding the GPU.

A series that names no verified holder (a free GPU, the exporter's own pod) protects nobody
and is left out here. A value that is no number, or no XID, affects only its own series: it is
skipped, as the extender's refresh skips it (adapters/telemetry.py)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from typing import Any

from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.promql import exact_range, fault_queries
from gpusteward.core.attribution import Attribution
from gpusteward.core.dcgm import MAX_XID, gpu_id
from gpusteward.core.health import Fault, Source
from gpusteward.core.policy import Policy

log = logging.getLogger("gpusteward.faults")

_NAMES = {"xid_total": "DCGM_EXP_XID_ERRORS_TOTAL rose", "xid_new": "DCGM_EXP_XID_ERRORS_TOTAL",
          "xid_counted": "DCGM_EXP_XID_ERRORS_COUNT", "xid_gauge": "the XID gauge"}


async def gpu_faults(prometheus: PrometheusClient, policy: Policy, who: Attribution
                     ) -> dict[str, Fault]:
    """Pod key -> the fault one of its GPUs shows within ``health.xidWindow``."""
    span = exact_range(float(policy.health.xid_window), bool(prometheus.left_closed))
    queries = fault_queries(policy.health, policy.telemetry.node_labels, prometheus.present,
                            float(policy.health.xid_window), span)
    answers = await asyncio.gather(*(prometheus.query(q) for q in queries.values()))
    return assemble(dict(zip(queries, answers, strict=True)), who)


def assemble(answers: Mapping[str, list[dict[str, Any]]], who: Attribution) -> dict[str, Fault]:
    """The lowest-numbered fault per pod, so the reason is the same every cycle."""
    found: dict[str, set[tuple[int, str, str]]] = {}
    for name, series in answers.items():
        for s in series:
            labels = s["metric"]
            code = _code(name, labels, s["value"][1])
            node = who.node(labels)
            pod = who.pod(labels, node)
            if code is None or pod is None:
                continue
            found.setdefault(pod, set()).add((code, gpu_id(labels), name))
    return {pod: _fault(min(seen)) for pod, seen in found.items()}


def _fault(seen: tuple[int, str, str]) -> Fault:
    code, gpu, name = seen
    return Fault(Source.XID, f"XID {code} on GPU {gpu} within the health window ({_NAMES[name]})")


def _code(name: str, labels: Mapping[str, str], value: str) -> int | None:
    """The XID a fault series stands for; None for one that is no number or no XID."""
    text = value if name == "xid_gauge" else labels.get("xid", "")
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number.is_integer() and 0 < number <= MAX_XID):
        log.warning("fault series %s skipped: %r is no XID (%s)", name, text, labels)
        return None
    return int(number)
