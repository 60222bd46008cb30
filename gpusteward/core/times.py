"""Time units in seconds, and the one timestamp format: RFC 3339 in UTC, to the second.

The format is the one the API server writes (``metav1.Time``: ``2026-11-30T13:07:54Z``), so the
reclaimer's pod annotations, the report's JSON and the Kubernetes objects we read share it.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["DAY", "HOUR", "MINUTE", "parse_time", "stamp"]

MINUTE, HOUR, DAY = 60, 3600, 86400


def stamp(t: float) -> str:
    """Unix seconds -> ``2026-11-30T13:07:54Z`` (fractions dropped)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 time (``Z`` or an offset, fractions allowed) -> Unix seconds; None if absent.

    Raises ValueError for text that is not one."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def span(seconds: float) -> str:
    """90061 -> 1d1h1m1s; zero units left out."""
    s, out = int(seconds), ""
    for unit, size in (("d", DAY), ("h", HOUR), ("m", MINUTE), ("s", 1)):
        if s >= size:
            out += f"{s // size}{unit}"
            s %= size
    return out or "0s"


def ago(seconds: float) -> str:
    """A wait: 1h05m, 4m07s."""
    s = int(seconds)
    if s >= HOUR:
        return f"{s // HOUR}h{s % HOUR // MINUTE:02d}m"
    return f"{s // MINUTE}m{s % MINUTE:02d}s"
