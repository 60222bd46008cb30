"""This process's memory, from /proc/self/status, and any process's CPU time, from its stat.

Not getrusage's ru_maxrss: Linux keeps that high-water mark across fork and exec, so a fresh
process started by a benchmark that holds a large fixture reports the benchmark's peak, not its
own (a refresh measured at 1.9 GB where its own peak was under 200 MB). VmHWM belongs to the
process's own address space, which exec replaces.
"""

from __future__ import annotations

import os
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


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far (proc(5): utime and stime, fields 14
    and 15 of /proc/PID/stat, in clock ticks; the name in field 2 may hold spaces)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
