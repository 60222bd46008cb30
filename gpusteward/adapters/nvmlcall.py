"""One pynvml call with its errors translated into our own small tree (``raise ... from e``).

* ``NvmlUnavailable`` -- no library (``NVMLError_LibraryNotFound``), no kernel driver, or a
  library/kernel-module mismatch: nothing on the node can be read;
* ``GpuLost`` -- ``NVMLError_GpuIsLost`` from one GPU: that GPU is reported with an error and the
  others go on;
* ``NvmlLibraryMismatch`` -- ``NVMLLibraryMismatchError``, which pynvml raises (as a plain
  ``Exception``, not an ``NVMLError``) when an unversioned wrapper finds no such symbol in an older
  driver's library: the function's data is left out and the snapshot names the problem;
* ``Idle`` -- ``NVMLError_NotFound`` from a per-process query: no process ran since the
  timestamp asked for; an idle GPU, not an error;
* ``NotSupported`` -- the GPU (or its mode, e.g. MIG) does not offer the reading.

With ``nvml`` and ``xidevents``, the agent's only importers of ``pynvml``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from gpusteward.adapters.errors import AdapterError

T = TypeVar("T")

__all__ = ["GpuLost", "Idle", "NotSupported", "NvmlError", "NvmlLibraryMismatch",
           "NvmlUnavailable", "call", "optional"]


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


class Idle(NvmlError):
    """NVML_ERROR_NOT_FOUND from a per-process query: no samples since the timestamp."""


class NotSupported(NvmlError):
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
            raise Idle(message, reason) from e
        if isinstance(e, pynvml.NVMLError_NotSupported):
            raise NotSupported(message, reason) from e
        raise NvmlError(message, reason) from e


def optional(fn: Callable[..., T], *args: Any) -> T | None:
    try:
        return call(fn, *args)
    except NotSupported:
        return None
