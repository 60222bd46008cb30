"""XIDs from NVML's event API: the one way NVML tells about them.

A thread blocks in ``nvmlEventSetWait_v2`` (half-second timeouts, so it stops promptly) on an
event set every GPU is registered with for ``nvmlEventTypeXidCriticalError``; each event's
``eventData`` is the XID. The reader asks ``xid(uuid)`` per GPU per collection.

dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` keeps the last XID until the exporter restarts (a
common complaint: NVIDIA/dcgm-exporter#500, NVIDIA/DCGM#277); here an XID reads for ``hold``
seconds after its last event and then drops back to 0, like dcgm-exporter's own
``DCGM_EXP_XID_ERRORS_COUNT`` window (5 minutes by default). gpusteward's health rules keep a
GPU unhealthy for ``health.xidWindow`` after the last sample that shows the XID.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml

from gpusteward.adapters.nvmlcall import NotSupported, NvmlError, call
from gpusteward.core.nodereadings import Problem

log = logging.getLogger("gpusteward.agent.xid")

XID_EVENT = pynvml.nvmlEventTypeXidCriticalError
WAIT_MS = 500
__all__ = ["XidEvents"]


class XidEvents:
    """The last XID per GPU UUID, from a background thread; start after nvmlInit."""

    def __init__(self, hold: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold = hold
        self.clock = clock
        self._set: Any = None
        self._registered: set[str] = set()
        self._unsupported: set[str] = set()
        self._last: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            self._set = call(pynvml.nvmlEventSetCreate)
        except NvmlError as e:  # e.g. NotSupported in some virtualised setups
            log.warning("no XID events on this node: %s", e)
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-xid-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Before nvmlShutdown: the thread must be out of NVML first."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * WAIT_MS / 1000)
            self._thread = None
        if self._set is not None:
            try:
                call(pynvml.nvmlEventSetFree, self._set)
            except NvmlError as e:
                log.debug("freeing the event set: %s", e)
            self._set = None
        self._registered.clear()

    def register(self, handle: Any, uuid: str, problems: set[Problem]) -> None:
        """Registers a GPU the first time it is read (so GPUs that appear later are covered).

        NVML errors other than "not supported" propagate: the caller reports the GPU as
        unreadable, the way it does for any other read."""
        if uuid in self._registered:
            return
        if self._set is None or uuid in self._unsupported:
            problems.add(Problem.XID_EVENTS_UNSUPPORTED)
            return
        try:
            if not call(pynvml.nvmlDeviceGetSupportedEventTypes, handle) & XID_EVENT:
                raise NotSupported("XID events not among the GPU's event types", "not_supported")
            call(pynvml.nvmlDeviceRegisterEvents, handle, XID_EVENT, self._set)
        except NotSupported as e:
            log.warning("%s: no XID events: %s", uuid, e)
            self._unsupported.add(uuid)
            problems.add(Problem.XID_EVENTS_UNSUPPORTED)
            return
        self._registered.add(uuid)

    def xid(self, uuid: str) -> int:
        """The GPU's last XID if its last event is at most ``hold`` seconds old, else 0."""
        with self._lock:
            last = self._last.get(uuid)
        if last is None or self.clock() - last[1] > self.hold:
            return 0
        return last[0]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(self._set, WAIT_MS)
                if not data.eventType & XID_EVENT:
                    continue
                uuid = pynvml.nvmlDeviceGetUUID(data.device)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as e:  # a GPU lost under the event: the reader reports it
                log.warning("waiting for XID events: %s", e)
                self._stop.wait(1.0)
                continue
            self._record(uuid, int(data.eventData))

    def _record(self, uuid: str, xid: int) -> None:
        now = self.clock()
        with self._lock:
            last = self._last.get(uuid)
            self._last[uuid] = (xid, now)
        # A storm of one XID is one warning; a new XID, or one after a quiet hold, is another.
        repeated = last is not None and last[0] == xid and now - last[1] <= self.hold
        log.log(logging.DEBUG if repeated else logging.WARNING, "XID %d on GPU %s", xid, uuid,
                extra={"uuid": uuid, "xid": xid})
