"""NVML through nvidia-ml-py: the agent's only importer of ``pynvml``.

NVML calls block (a lost GPU can hold one for seconds), so every read runs in a worker thread.
pynvml's errors become our own small tree here (``raise ... from e``):

* ``NvmlUnavailable`` -- no library (``NVMLError_LibraryNotFound``), no kernel driver, or a
  library/kernel-module mismatch: nothing on the node can be read;
* ``GpuLost`` -- ``NVMLError_GpuIsLost`` from one GPU: that GPU is reported with an error and the
  others go on;
* ``NvmlLibraryMismatch`` -- ``NVMLLibraryMismatchError``, which pynvml raises (as a plain
  ``Exception``, not an ``NVMLError``) when an unversioned wrapper finds no such symbol in an older
  driver's library: the function's data is left out and the snapshot names the problem.

``nvmlDeviceGetProcessUtilization`` raises ``NVMLError_NotFound`` when no process ran since the
timestamp asked for; that is an idle GPU, not an error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from gpusteward.adapters.errors import AdapterError
from gpusteward.agent.model import GpuSample, NvmlSnapshot, ProcessUtil

log = logging.getLogger("gpusteward.agent.nvml")
T = TypeVar("T")

__all__ = ["GpuLost", "NvmlError", "NvmlLibraryMismatch", "NvmlReader", "NvmlUnavailable"]


class NvmlError(AdapterError):
    """An NVML call failed; ``reason`` is the snake_case name of the NVML error."""

    def __init__(self, message: str, reason: str = "unknown"):
        super().__init__(message)
        self.reason = reason


class NvmlUnavailable(NvmlError):
    """NVML cannot be used on this node at all (no library, no driver)."""


class GpuLost(NvmlError):
    """One GPU fell off the bus or stopped answering (``NVML_ERROR_GPU_IS_LOST``)."""


class NvmlLibraryMismatch(NvmlError):
    """The installed libnvidia-ml lacks a function this nvidia-ml-py calls."""


class _Idle(NvmlError):
    """NVML_ERROR_NOT_FOUND from a per-process query: no samples since the timestamp."""


class _NotSupported(NvmlError):
    """NVML_ERROR_NOT_SUPPORTED: the GPU (or its mode, e.g. MIG) does not offer this reading."""


_UNAVAILABLE = (
    pynvml.NVMLError_LibraryNotFound,
    pynvml.NVMLError_DriverNotLoaded,
    pynvml.NVMLError_LibRmVersionMismatch,
    pynvml.NVMLError_Uninitialized,
)


def _reason(e: pynvml.NVMLError) -> str:
    name = type(e).__name__.removeprefix("NVMLError_")
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_") or "unknown"


def call(fn: Callable[..., T], *args: Any) -> T:
    """Call one pynvml function, translating its errors into ours."""
    try:
        return fn(*args)
    except pynvml.NVMLLibraryMismatchError as e:
        raise NvmlLibraryMismatch(f"{fn.__name__}: {e}", "library_mismatch") from e
    except pynvml.NVMLError as e:
        message, reason = f"{fn.__name__}: {e}", _reason(e)
        if isinstance(e, _UNAVAILABLE):
            raise NvmlUnavailable(message, reason) from e
        if isinstance(e, pynvml.NVMLError_GpuIsLost):
            raise GpuLost(message, reason) from e
        if isinstance(e, pynvml.NVMLError_NotFound):
            raise _Idle(message, reason) from e
        if isinstance(e, pynvml.NVMLError_NotSupported):
            raise _NotSupported(message, reason) from e
        raise NvmlError(message, reason) from e


def _optional(fn: Callable[..., T], *args: Any) -> T | None:
    try:
        return call(fn, *args)
    except _NotSupported:
        return None


class NvmlReader:
    """Reads every GPU on the node; one instance per process (NVML init is process-wide)."""

    def __init__(self) -> None:
        self.started = False
        self._uuids: dict[int, str] = {}  # last UUID seen per index, to name a GPU once lost
        self._last_seen_us: dict[int, int] = {}

    async def start(self) -> None:
        """nvmlInit; raises NvmlUnavailable when there is no usable library or driver."""
        await asyncio.to_thread(call, pynvml.nvmlInit)
        self.started = True

    async def close(self) -> None:
        if self.started:
            self.started = False
            await asyncio.to_thread(call, pynvml.nvmlShutdown)

    async def read(self) -> NvmlSnapshot:
        return await asyncio.to_thread(self.read_blocking)

    def read_blocking(self) -> NvmlSnapshot:
        driver = call(pynvml.nvmlSystemGetDriverVersion)
        problems: set[str] = set()
        gpus = tuple(self._read_gpu(i, problems) for i in range(call(pynvml.nvmlDeviceGetCount)))
        return NvmlSnapshot(driver_version=driver, gpus=gpus, problems=tuple(sorted(problems)))

    def _read_gpu(self, index: int, problems: set[str]) -> GpuSample:
        try:
            return self._sample(index, problems)
        except NvmlUnavailable:
            raise
        except NvmlError as e:
            log.warning("gpu %d unreadable: %s", index, e, extra={"gpu": index})
            return GpuSample(index=index, uuid=self._uuids.get(index, ""), error=e.reason)

    def _sample(self, index: int, problems: set[str]) -> GpuSample:
        handle = call(pynvml.nvmlDeviceGetHandleByIndex, index)
        uuid = self._uuids[index] = call(pynvml.nvmlDeviceGetUUID, handle)
        util = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
        memory = call(pynvml.nvmlDeviceGetMemoryInfo, handle)
        return GpuSample(
            index=index,
            uuid=uuid,
            name=call(pynvml.nvmlDeviceGetName, handle),
            pci_bus_id=_optional(_pci_bus_id, handle) or "",
            util_percent=None if util is None else float(util.gpu),
            memory_total_bytes=int(memory.total),
            memory_used_bytes=int(memory.used),
            temp_c=_optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            power_mw=_optional(pynvml.nvmlDeviceGetPowerUsage, handle),
            processes=self._processes(index, handle, problems),
        )

    def _processes(self, index: int, handle: Any, problems: set[str]) -> tuple[ProcessUtil, ...]:
        memory: dict[int, int | None] = {}
        try:
            for p in call(pynvml.nvmlDeviceGetComputeRunningProcesses, handle):
                memory[int(p.pid)] = None if p.usedGpuMemory is None else int(p.usedGpuMemory)
        except NvmlLibraryMismatch as e:
            log.warning("gpu %d: running processes unavailable: %s", index, e)
            problems.add("library_mismatch")
        except _NotSupported:
            pass
        sm = self._process_utilization(index, handle)
        return tuple(
            ProcessUtil(pid=pid, sm_percent=sm.get(pid, 0.0 if pid in memory else None),
                        used_memory_bytes=memory.get(pid))
            for pid in sorted(memory.keys() | sm.keys())
        )

    def _process_utilization(self, index: int, handle: Any) -> dict[int, float]:
        since = self._last_seen_us.get(index, 0)
        try:
            samples = call(pynvml.nvmlDeviceGetProcessUtilization, handle, since)
        except (_Idle, _NotSupported):
            return {}
        if samples:
            self._last_seen_us[index] = max(int(s.timeStamp) for s in samples)
        # Several samples per PID can come back; the latest one is the current reading.
        latest = {int(s.pid): s for s in sorted(samples, key=lambda s: int(s.timeStamp))}
        return {pid: float(s.smUtil) for pid, s in latest.items()}


def _pci_bus_id(handle: Any) -> str:
    return pynvml.nvmlDeviceGetPciInfo(handle).busId
