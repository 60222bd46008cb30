"""Chart axes for the report: dated UTC ticks over a window and a y maximum shared by charts.

A reader compares teams at a glance only when their charts share one y scale, and places a dip
in time only from real dates: so ticks fall on round UTC times (every 5 min, 1 h, 1 day...) and
name the date at the first tick and wherever the day changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import NamedTuple

# Round steps in seconds: 1 s ... 1 week; longer windows step by whole days.
STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
         86400, 172800, 259200, 604800)
DAY = 86400


class Tick(NamedTuple):
    at: float
    clock: str  # HH:MM(:SS), or the date when ticks are days apart
    date: str  # YYYY-MM-DD at the first tick and where the day changes, else ""


def time_ticks(start: float, end: float, most: int = 5) -> list[Tick]:
    """At most ``most`` ticks on round UTC times within [start, end]."""
    intervals = max(1, most - 1)
    step = next((s for s in STEPS if (end - start) / s <= intervals),
                -(-int(end - start) // (intervals * DAY)) * DAY)
    first = -(-int(start) // step) * step
    ticks: list[Tick] = []
    for at in range(first, int(end) + 1, step):
        moment = datetime.fromtimestamp(at, UTC)
        day = f"{moment:%Y-%m-%d}"
        if step >= DAY:
            ticks.append(Tick(float(at), day, ""))
            continue
        clock = moment.strftime("%H:%M:%S" if step < 60 else "%H:%M")
        new_day = not ticks or _day(ticks[-1].at) != day
        ticks.append(Tick(float(at), clock, day if new_day else ""))
    return ticks


def _day(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def shared_top(values: Iterable[float]) -> float:
    """One round y maximum for charts drawn side by side: 1, 2, 5 x 10^n at or above the
    largest value (1 when all are zero)."""
    peak = max(values, default=0.0)
    scale = 1.0
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale >= peak:
                return mantissa * scale
        scale *= 10
