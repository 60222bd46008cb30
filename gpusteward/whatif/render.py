"""The what-if comparison as a terminal table, JSON, CSV or a self-contained HTML page."""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from gpusteward.core.texttable import table
from gpusteward.core.times import span, stamp
from gpusteward.core.whatif.outcome import Outcome


def summary(o: Outcome) -> list[tuple[str, str]]:
    return [
        ("GPU-hours freed", f"{o.gpu_hours:.2f}"),
        ("workloads warned", str(len({w.pod for w in o.warned}))),
        ("workloads reclaimed", str(len({r.owner for r in o.reclaimed}))),
        ("busy again within the grace", str(len(o.comebacks))),
        ("pending pods started earlier", str(len(o.earlier))),
        ("hours pending pods saved", f"{sum(e.earlier_s for e in o.earlier) / 3600:.2f}"),
        ("cycles halted (no telemetry)", str(o.halted_steps)),
    ]


def _side_by_side(outcomes: Sequence[Outcome], axis: str) -> list[list[str]]:
    keys: list[str] = []
    for o in outcomes:
        keys += [k for k in o.hours_by(axis) if k not in keys]
    return [[k, *(f"{o.hours_by(axis).get(k, 0.0):.2f}" for o in outcomes)] for k in keys]


def to_table(outcomes: Sequence[Outcome], top: int) -> str:
    first = outcomes[0]
    names = [o.policy for o in outcomes]
    parts = [f"what-if: {span(first.end - first.start)} of history to {stamp(first.end)}, "
             f"replayed every {span(first.step)} (the reclaimer's interval)"]
    rows = [[label, *(dict(summary(o))[label] for o in outcomes)] for label, _ in
            summary(first)]
    parts.append(table(rows, ["", *names]))
    for axis in ("team", "card"):
        found = _side_by_side(outcomes, axis)
        if found:
            parts.append(f"GPU-hours freed by {axis}\n" + table(found, [axis.upper(), *names]))
    for o in outcomes:
        parts += _details(o, top)
    parts.append("What the history lacked, and how it bounds these figures:\n" + "\n".join(
        f"  - {g}" for g in dict.fromkeys(g for o in outcomes for g in o.gaps)))
    return "\n\n".join(parts) + "\n"


def _details(o: Outcome, top: int) -> list[str]:
    out = []
    if o.reclaimed:
        rows = [[r.pod, r.team, str(r.gpus), stamp(r.at), r.how, f"{r.gpu_hours:.2f}"]
                for r in sorted(o.reclaimed, key=lambda r: -r.gpu_hours)[:top]]
        out.append(f"{o.policy}: reclaimed\n" + table(
            rows, ["POD", "TEAM", "GPUS", "AT", "HOW", "GPU-H"], left=2))
    if o.comebacks:
        rows = [[c.pod, c.team, str(c.gpus), stamp(c.idle_at), span(c.back_at - c.idle_at),
                 f"{c.peak_percent:.0f}"] for c in o.comebacks[:top]]
        out.append(f"{o.policy}: false-positive risks (idle, then busy again within the "
                   "grace)\n" + table(rows, ["POD", "TEAM", "GPUS", "IDLE AT", "BACK AFTER",
                                             "PEAK%"], left=2))
    if o.earlier:
        rows = [[e.pod, e.team, str(e.gpus), stamp(e.pending_from), span(e.earlier_s)]
                for e in sorted(o.earlier, key=lambda e: -e.earlier_s)[:top]]
        out.append(f"{o.policy}: pending pods that would have started earlier\n" + table(
            rows, ["POD", "TEAM", "GPUS", "PENDING FROM", "EARLIER BY"], left=2))
    return out


def document(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    def one(o: Outcome) -> dict[str, Any]:
        d = msgspec.to_builtins(o)
        d["gpuHours"] = round(o.gpu_hours, 3)
        d["gpuHoursByTeam"] = {k: round(v, 3) for k, v in o.hours_by("team").items()}
        d["gpuHoursByCard"] = {k: round(v, 3) for k, v in o.hours_by("card").items()}
        for r, raw in zip(o.reclaimed, d["reclaimed"], strict=True):
            raw["gpu_hours"] = round(r.gpu_hours, 3)
        return d

    return {"policies": [one(o) for o in outcomes]}


def to_json(outcomes: Sequence[Outcome], top: int = 0) -> str:
    return json.dumps(document(outcomes), indent=2) + "\n"


CSV_FIELDS = ("policy", "event", "pod", "team", "card", "gpus", "at", "until", "gpu_hours",
              "detail")


def to_csv(outcomes: Sequence[Outcome], top: int = 0) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for o in outcomes:
        for wn in o.warned:
            w.writerow([o.policy, "warned", wn.pod, wn.team, "", wn.gpus, stamp(wn.at),
                        stamp(wn.reclaim_at), "", ""])
        for r in o.reclaimed:
            w.writerow([o.policy, "reclaimed", r.pod, r.team, r.card, r.gpus, stamp(r.at),
                        stamp(r.until), f"{r.gpu_hours:.3f}", r.how])
        for c in o.comebacks:
            w.writerow([o.policy, "comeback", c.pod, c.team, "", c.gpus, stamp(c.idle_at),
                        stamp(c.back_at), "", f"peak {c.peak_percent:.0f}%"])
        for e in o.earlier:
            w.writerow([o.policy, "earlier", e.pod, e.team, "", e.gpus,
                        stamp(e.could_start_at), stamp(e.started_at), "", ""])
    return out.getvalue()


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def to_html(outcomes: Sequence[Outcome], top: int) -> str:
    names = [o.policy for o in outcomes]
    parts = ["<h1>gpusteward what-if</h1>",
             f"<p>{html.escape(span(outcomes[0].end - outcomes[0].start))} of history to "
             f"{stamp(outcomes[0].end)}</p>",
             _html_table(["", *names], [[label, *(dict(summary(o))[label] for o in outcomes)]
                                        for label, _ in summary(outcomes[0])])]
    for axis in ("team", "card"):
        parts += [f"<h2>GPU-hours freed by {axis}</h2>",
                  _html_table([axis, *names], _side_by_side(outcomes, axis))]
    for o in outcomes:
        parts += [f"<h2>{html.escape(o.policy)}: reclaimed</h2>", _html_table(
            ["pod", "team", "GPUs", "at", "how", "GPU-h"],
            [[r.pod, r.team, str(r.gpus), stamp(r.at), r.how, f"{r.gpu_hours:.2f}"]
             for r in sorted(o.reclaimed, key=lambda r: -r.gpu_hours)[:top]])]
    gaps = dict.fromkeys(g for o in outcomes for g in o.gaps)
    parts += ["<h2>What the history lacked</h2><ul>",
              *(f"<li>{html.escape(g)}</li>" for g in gaps), "</ul>"]
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
             "td:first-child,th:first-child{text-align:left}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>gpusteward what-if"
            f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>\n")


RENDERERS: dict[str, Callable[[Sequence[Outcome], int], str]] = {
    "table": to_table, "json": to_json, "csv": to_csv, "html": to_html}
