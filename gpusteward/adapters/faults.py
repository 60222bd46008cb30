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
    """Pod key -> the fault one of its GPUs shows: an XID within ``health.xidWindow``, or
    DCGM's own verdict now."""
    span = exact_range(float(policy.health.xid_window), bool(prometheus.left_closed))
    queries = fault_queries(policy.health, policy.telemetry.node_labels, prometheus.present,
                            float(policy.health.xid_window), span)
    answers = await asyncio.gather(*(prometheus.query(q) for q in queries.values()))
    return assemble(dict(zip(queries, answers, strict=True)), who)


_HEALTH = {"health_failed", "row_remap_failed"}
Seen = tuple[int, str, str, str]  # (XID, or past MAX_XID for DCGM's verdicts; GPU; query; why)


def assemble(answers: Mapping[str, list[dict[str, Any]]], who: Attribution) -> dict[str, Fault]:
    """One fault per pod, the same every cycle: its lowest XID, else the first of DCGM's own
    verdicts on its GPUs."""
    found: dict[str, set[Seen]] = {}
    for name, series in answers.items():
        for s in series:
            labels = s["metric"]
            seen = _seen(name, labels, s["value"][1])
            node = who.node(labels)
            pod = who.pod(labels, node)
            if seen is not None and pod is not None:
                found.setdefault(pod, set()).add(seen)
    return {pod: _fault(min(seen)) for pod, seen in found.items()}


def _seen(name: str, labels: Mapping[str, str], value: str) -> Seen | None:
    gpu = gpu_id(labels)
    if name not in _HEALTH:
        code = _code(name, labels, value)
        return None if code is None else (
            code, gpu, name, f"XID {code} on GPU {gpu} within the health window ({_NAMES[name]})")
    if not _number(value):
        log.warning("fault series %s skipped: %r is no number (%s)", name, value, labels)
        return None
    if name == "row_remap_failed":
        why = f"row remapping failed on GPU {gpu} (DCGM_FI_DEV_ROW_REMAP_FAILURE)"
    else:
        why = (f"DCGM health watch {labels.get('health_watch', '?')} failed on GPU {gpu}: "
               f"{labels.get('health_error_code', '?')} (DCGM_EXP_GPU_HEALTH_STATUS)")
    return MAX_XID + 1, gpu, name, why


def _fault(seen: Seen) -> Fault:
    return Fault(Source.XID if seen[0] <= MAX_XID else Source.DCGM_HEALTH, seen[3])


def _number(value: str) -> bool:
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False


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
