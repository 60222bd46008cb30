"""Aligned plain-text tables, as the report and the what-if print them."""

from __future__ import annotations


def table(rows: list[list[str]], headers: list[str], totals: list[str] | None = None,
          left: int = 1) -> str:
    """Aligned columns: the first `left` columns left-aligned, numbers right-aligned."""
    every = [headers, *rows, *([totals] if totals else [])]
    widths = [max(len(r[i]) for r in every) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [line(headers), *(line(r) for r in rows)]
    if totals:
        out += ["-" * len(line(headers)), line(totals)]
    return "\n".join(out)
