"""NVML readings + kubelet assignments + PID owners -> what the agent exports (pure).

One record per GPU, a ``gpusteward.core.dcgm.ExportedGpu``, so the builder of dcgm-exporter's
families prints it. Rules:

* A GPU held by exactly one pod carries that pod's ``pod``/``namespace``/``container``, as
  dcgm-exporter does. A GPU shared by several pods (time-slicing or MPS replicas, ``uuid::N``)
  carries none on its device series, because one label cannot name several pods; instead each
  pod gets a per-pod utilization record: the summed SM utilization of its processes on that GPU
  (0 for a pod holding a replica with no process running; none, so unknown, for a pod with an
  MPS client NVML has no sample of). A process's pod is the one the API
  server names for its UID, else the one its HOSTNAME names.
* A GPU NVML could not read carries ``error``; a lost GPU (``gpu_is_lost``) reports XID 79, the
  XID the driver logs when a GPU falls off the bus, so the extender's health rules see it as is.
  A readable GPU reports the XID of its last XID event while the agent holds it (``xidevents``).
* A reading NVML does not support (say power on some boards) is left out, never printed as 0:
  ``missing`` names the families to skip, the way dcgm-exporter skips blank values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpusteward.core.dcgm import ENGINE_ACTIVE, GPU_UTIL, MIB, XID_GPU_LOST, MigInstance
from gpusteward.core.nodereadings import (
    DeviceAssignment,
    GpuSample,
    NvmlSnapshot,
    PidOwner,
    PodRef,
    Problem,
)

__all__ = ["AgentGpu", "AgentView", "PodUtil", "collect", "shared", "unavailable_view"]

GPU_IS_LOST = "gpu_is_lost"


@dataclass(frozen=True)
class PodUtil:
    """One pod's share of a shared GPU, in percent of the GPU's SM time."""

    pod: PodRef | None
    pod_uid: str
    util_percent: float


@dataclass(frozen=True)
class AgentGpu:
    """An ``ExportedGpu`` (what dcgm-exporter prints) with NVML's identity and our extras."""

    node: str
    index: int
    model_name: str
    uuid: str
    pci_bus_id: str
    util_percent: float = 0.0
    memory_mib: int = 0
    fb_used_mib: int = 0
    temp_c: int = 0
    power_w: float = 0.0
    xid: int = 0
    xid_count: int = 0  # always 0: the agent exports no DCGM_EXP_XID_ERRORS_COUNT
    xid_total: int = 0  # always 0: nor DCGM_EXP_XID_ERRORS_TOTAL
    row_remap_failure: bool = False  # never printed: the agent exports no health families
    health: tuple[tuple[str, int, str], ...] = ()
    pod: PodRef | None = None
    mig: MigInstance | None = None  # always None: the agent reads whole GPUs (docs/agent.md)
    error: str | None = None
    missing: frozenset[str] = frozenset()
    pod_utils: tuple[PodUtil, ...] = ()
    vgpu: str = ""  # always "": a shared GPU's pods get gpusteward_pod_gpu_util instead


@dataclass(frozen=True)
class AgentView:
    node: str
    driver_version: str
    gpus: tuple[AgentGpu, ...] = ()
    problems: tuple[Problem, ...] = ()
    nvml_error: str | None = None


def unavailable_view(node: str, reason: str) -> AgentView:
    """What to serve when NVML itself cannot be used (``--on-missing-driver serve-error``)."""
    return AgentView(node=node, driver_version="", nvml_error=reason)


def collect(
    snapshot: NvmlSnapshot,
    node: str,
    held: Iterable[DeviceAssignment] = (),
    owners: Mapping[int, PidOwner] | None = None,
    problems: Iterable[Problem] = (),
) -> AgentView:
    by_uuid: dict[str, list[DeviceAssignment]] = {}
    for assignment in held:
        by_uuid.setdefault(assignment.uuid, []).append(assignment)
    gpus = tuple(
        _gpu(sample, node, by_uuid.get(sample.uuid, []), owners or {})
        for sample in snapshot.gpus
    )
    return AgentView(
        node=node,
        driver_version=snapshot.driver_version,
        gpus=gpus,
        problems=tuple(sorted({*snapshot.problems, *problems})),
    )


def _gpu(
    sample: GpuSample, node: str, held: list[DeviceAssignment], owners: Mapping[int, PidOwner]
) -> AgentGpu:
    identity = AgentGpu(node=node, index=sample.index, model_name=sample.name,
                        uuid=sample.uuid, pci_bus_id=sample.pci_bus_id)
    if sample.error is not None:
        xid = XID_GPU_LOST if sample.error == GPU_IS_LOST else 0
        return replace(identity, error=sample.error, xid=xid)
    pods = _distinct_pods(held)
    is_shared = bool(shared(held))
    return replace(
        identity,
        util_percent=sample.util_percent or 0.0,
        memory_mib=(sample.memory_total_bytes or 0) // MIB,
        fb_used_mib=(sample.memory_used_bytes or 0) // MIB,
        temp_c=sample.temp_c or 0,
        power_w=(sample.power_mw or 0) / 1000.0,
        xid=sample.xid,
        pod=pods[0] if len(pods) == 1 else None,
        missing=_missing(sample),
        pod_utils=pod_utils(sample, pods, owners) if is_shared else (),
    )


def _distinct_pods(held: list[DeviceAssignment]) -> list[PodRef]:
    seen: dict[tuple[str, str], PodRef] = {}
    for assignment in held:
        seen.setdefault((assignment.pod.namespace, assignment.pod.name), assignment.pod)
    return list(seen.values())


def _missing(sample: GpuSample) -> frozenset[str]:
    missing: set[str] = set()
    if sample.util_percent is None:
        missing |= {GPU_UTIL, ENGINE_ACTIVE}
    if sample.temp_c is None:
        missing.add("DCGM_FI_DEV_GPU_TEMP")
    if sample.power_mw is None:
        missing.add("DCGM_FI_DEV_POWER_USAGE")
    return frozenset(missing)


def shared(held: Iterable[DeviceAssignment]) -> set[str]:
    """UUIDs of the GPUs several pods (or time-sliced / MPS replicas) share."""
    pods: dict[str, set[tuple[str, str]]] = {}
    replicas: set[str] = set()
    for a in held:
        pods.setdefault(a.uuid, set()).add((a.pod.namespace, a.pod.name))
        if a.replica is not None:
            replicas.add(a.uuid)
    return replicas | {uuid for uuid, names in pods.items() if len(names) > 1}


def _pod_of(owner: PidOwner, pods: list[PodRef]) -> PodRef | None:
    """The GPU's pod this process belongs to: by the API server's name, else by hostname."""
    if owner.pod is not None:
        return next((p for p in pods if (p.namespace, p.name) == owner.pod), None)
    return next((p for p in pods if p.name == owner.hostname), None)


def pod_utils(
    sample: GpuSample, pods: list[PodRef], owners: Mapping[int, PidOwner]
) -> tuple[PodUtil, ...]:
    """Per-pod utilization on a shared GPU; processes outside any pod are not attributed.

    A pod with a process whose utilization is not known (an MPS client without a sample of its
    own, adapters/nvml.py) gets no record at all: its load is unknown, never 0, since the rest
    of its processes' sum would understate it."""
    by_uid: dict[str, float] = {}
    owner_of: dict[str, PidOwner] = {}
    unread: set[str] = set()
    for process in sample.processes:
        owner = owners.get(process.pid)
        if owner is None:
            continue
        owner_of.setdefault(owner.pod_uid, owner)
        if process.sm_percent is None:
            unread.add(owner.pod_uid)
            continue
        by_uid[owner.pod_uid] = by_uid.get(owner.pod_uid, 0.0) + process.sm_percent
    running = [
        PodUtil(pod=_pod_of(owner_of[uid], pods), pod_uid=uid, util_percent=min(util, 100.0))
        for uid, util in sorted(by_uid.items()) if uid not in unread
    ]
    named = {u.pod for u in running} | {_pod_of(owner_of[uid], pods) for uid in unread}
    quiet = [PodUtil(pod=pod, pod_uid="", util_percent=0.0) for pod in pods if pod not in named]
    return tuple(running + quiet)
