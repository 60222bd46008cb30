"""Host PID -> pod, through ``/proc``.

NVML reports host PIDs (the driver knows no PID namespaces), so the agent needs the host's PID
namespace (``hostPID: true``). A container's cgroup path names its pod UID: cgroup v1
``/kubepods/burstable/pod<uid>/<container>``, cgroup v2 with the systemd driver
``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/...``.
The API server joins a UID to its pod's name (``poddirectory``); the process's ``HOSTNAME``
(the pod name unless the pod sets ``spec.hostname``) is the fallback when the agent may not
ask. ``proc_root`` is configurable for tests.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from gpusteward.core.nodereadings import PidOwner

__all__ = ["hostname_from_environ", "pod_uid_from_cgroup", "read_owners"]

_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in a ``/proc/<pid>/cgroup`` file, dashed; None for a process outside a pod."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" in path and (match := _POD_UID.search(path)):
            return match.group(1).replace("_", "-")
    return None


def hostname_from_environ(raw: bytes) -> str | None:
    """``HOSTNAME`` from a NUL-separated ``/proc/<pid>/environ``."""
    for entry in raw.split(b"\0"):
        if entry.startswith(b"HOSTNAME="):
            return entry.removeprefix(b"HOSTNAME=").decode(errors="replace") or None
    return None


def read_owner(pid: int, proc_root: Path) -> PidOwner | None:
    """The pod of one host PID; None when it is gone, unreadable or not in a pod."""
    base = proc_root / str(pid)
    try:
        uid = pod_uid_from_cgroup((base / "cgroup").read_text())
    except OSError:
        return None
    if uid is None:
        return None
    try:
        hostname = hostname_from_environ((base / "environ").read_bytes())
    except OSError:
        hostname = None
    return PidOwner(pod_uid=uid, hostname=hostname)


def read_owners(pids: Iterable[int], proc_root: Path = Path("/proc")) -> dict[int, PidOwner]:
    """Blocking: call through asyncio.to_thread."""
    owners = {pid: read_owner(pid, proc_root) for pid in set(pids)}
    return {pid: owner for pid, owner in owners.items() if owner is not None}
