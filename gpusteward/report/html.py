"""One self-contained HTML file: inline CSS and SVG charts drawn here — no script, no CDN, no
font or image to fetch — so it opens offline and can be mailed or archived as is."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from gpusteward.core.report.axes import shared_top, time_ticks
from gpusteward.core.report.model import GroupRow, Report, TimePoint
from gpusteward.core.times import span
from gpusteward.report.render import (
    DEFAULT_LOOK,
    FAULTY_HEADERS,
    NOT_FREED_HEADERS,
    QUEUE_HEADERS,
    QUOTA_HEADERS,
    RESERVED_HEADERS,
    Presentation,
    faulty_cells,
    group_cells,
    headers,
    headline,
    idle_pod_cells,
    idle_pod_headers,
    iso,
    not_freed,
    not_freed_cells,
    queue_cells,
    quota_cells,
    reserved,
    reserved_cells,
)

ALLOCATED, USED, IDLE = "#9db7d5", "#1f6f3f", "#d9822b"
# Fits a 1,000 px screen: text wraps between words (names anywhere), numbers never do.
CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px;color:#222}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
.sub{color:#666;margin-bottom:12px}.warn{color:#a33}
.kpis{display:flex;flex-wrap:wrap;gap:12px;margin:8px 0 16px}
.kpi{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:180px}
.kpi b{display:block;font-size:24px;font-variant-numeric:tabular-nums}.kpi small{color:#666}
table{border-collapse:collapse;margin:4px 0;font-size:13px;max-width:100%}
td,th{padding:3px 6px;border-bottom:1px solid #ddd;overflow-wrap:break-word}
td:first-child{overflow-wrap:anywhere}
th{text-align:left;background:#f4f6f8;font-size:12px}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.total td{font-weight:600;border-top:2px solid #999}
.grid{display:flex;flex-wrap:wrap;gap:12px}.legend span{margin-right:14px}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
"""


def _y(v: float, top: float, base: float, pad: float) -> float:
    return pad + (base - pad) * (1 - v / top)


def timeline_svg(name: str, points: Sequence[TimePoint], top: float, width: int = 300,
                 height: int = 180) -> str:
    """Allocated (area) vs used (area) GPUs over the window for one group, on a y scale up to
    ``top`` (shared by the charts of one dimension) and a dated UTC time axis."""
    if not points:
        return ""
    pad, left, right, base = 22.0, 40.0, 24.0, height - 32.0
    start, end = points[0].at, points[-1].at
    span_s = max(1.0, end - start)

    def x(t: float) -> float:
        return left + (width - left - right) * (t - start) / span_s

    def area(values: list[float]) -> str:
        coords = " ".join(f"{x(p.at):.1f},{_y(v, top, base, pad):.1f}"
                          for p, v in zip(points, values, strict=True))
        return f"{x(start):.1f},{base:.1f} {coords} {x(end):.1f},{base:.1f}"

    y_labels = "".join(
        f'<text x="{left - 4}" y="{_y(v, top, base, pad) + 4:.1f}" font-size="10" '
        f'text-anchor="end">{v:g}</text>' for v in (0, top / 2, top))
    ticks = "".join(
        f'<line x1="{x(t.at):.1f}" y1="{base:.1f}" x2="{x(t.at):.1f}" y2="{base + 4:.1f}" '
        f'stroke="#999"/><text x="{x(t.at):.1f}" y="{base + 15:.1f}" font-size="10" '
        f'text-anchor="middle">{t.clock}</text>'
        + (f'<text x="{x(t.at):.1f}" y="{base + 27:.1f}" font-size="10" text-anchor="middle" '
           f'fill="#666">{t.date}</text>' if t.date else "")
        for t in time_ticks(start, end, most=4))
    return (
        f'<svg class="chart timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" role="img" aria-label="{escape(name)}: allocated vs used GPUs">'
        f'<title>{escape(name)}: allocated vs used GPUs (UTC)</title>'
        f'<text x="{left}" y="14" font-size="12" font-weight="600">{escape(name)}</text>'
        f'<polygon points="{area([p.allocated for p in points])}" fill="{ALLOCATED}" '
        f'fill-opacity="0.7"/>'
        f'<polygon points="{area([p.used for p in points])}" fill="{USED}" fill-opacity="0.85"/>'
        f'<line x1="{left}" y1="{base:.1f}" x2="{width - right}" y2="{base:.1f}" stroke="#999"/>'
        f'<line x1="{left}" y1="{pad}" x2="{left}" y2="{base:.1f}" stroke="#999"/>'
        f'{y_labels}{ticks}</svg>')


def idle_hours_svg(rows: Sequence[GroupRow], width: int = 560) -> str:
    """Horizontal bars: GPU-hours allocated and, over them, idle, per group."""
    bar, gap, label = 16, 10, 170
    height = max(1, len(rows)) * (bar + gap) + 24
    top = max([r.allocated_gpu_hours for r in rows] + [1e-9])
    scale = (width - label - 90) / top
    parts = [f'<svg class="chart idle-hours" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" role="img" aria-label="idle GPU-hours">'
             f'<title>Idle GPU-hours by group</title>']
    for i, r in enumerate(rows):
        y = 8 + i * (bar + gap)
        parts.append(
            f'<text x="{label - 6}" y="{y + 12}" font-size="11" text-anchor="end">'
            f'{escape(r.name[:26])}</text>'
            f'<rect x="{label}" y="{y}" width="{r.allocated_gpu_hours * scale:.1f}" '
            f'height="{bar}" fill="{ALLOCATED}"/>'
            f'<rect x="{label}" y="{y}" width="{r.idle_gpu_hours * scale:.1f}" height="{bar}" '
            f'fill="{IDLE}"/>'
            f'<text x="{label + r.allocated_gpu_hours * scale + 4:.1f}" y="{y + 12}" '
            f'font-size="11">{r.idle_gpu_hours:.2f} / {r.allocated_gpu_hours:.2f} h</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], total: Sequence[str] = (),
           left: int = 1, tail: int = 0) -> str:
    """Text in the first ``left`` and the last ``tail`` columns (they wrap), numbers between."""
    def tr(cells: Sequence[str], cls: str = "") -> str:
        tds = "".join(f'<td{"" if i < left or i >= len(cells) - tail else " class=n"}>'
                      f"{escape(c)}</td>" for i, c in enumerate(cells))
        return f'<tr class="{cls}">{tds}</tr>'

    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(tr(r) for r in rows) + (tr(total, "total") if total else "")
    return f"<table><tr>{head}</tr>{body}</table>"


def _legend(*items: tuple[str, str]) -> str:
    return '<div class="legend">' + "".join(
        f'<span><i class="sw" style="background:{c}"></i>{escape(t)}</span>'
        for t, c in items) + "</div>"


def _timelines(r: Report, dim: str) -> str:
    groups = r.timelines.get(dim, {})
    top = shared_top(p.allocated for points in groups.values() for p in points)
    charts = "".join(timeline_svg(name, pts, top) for name, pts in groups.items())
    return (f"<h2>Allocated vs used GPUs by {dim} (UTC, one scale)</h2>"
            + _legend(("allocated", ALLOCATED), ("used (busy)", USED))
            + f'<div class="grid">{charts or "<p>no GPU pods in the window</p>"}</div>')


def _headline(r: Report, look: Presentation) -> str:
    return '<div class="kpis">' + "".join(
        f'<div class="kpi">{escape(label)}<b>{escape(value)}</b><small>{escape(note)}</small>'
        "</div>" for label, value, note in headline(r, look)) + "</div>"


def to_html(r: Report, look: Presentation = DEFAULT_LOOK) -> str:
    warn = ("" if r.telemetry_ok else
            f'<p class="warn">Telemetry: {escape(r.telemetry_problem)} — usage shown as '
            "unknown.</p>")
    queue = _table(QUEUE_HEADERS, [queue_cells(g) for g in r.queue_groups], left=2)
    return "".join([
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(look.title())}</title><style>{CSS}</style></head><body>",
        f"<h1>{escape(look.title())}</h1>",
        f'<div class="sub">{span(r.window.end - r.window.start)} window, '
        f"{iso(r.window.start)} to {iso(r.window.end)}, by {escape(r.by)}; costs in "
        f"{escape(look.currency)}</div>", warn, _headline(r, look),
        _table([r.by.upper(), *headers(look.currency)], [group_cells(g) for g in r.groups],
               group_cells(r.totals)),
        _timelines(r, "team"), _timelines(r, "card"),
        f"<h2>Idle GPU-hours by {escape(r.by)}</h2>",
        _legend(("allocated GPU-hours", ALLOCATED), ("idle GPU-hours", IDLE)),
        idle_hours_svg(r.groups),
        "<h2>Top idle pods</h2>",
        _table(idle_pod_headers(look.currency), [idle_pod_cells(p) for p in r.top_idle], left=3,
               tail=2)
        if r.top_idle else "<p>none</p>",
        *(["<h2>Pods on faulty GPUs</h2>",
           _table(FAULTY_HEADERS, [faulty_cells(f) for f in r.faulty], left=3)]
          if r.faulty else []),
        "<h2>Queue</h2>", queue if r.queue_groups else "<p>no pending GPU pods</p>",
        *(["<h3>Reserved for waiting pods</h3>",
           _table(RESERVED_HEADERS, [reserved_cells(q) for q in held], left=2)]
          if (held := reserved(r)) else []),
        *(["<h3>Not freed for waiting gangs</h3>",
           _table(NOT_FREED_HEADERS, [not_freed_cells(q) for q in short], left=2)]
          if (short := not_freed(r)) else []),
        "<h2>Teams and quotas</h2>",
        _table(QUOTA_HEADERS, [quota_cells(q) for q in r.quotas]),
        "</body></html>\n"])
