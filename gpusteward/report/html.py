"""One self-contained HTML file: inline CSS and SVG charts drawn here — no script, no CDN, no
font or image to fetch — so it opens offline and can be mailed or archived as is."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape

from gpusteward.core.report.model import GroupRow, Report, TimePoint
from gpusteward.report.render import HEADERS, group_cells, iso, span

ALLOCATED, USED, IDLE = "#9db7d5", "#1f6f3f", "#d9822b"
CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.sub{color:#666;margin-bottom:16px}.warn{color:#a33}
table{border-collapse:collapse;margin:4px 0}td,th{padding:3px 10px;border-bottom:1px solid #ddd}
th{text-align:left;background:#f4f6f8}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.total td{font-weight:600;border-top:2px solid #999}
.grid{display:flex;flex-wrap:wrap;gap:12px}.legend span{margin-right:14px}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
"""


def _hhmm(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")


def _y(v: float, top: float, height: float, pad: float) -> float:
    return pad + (height - 2 * pad) * (1 - v / top)


def timeline_svg(name: str, points: Sequence[TimePoint], width: int = 360,
                 height: int = 170) -> str:
    """Allocated (area) vs used (area) GPUs over the window for one group."""
    if not points:
        return ""
    top = max(1.0, max(p.allocated for p in points))
    pad, left = 22.0, 34.0
    span = max(1.0, points[-1].at - points[0].at)

    def x(t: float) -> float:
        return left + (width - left - 8) * (t - points[0].at) / span

    def area(values: list[float]) -> str:
        coords = " ".join(f"{x(p.at):.1f},{_y(v, top, height, pad):.1f}"
                          for p, v in zip(points, values, strict=True))
        base = _y(0, top, height, pad)
        return f"{x(points[0].at):.1f},{base:.1f} {coords} {x(points[-1].at):.1f},{base:.1f}"

    base = _y(0, top, height, pad)
    return (
        f'<svg class="chart timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" role="img" aria-label="{escape(name)}: allocated vs used GPUs">'
        f'<title>{escape(name)}: allocated vs used GPUs</title>'
        f'<text x="{left}" y="14" font-size="12" font-weight="600">{escape(name)}</text>'
        f'<line x1="{left}" y1="{base:.1f}" x2="{width - 8}" y2="{base:.1f}" stroke="#999"/>'
        f'<line x1="{left}" y1="{pad}" x2="{left}" y2="{base:.1f}" stroke="#999"/>'
        f'<text x="{left - 4}" y="{pad + 4}" font-size="10" text-anchor="end">{top:g}</text>'
        f'<text x="{left - 4}" y="{base:.1f}" font-size="10" text-anchor="end">0</text>'
        f'<polygon points="{area([p.allocated for p in points])}" fill="{ALLOCATED}" '
        f'fill-opacity="0.7"/>'
        f'<polygon points="{area([p.used for p in points])}" fill="{USED}" fill-opacity="0.85"/>'
        f'<text x="{left}" y="{height - 4}" font-size="10">{_hhmm(points[0].at)}</text>'
        f'<text x="{width - 8}" y="{height - 4}" font-size="10" text-anchor="end">'
        f'{_hhmm(points[-1].at)} UTC</text></svg>')


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
           left: int = 1) -> str:
    def tr(cells: Sequence[str], cls: str = "") -> str:
        tds = "".join(f'<td{"" if i < left else " class=n"}>{escape(c)}</td>'
                      for i, c in enumerate(cells))
        return f'<tr class="{cls}">{tds}</tr>'

    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(tr(r) for r in rows) + (tr(total, "total") if total else "")
    return f"<table><tr>{head}</tr>{body}</table>"


def _legend(*items: tuple[str, str]) -> str:
    return '<div class="legend">' + "".join(
        f'<span><i class="sw" style="background:{c}"></i>{escape(t)}</span>'
        for t, c in items) + "</div>"


def _timelines(r: Report, dim: str) -> str:
    charts = "".join(timeline_svg(name, pts) for name, pts in r.timelines.get(dim, {}).items())
    return (f"<h2>Allocated vs used GPUs by {dim}</h2>"
            + _legend(("allocated", ALLOCATED), ("used (busy)", USED))
            + f'<div class="grid">{charts or "<p>no GPU pods in the window</p>"}</div>')


def to_html(r: Report) -> str:
    warn = ("" if r.telemetry_ok else
            f'<p class="warn">Telemetry: {escape(r.telemetry_problem)} — usage shown as '
            "unknown.</p>")
    idle_rows = [[f"{p.namespace}/{p.pod}", p.owner, p.team, f"{p.gpus:g}",
                  iso(p.idle_since) or "-", f"{p.idle_gpu_hours:.2f}",
                  "-" if p.idle_cost is None else f"{p.idle_cost:.2f}", p.reclaimer.action,
                  p.reclaimer.why] for p in r.top_idle]
    queue_rows = [[q.team, q.cls, str(q.pods), str(q.gpus), f"{q.longest_wait_seconds:.0f}s"]
                  for q in r.queue_groups]
    quota_rows = [[q.team, "-" if q.quota is None else str(q.quota), f"{q.used:g}",
                   f"{q.borrowed:g}", f"{q.idle_within_quota:g}", f"{q.idle_borrowed:g}"]
                  for q in r.quotas]
    return "".join([
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f"<title>gpusteward fleet report</title><style>{CSS}</style></head><body>",
        "<h1>GPU fleet report</h1>",
        f'<div class="sub">{span(r.window.end - r.window.start)} window, '
        f"{iso(r.window.start)} to {iso(r.window.end)}, by {escape(r.by)}</div>", warn,
        _table([r.by, *HEADERS], [group_cells(g) for g in r.groups], group_cells(r.totals)),
        _timelines(r, "team"), _timelines(r, "card"),
        f"<h2>Idle GPU-hours by {escape(r.by)}</h2>",
        _legend(("allocated GPU-hours", ALLOCATED), ("idle GPU-hours", IDLE)),
        idle_hours_svg(r.groups),
        "<h2>Top idle pods</h2>",
        _table(["pod", "owner", "team", "GPUs", "idle since", "idle GPU-h", "idle $",
                "reclaimer", "why"], idle_rows, left=3) if idle_rows else "<p>none</p>",
        "<h2>Queue</h2>",
        _table(["team", "class", "pods", "GPUs", "longest wait"], queue_rows, left=2)
        if queue_rows else "<p>no pending GPU pods</p>",
        "<h2>Teams and quotas</h2>",
        _table(["team", "quota", "used", "borrowed", "idle in quota", "idle borrowed"],
               quota_rows),
        "</body></html>\n"])
