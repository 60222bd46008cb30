"""Connection limits aiohttp's server lacks: a cap on open connections and a deadline per request.

aiohttp times out idle keep-alive connections but not a client that sends its headers or body
a byte at a time; 2,000 such connections stayed open for an hour (issue 13, item 9). Each
connection here must have sent its whole request and been answered within ``request_timeout``
of the request's first byte, or it is closed. The guard wraps the protocol factory, so the
application and aiohttp's parser are untouched; it only watches bytes in and out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, cast

log = logging.getLogger("gpusteward.extender")


class ConnectionGuard:
    def __init__(self, factory: Callable[[], asyncio.Protocol], *, max_connections: int,
                 request_timeout: float, on_close: Callable[[str], None] = lambda reason: None,
                 clock: Callable[[], float] = time.monotonic):
        self._factory = factory
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self._on_close = on_close
        self._clock = clock
        self.open: set[_Guarded] = set()

    def __call__(self) -> asyncio.Protocol:
        if len(self.open) >= self.max_connections:
            self._on_close("connection_cap")
            return _OverCap()
        return _Guarded(self, self._factory())

    def sweep(self) -> None:
        """Close every connection whose current request is overdue."""
        now = self._clock()
        for conn in [c for c in self.open if c.started is not None
                     and now - c.started > self.request_timeout]:
            log.warning("closing a connection that did not complete a request in %gs",
                        self.request_timeout)
            self._on_close("request_timeout")
            conn.abort()

    async def run(self, every: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every)
            self.sweep()


class _OverCap(asyncio.Protocol):
    """Over the cap: closed at once (the client sees a reset and retries)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Guarded(asyncio.Protocol):
    """Forwards to aiohttp's protocol; times the span from a request's first byte to its answer."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self.started: float | None = None  # first byte of the request not yet answered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._guard.open.add(self)
        self._inner.connection_made(cast(asyncio.Transport, _Answering(transport, self)))

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.open.discard(self)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.started is None:
            self.started = self._guard._clock()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def answered(self) -> None:
        self.started = None

    def abort(self) -> None:
        if self._transport is not None:
            with contextlib.suppress(Exception):
                self._transport.abort()


class _Answering:
    """The transport as aiohttp sees it: a write means the request was answered."""

    def __init__(self, transport: asyncio.Transport, conn: _Guarded):
        self._transport = transport
        self._conn = conn

    def write(self, data: Any) -> None:
        self._conn.answered()
        self._transport.write(data)

    def writelines(self, data: Any) -> None:
        self._conn.answered()
        self._transport.writelines(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
