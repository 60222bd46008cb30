"""Plain data passed between the agent's adapters and its pure collect step."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpusteward.core.dcgm import PodRef

__all__ = [
    "DeviceAssignment",
    "GpuSample",
    "NvmlSnapshot",
    "PidOwner",
    "PodRef",
    "Problem",
    "ProcessUtil",
]


class Problem(StrEnum):
    """A degraded part of one collection (the ``problem`` label of gpusteward_agent_problem)."""

    LIBRARY_MISMATCH = "library_mismatch"  # pynvml cannot read the driver's process lists
    XID_EVENTS_UNSUPPORTED = "xid_events_unsupported"  # a GPU's XIDs go unseen
    POD_RESOURCES_UNAVAILABLE = "pod_resources_unavailable"  # no kubelet socket: no pod labels
    POD_NAMES_FROM_HOSTNAME = "pod_names_from_hostname"  # shared-GPU pods named by a guess


@dataclass(frozen=True)
class ProcessUtil:
    """One process on one GPU: host PID, SM utilization in percent (None: not known), and
    whether it is an MPS client (NVML's MPSCompute process mode)."""

    pid: int
    sm_percent: float | None = None
    used_memory_bytes: int | None = None
    mps_client: bool = False


@dataclass(frozen=True)
class GpuSample:
    """What NVML said about one GPU in one read. ``error`` set means the readings are absent."""

    index: int
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    util_percent: float | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    temp_c: int | None = None
    power_mw: int | None = None
    processes: tuple[ProcessUtil, ...] = ()
    xid: int = 0  # the last XID event, within the agent's hold time
    error: str | None = None


@dataclass(frozen=True)
class NvmlSnapshot:
    """One read of every GPU on the node; ``problems`` name degraded parts (snake_case)."""

    driver_version: str
    gpus: tuple[GpuSample, ...]
    problems: tuple[Problem, ...] = ()


@dataclass(frozen=True)
class DeviceAssignment:
    """A device the kubelet allocated to a container: GPU UUID and, if time-sliced, the replica."""

    uuid: str
    pod: PodRef
    replica: str | None = None


@dataclass(frozen=True)
class PidOwner:
    """The pod a host process belongs to: its cgroup names the UID, the API server (when the
    agent may ask) the pod's (namespace, name), its environment the hostname (a fallback)."""

    pod_uid: str
    hostname: str | None = None
    pod: tuple[str, str] | None = None
