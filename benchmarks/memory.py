"""This process's memory, from /proc/self/status.

Not getrusage's ru_maxrss: Linux keeps that high-water mark across fork and exec, so a fresh
process started by a benchmark that holds a large fixture reports the benchmark's peak, not its
own (a refresh measured at 1.9 GB where its own peak was under 200 MB). VmHWM belongs to the
process's own address space, which exec replaces.
"""

from __future__ import annotations

from pathlib import Path


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_rss_mb() -> float:
    return _status_mb("VmHWM")


def rss_mb() -> float:
    return _status_mb("VmRSS")
