"""NVML through nvidia-ml-py: every GPU of the node, read in a worker thread.

NVML calls block (a lost GPU can hold one for seconds), so every read runs in a worker thread;
``nvmlcall`` translates pynvml's errors, ``xidevents`` listens for XIDs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pynvml

from gpusteward.adapters.nvmlcall import (
    GpuLost,
    Idle,
    NotSupported,
    NvmlError,
    NvmlLibraryMismatch,
    NvmlUnavailable,
    call,
    optional,
)
from gpusteward.adapters.xidevents import XidEvents
from gpusteward.core.nodereadings import GpuSample, NvmlSnapshot, Problem, ProcessUtil

log = logging.getLogger("gpusteward.agent.nvml")

__all__ = ["GpuLost", "NvmlError", "NvmlLibraryMismatch", "NvmlReader", "NvmlUnavailable"]


class NvmlReader:
    """Reads every GPU on the node; one instance per process (NVML init is process-wide)."""

    def __init__(self, xid_hold: float = 300.0) -> None:
        self.started = False
        self.xids = XidEvents(xid_hold)
        self._uuids: dict[int, str] = {}  # last UUID seen per index, to name a GPU once lost
        self._last_seen_us: dict[int, int] = {}
        self._errors: dict[int, str] = {}  # the last error per index, to log each change once

    async def start(self) -> None:
        """nvmlInit; raises NvmlUnavailable when there is no usable library or driver."""
        await asyncio.to_thread(call, pynvml.nvmlInit)
        await asyncio.to_thread(self.xids.start)
        self.started = True

    async def close(self) -> None:
        if self.started:
            self.started = False
            await asyncio.to_thread(self.xids.stop)
            await asyncio.to_thread(call, pynvml.nvmlShutdown)

    async def read(self) -> NvmlSnapshot:
        return await asyncio.to_thread(self.read_blocking)

    def read_blocking(self) -> NvmlSnapshot:
        driver = call(pynvml.nvmlSystemGetDriverVersion)
        problems: set[Problem] = set()
        gpus = tuple(self._read_gpu(i, problems) for i in range(call(pynvml.nvmlDeviceGetCount)))
        return NvmlSnapshot(driver_version=driver, gpus=gpus, problems=tuple(sorted(problems)))

    def _read_gpu(self, index: int, problems: set[Problem]) -> GpuSample:
        try:
            return self._sample(index, problems)
        except NvmlUnavailable:
            raise
        except NvmlError as e:
            # Once per GPU and error, not every interval: a lost GPU stays lost for a while.
            level = logging.DEBUG if self._errors.get(index) == e.reason else logging.WARNING
            self._errors[index] = e.reason
            log.log(level, "gpu %d unreadable: %s", index, e, extra={"gpu": index})
            return GpuSample(index=index, uuid=self._uuids.get(index, ""), error=e.reason)

    def _sample(self, index: int, problems: set[Problem]) -> GpuSample:
        sample = self._read(index, problems)
        if self._errors.pop(index, None) is not None:
            log.warning("gpu %d readable again", index, extra={"gpu": index})
        return sample

    def _read(self, index: int, problems: set[Problem]) -> GpuSample:
        handle = call(pynvml.nvmlDeviceGetHandleByIndex, index)
        uuid = self._uuids[index] = call(pynvml.nvmlDeviceGetUUID, handle)
        self.xids.register(handle, uuid, problems)
        util = optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
        memory = call(pynvml.nvmlDeviceGetMemoryInfo, handle)
        return GpuSample(
            index=index,
            uuid=uuid,
            name=call(pynvml.nvmlDeviceGetName, handle),
            pci_bus_id=optional(_pci_bus_id, handle) or "",
            util_percent=None if util is None else float(util.gpu),
            memory_total_bytes=int(memory.total),
            memory_used_bytes=int(memory.used),
            temp_c=optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            power_mw=optional(pynvml.nvmlDeviceGetPowerUsage, handle),
            processes=self._processes(index, handle, problems),
            xid=self.xids.xid(uuid),
        )

    def _processes(self, index: int, handle: Any,
                   problems: set[Problem]) -> tuple[ProcessUtil, ...]:
        memory: dict[int, int | None] = {}
        try:
            for p in call(pynvml.nvmlDeviceGetComputeRunningProcesses, handle):
                memory[int(p.pid)] = None if p.usedGpuMemory is None else int(p.usedGpuMemory)
        except NvmlLibraryMismatch as e:
            log.warning("gpu %d: running processes unavailable: %s", index, e)
            problems.add(Problem.LIBRARY_MISMATCH)
        except NotSupported:
            pass
        clients = self._mps_clients(index, handle, problems)
        sm = self._process_utilization(index, handle)
        return tuple(
            ProcessUtil(pid=pid, sm_percent=_sm_percent(pid, sm, memory, clients),
                        used_memory_bytes=memory.get(pid, clients.get(pid)),
                        mps_client=pid in clients)
            for pid in sorted(memory.keys() | sm.keys() | clients.keys())
        )

    def _mps_clients(self, index: int, handle: Any,
                     problems: set[Problem]) -> dict[int, int | None]:
        """The GPU's MPS clients (pid -> memory), which NVML lists apart from its compute
        processes (process mode MPSCompute)."""
        try:
            listed = call(pynvml.nvmlDeviceGetMPSComputeRunningProcesses, handle)
        except NvmlLibraryMismatch as e:  # a driver older than the _v3 process queries
            log.debug("gpu %d: MPS clients unavailable: %s", index, e)
            problems.add(Problem.LIBRARY_MISMATCH)
            return {}
        except NotSupported:
            return {}
        return {int(p.pid): None if p.usedGpuMemory is None else int(p.usedGpuMemory)
                for p in listed}

    def _process_utilization(self, index: int, handle: Any) -> dict[int, float]:
        since = self._last_seen_us.get(index, 0)
        try:
            samples = call(pynvml.nvmlDeviceGetProcessUtilization, handle, since)
        except (Idle, NotSupported):
            return {}
        if samples:
            self._last_seen_us[index] = max(int(s.timeStamp) for s in samples)
        # Several samples per PID can come back; the latest one is the current reading.
        latest = {int(s.pid): s for s in sorted(samples, key=lambda s: int(s.timeStamp))}
        return {pid: float(s.smUtil) for pid, s in latest.items()}


def _sm_percent(pid: int, sm: dict[int, float], memory: dict[int, int | None],
                clients: dict[int, int | None]) -> float | None:
    """A process's SM utilization: its sample; else 0 for a compute process NVML samples on
    its own (none means it did not run); else unknown for an MPS client. A client's kernels run
    in the MPS server's context, and whether NVML samples them under the client's PID is not
    established (docs/agent.md, "MPS"): without a sample of its own it may be busy."""
    if pid in sm:
        return sm[pid]
    if pid in clients:
        return None
    return 0.0 if pid in memory else None


def _pci_bus_id(handle: Any) -> str:
    return pynvml.nvmlDeviceGetPciInfo(handle).busId
