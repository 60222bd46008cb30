"""The report as a stable JSON document, CSV rows and an aligned terminal table."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any

from gpusteward.core.report.model import (
    FaultyPod,
    GroupRow,
    IdlePod,
    QueuedPod,
    QueueGroup,
    Report,
    TeamQuota,
)
from gpusteward.core.texttable import table
from gpusteward.core.times import ago, span, stamp

ROW_FIELDS = ("name", "allocatable", "allocated", "used", "idle", "unknown", "free",
              "allocation_ratio", "active_ratio", "mean_util_percent", "allocated_gpu_hours",
              "idle_gpu_hours", "unknown_gpu_hours", "idle_cost", "faulty")  # new fields last
DIGITS = {"allocation_ratio": 4, "active_ratio": 4, "mean_util_percent": 1,
          "allocated_gpu_hours": 4, "idle_gpu_hours": 4, "unknown_gpu_hours": 4, "idle_cost": 2,
          "idle_since": 0, "wait_seconds": 0, "longest_wait_seconds": 0}


@dataclass(frozen=True)
class Presentation:
    """How a reader sees the report: the cluster it is about and the currency of the policy's
    costPerGpuHour (a number: the report converts nothing, it only names the unit)."""

    cluster: str = ""
    currency: str = "$"

    def money(self, amount: float | None) -> str:
        """$1,234.50; a word-like currency gets a space: EUR 1,234.50."""
        if amount is None:
            return "-"
        gap = " " if self.currency[-1:].isalpha() else ""
        return f"{self.currency}{gap}{amount:,.2f}"

    def title(self) -> str:
        return "GPU fleet report" + (f" for {self.cluster}" if self.cluster else "")


DEFAULT_LOOK = Presentation()


def iso(t: float | None) -> str | None:
    return None if t is None else stamp(t)


def _num(key: str, value: Any) -> Any:
    if isinstance(value, float):
        return round(value, DIGITS.get(key, 3))
    return value


def row_dict(row: GroupRow) -> dict[str, Any]:
    return {f: _num(f, getattr(row, f)) for f in ROW_FIELDS}


def _plain(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in obj.__struct_fields__:
        value = getattr(obj, key)
        if key == "idle_since":
            out[key] = iso(value)
        elif key == "reclaimer":
            out[key] = _plain(value)
        else:
            out["class" if key == "cls" else key] = _num(key, value)
    return out


def document(r: Report, look: Presentation = DEFAULT_LOOK) -> dict[str, Any]:
    """The JSON document; keys and their order are a contract for scripts (new keys last)."""
    return {
        "window": {"start": iso(r.window.start), "end": iso(r.window.end),
                   "seconds": round(r.window.end - r.window.start),
                   "step_seconds": round(r.window.step)},
        "by": r.by,
        "telemetry": {"ok": r.telemetry_ok, "problem": r.telemetry_problem},
        "groups": [row_dict(g) for g in r.groups],
        "totals": row_dict(r.totals),
        "top_idle_pods": [_plain(p) for p in r.top_idle],
        "queue": {"pods": [_plain(q) for q in r.queue],
                  "by_team_class": [_plain(g) for g in r.queue_groups]},
        "quotas": [_plain(q) for q in r.quotas],
        "timelines": {dim: {name: [[iso(p.at), _num("", p.allocated), _num("", p.used)]
                                   for p in points] for name, points in groups.items()}
                      for dim, groups in r.timelines.items()},
        "cluster": look.cluster,
        "currency": look.currency,
        "faulty_pods": [_plain(f) for f in r.faulty],
    }


def to_json(r: Report, look: Presentation = DEFAULT_LOOK) -> str:
    return json.dumps(document(r, look), indent=2) + "\n"


def to_csv(r: Report) -> str:
    """One row per group, then the totals row (name `total`); empty cells for unknown values."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([r.by, *ROW_FIELDS[1:]])
    for g in (*r.groups, r.totals):
        writer.writerow(["" if v is None else v for v in row_dict(g).values()])
    return out.getvalue()


# --- terminal table ---------------------------------------------------------------------

def headers(currency: str) -> list[str]:
    """The group table's columns after the group name; the cost column names the currency."""
    return ["ALLOCATABLE", "ALLOCATED", "USED", "IDLE", "UNKNOWN", "FAULTY", "FREE", "ALLOC%",
            "ACTIVE%", "UTIL%", "GPU-H", "IDLE GPU-H", f"IDLE {currency}"]


def _g(v: float | None, fmt: str = "{:g}") -> str:
    return "-" if v is None else fmt.format(round(v, 2) if fmt == "{:g}" else v)


def group_cells(g: GroupRow) -> list[str]:
    pct = "{:.0%}"
    return [g.name, _g(g.allocatable), _g(g.allocated), _g(g.used), _g(g.idle), _g(g.unknown),
            _g(g.faulty), _g(g.free), _g(g.allocation_ratio, pct), _g(g.active_ratio, pct),
            _g(g.mean_util_percent, "{:.0f}"), _g(g.allocated_gpu_hours, "{:.2f}"),
            _g(g.idle_gpu_hours, "{:.2f}"), _g(g.idle_cost, "{:.2f}")]


def to_table(r: Report, look: Presentation = DEFAULT_LOOK) -> str:
    parts = [f"{look.title()}: {span(r.window.end - r.window.start)} window to "
             f"{iso(r.window.end)}, step {span(r.window.step)}, by {r.by}"]
    if not r.telemetry_ok:
        parts.append(f"telemetry: {r.telemetry_problem} (usage shown as unknown)")
    parts.append(table([group_cells(g) for g in r.groups], [r.by.upper(), *headers(look.currency)],
                       group_cells(r.totals)))
    parts.append(_idle_section(r, look.currency))
    parts.append(_faulty_section(r))
    parts.append(_queue_section(r))
    parts.append(_quota_section(r))
    return "\n\n".join(p for p in parts if p) + "\n"


def headline(r: Report, look: Presentation) -> list[tuple[str, str, str]]:
    """(figure, value, note) a finance or platform lead reads first: idle GPUs and what their
    idle time cost over the window."""
    t, window = r.totals, span(r.window.end - r.window.start)
    if not r.telemetry_ok:
        return [("Idle GPUs", "unknown", "telemetry unavailable"),
                ("Idle GPU-hours", "unknown", f"last {window}"),
                ("Idle cost", "unknown", f"last {window}")]
    unknown = f"; {_g(t.unknown)} unknown" if t.unknown else ""
    priced = ("" if t.idle_cost is not None
              else "no costPerGpuHour in the policy's card tiers")
    return [("Idle GPUs", f"{_g(t.idle)} of {_g(t.allocated)}",
             f"allocated GPUs idle all {window}{unknown}"),
            ("Idle GPU-hours", f"{t.idle_gpu_hours:,.2f}",
             f"of {t.allocated_gpu_hours:,.2f} allocated in the last {window}"),
            ("Idle cost", look.money(t.idle_cost), priced or f"last {window}")]


def idle_pod_cells(p: IdlePod) -> list[str]:
    return [_idle_who(p), p.owner, p.team, _g(p.gpus), iso(p.idle_since) or "-",
            f"{p.idle_gpu_hours:.2f}", "-" if p.idle_cost is None else f"{p.idle_cost:.2f}",
            p.reclaimer.action, p.reclaimer.why]


def _idle_who(p: IdlePod) -> str:
    if not p.gang:
        return f"{p.namespace}/{p.pod}"
    idle = "all idle" if len(p.idle_pods) == p.pods else f"idle: {', '.join(p.idle_pods)}"
    return f"{p.gang} ({p.pods} pods, {idle})"


def idle_pod_headers(currency: str) -> list[str]:
    return ["POD", "OWNER", "TEAM", "GPUS", "IDLE SINCE", "IDLE GPU-H", f"IDLE {currency}",
            "RECLAIMER", "WHY"]


def queue_cells(g: QueueGroup) -> list[str]:
    return [g.team, g.cls, str(g.pods), str(g.gpus), ago(g.longest_wait_seconds)]


QUEUE_HEADERS = ["TEAM", "CLASS", "PODS", "GPUS", "LONGEST WAIT"]
RESERVED_HEADERS = ["POD", "TEAM", "GPUS", "NODE", "UNTIL"]


def reserved_cells(q: QueuedPod) -> list[str]:
    return [f"{q.namespace}/{q.pod}", q.team, str(q.gpus), q.reserved_node, q.reserved_until]


def reserved(r: Report) -> list[QueuedPod]:
    """The waiting pods GPUs are reserved for, GPUs freed for them by a queue reclaim."""
    return [q for q in r.queue if q.reserved_node]


NOT_FREED_HEADERS = ["POD", "TEAM", "WHY"]


def not_freed_cells(q: QueuedPod) -> list[str]:
    return [f"{q.namespace}/{q.pod}", q.team, q.not_freed]


def not_freed(r: Report) -> list[QueuedPod]:
    """The waiting gangs no idle GPUs are freed for, though some could be: the reclaimer's
    note why."""
    return [q for q in r.queue if q.not_freed]
FAULTY_HEADERS = ["POD", "TEAM", "NODE", "GPUS", "FAULT"]


def faulty_cells(f: FaultyPod) -> list[str]:
    return [f"{f.namespace}/{f.pod}", f.team, f.node, _g(f.gpus), f.fault]
QUOTA_HEADERS = ["TEAM", "QUOTA", "USED", "BORROWED", "IDLE IN QUOTA", "IDLE BORROWED"]


def quota_cells(q: TeamQuota) -> list[str]:
    # GPUs are fractional where a MIG slice or a time-sliced replica counts as its share
    return [q.team, "-" if q.quota is None else str(q.quota), _g(q.used), _g(q.borrowed),
            _g(q.idle_within_quota), _g(q.idle_borrowed)]


def _idle_section(r: Report, currency: str) -> str:
    if not r.top_idle:
        return "Top idle pods: none"
    return "Top idle pods\n" + table([idle_pod_cells(p) for p in r.top_idle],
                                     idle_pod_headers(currency), left=3)


def _faulty_section(r: Report) -> str:
    """Pods on faulty GPUs: shown only when there are any (a healthy fleet's report is as
    before)."""
    if not r.faulty:
        return ""
    return ("Pods on faulty GPUs (not idle, not reclaimed; the health pipeline owns the repair)\n"
            + table([faulty_cells(f) for f in r.faulty], FAULTY_HEADERS, left=3))


def _queue_section(r: Report) -> str:
    if not r.queue_groups:
        return "Queue: no pending GPU pods"
    out = "Queue\n" + table([queue_cells(g) for g in r.queue_groups], QUEUE_HEADERS, left=2)
    if held := reserved(r):
        out += "\n\nReserved for waiting pods\n" + table(
            [reserved_cells(q) for q in held], RESERVED_HEADERS, left=2)
    if short := not_freed(r):
        out += "\n\nNot freed for waiting gangs\n" + table(
            [not_freed_cells(q) for q in short], NOT_FREED_HEADERS, left=2)
    return out


def _quota_section(r: Report) -> str:
    if not r.quotas:
        return ""
    return "Teams and quotas\n" + table([quota_cells(q) for q in r.quotas], QUOTA_HEADERS)
