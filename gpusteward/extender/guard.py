"""Connection limits aiohttp's server lacks: a cap on open connections and deadlines per request.

aiohttp closes idle keep-alive connections (after 120 s here), and nothing else: a client that
sends its headers a byte at a time kept 2,000 connections open for an hour (issue 13, item 9),
and 256 sockets that sent nothing held the cap for two minutes while every new connection, the
scheduler's too, was reset (issue 25, item 4). The guard gives each connection the deadlines of
a mature server (Go's ``http.Server`` ``ReadHeaderTimeout``, nginx's ``client_header_timeout``):

- ``first_byte_timeout``: a new connection's first byte within this of its accept;
- ``header_timeout``: a request's headers, up to their blank line, within this of its first byte;
- ``request_timeout``: the whole request received and answered within this of its first byte;
- between two requests, aiohttp's keep-alive timeout (kube-scheduler reuses its connection).

At the cap a new connection makes room by closing the connection longest between requests,
those that never sent a request first (nginx reuses its idle connections the same way,
``ngx_drain_connections``); it is refused only while every connection is inside a request, and
a deadline ends each of those within seconds. The guard wraps the protocol factory, so the
application and aiohttp's parser are untouched; it only watches bytes in and out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

log = logging.getLogger("gpusteward.extender")

# The end of a header block: a line break followed by an empty line (CRLF, or LF alone).
_BLANK_LINE = re.compile(rb"\n\r?\n")


class ConnectionGuard:
    def __init__(self, factory: Callable[[], asyncio.Protocol], *, max_connections: int,
                 request_timeout: float, first_byte_timeout: float, header_timeout: float,
                 on_close: Callable[[str], None] = lambda reason: None,
                 clock: Callable[[], float] = time.monotonic):
        self._factory = factory
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.first_byte_timeout = first_byte_timeout
        self.header_timeout = header_timeout
        self._on_close = on_close
        self._clock = clock
        self.open: set[_Guarded] = set()

    def __call__(self) -> asyncio.Protocol:
        if len(self.open) >= self.max_connections and not self._make_room():
            self._on_close("connection_cap")
            return _OverCap()
        return _Guarded(self, self._factory())

    def _make_room(self) -> bool:
        """Close the connection longest between requests, one that never sent a request first."""
        idle = [c for c in self.open if c.between_requests()]
        if not idle:
            return False
        victim = min(idle, key=lambda c: (c.served, c.idle_since))
        log.debug("at the cap of %d connections: closing one idle for %.1fs to admit a new one",
                  self.max_connections, self._clock() - victim.idle_since)
        self.open.discard(victim)  # its socket closes in the next turn of the loop
        self._on_close("idle_evicted")
        victim.close()
        return True

    def overdue(self, conn: _Guarded, now: float) -> str | None:
        """The deadline this connection has missed, or None."""
        if conn.started is None:
            late = not conn.served and now - conn.idle_since > self.first_byte_timeout
            return "first_byte_timeout" if late else None
        if not conn.headers_done and now - conn.started > self.header_timeout:
            return "header_timeout"
        return "request_timeout" if now - conn.started > self.request_timeout else None

    def sweep(self) -> None:
        """Close every connection past a deadline; one log line says how many and why."""
        now = self._clock()
        missed = Counter[str]()
        for conn in list(self.open):
            reason = self.overdue(conn, now)
            if reason is not None:
                missed[reason] += 1
                self._on_close(reason)
                conn.abort()
        if missed:
            log.warning("closed %d connections past a deadline (%s): first byte %gs, headers "
                        "%gs, request %gs", missed.total(),
                        ", ".join(f"{n} {why}" for why, n in sorted(missed.items())),
                        self.first_byte_timeout, self.header_timeout, self.request_timeout)

    async def run(self, every: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every)
            self.sweep()


class _OverCap(asyncio.Protocol):
    """Over the cap: closed at once (the client sees a reset and retries)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Guarded(asyncio.Protocol):
    """Forwards to aiohttp's protocol; times each request from its first byte to its headers'
    end and to its answer, and the wait for a new connection's first byte."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self.started: float | None = None  # first byte of the request not yet answered
        self.headers_done = False  # that request's blank line has arrived
        self._tail = b""  # the request's last bytes while its headers are incomplete
        self.served = False  # a request was answered on this connection
        self.idle_since = guard._clock()  # accepted, or the last answer

    def between_requests(self) -> bool:
        """Waiting for a request, the last answer written out: closing it loses nothing."""
        transport = self._transport
        return (self.started is None and transport is not None and not transport.is_closing()
                and transport.get_write_buffer_size() == 0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self.idle_since = self._guard._clock()  # after the TLS handshake, if any
        self._guard.open.add(self)
        self._inner.connection_made(cast(asyncio.Transport, _Answering(transport, self)))

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.open.discard(self)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.started is None:
            self.started, self.headers_done, self._tail = self._guard._clock(), False, b""
        if not self.headers_done:
            seen = self._tail + data
            self.headers_done = _BLANK_LINE.search(seen) is not None
            self._tail = seen[-2:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def answered(self) -> None:
        self.started, self.served, self.idle_since = None, True, self._guard._clock()

    def close(self) -> None:
        """Close between requests: a FIN, which the client's pool notices before reusing it."""
        if self._transport is not None:
            self._transport.close()

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
