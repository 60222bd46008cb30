"""The extender's connections over loopback sockets: clients that hang up, stay silent, trickle
their headers, or crowd the connection cap (issue 25, item 4).

The real aiohttp app behind the real listener (``serve.listen``, the connection guard), with
deadlines of a second or two so each case takes seconds; production's are in serve.Transport.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from gpusteward.core.fleet import FleetStore
from gpusteward.core.policy import parse_policy
from gpusteward.extender.app import _BUDGET, Extender, create_app
from gpusteward.extender.serve import Listener, Transport, listen
from gpusteward.extender.view import PlacementView
from tests.factories import H100, node

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]

POD = {"metadata": {"name": "train", "namespace": "ml", "uid": "u1"},
       "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
BODIES = {"filter": {"Pod": POD, "NodeNames": ["h1"]},
          "prioritize": {"Pod": POD, "NodeNames": ["h1"]},
          "preempt": {"Pod": POD, "NodeNameToMetaVictims": {
              "h1": {"Pods": [{"UID": "uid-ml-other"}], "NumPDBViolations": 0}}}}
REASONS = ("first_byte_timeout", "header_timeout", "request_timeout", "idle_evicted",
           "connection_cap")


def request_bytes(verb: str = "filter") -> bytes:
    body = json.dumps(BODIES[verb]).encode()
    return (f"POST /{verb} HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class Served:
    def __init__(self, port: int, app: web.Application, extender: Extender, listener: Listener):
        self.port, self.app, self.extender, self.listener = port, app, extender, listener
        self.connections: list[Connection] = []

    async def connect(self) -> Connection:
        connection = await asyncio.open_connection("127.0.0.1", self.port)
        self.connections.append(connection)
        return connection

    def sample(self, name: str, **labels: str) -> float:
        return self.extender.metrics.registry.get_sample_value(name, labels) or 0.0

    def closed(self, reason: str) -> float:
        return self.sample("gpusteward_extender_connections_closed_total", reason=reason)


@asynccontextmanager
async def serving(port: int, transport: Transport) -> AsyncIterator[Served]:
    fleet = FleetStore()
    fleet.replace_all([node("h1", H100)], [])
    extender = Extender(PlacementView(parse_policy({}), fleet), telemetry=None)
    await extender.refresh()
    app = create_app(extender)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    served = Served(port, app, extender, await listen(runner, extender, "127.0.0.1", port, None,
                                                      transport))
    try:
        yield served
    finally:
        for _, writer in served.connections:
            writer.close()
        await served.listener.close()
        await runner.cleanup()


async def answer(connection: Connection, verb: str = "filter") -> bytes:
    """One request on a kept-alive connection, and its status line."""
    reader, writer = connection
    writer.write(request_bytes(verb))
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), timeout=10)
    length = 0
    while (line := await asyncio.wait_for(reader.readline(), timeout=10)) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    await asyncio.wait_for(reader.readexactly(length), timeout=10)
    return status.strip()


async def until(what: str, check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def closed_by_server(reader: asyncio.StreamReader, timeout: float = 15.0) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), timeout=timeout) == b""
    except ConnectionResetError:  # an aborted connection resets
        return True


@pytest.mark.parametrize("hang_up", ["close", "abort"], ids=["FIN", "RST"])
@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt"])
async def test_a_client_that_hangs_up_mid_body_is_a_499_at_debug_not_an_error(
        verb, hang_up, unused_tcp_port, caplog):
    caplog.set_level(logging.DEBUG)
    async with serving(unused_tcp_port, Transport()) as served:
        _, writer = await served.connect()
        writer.write(request_bytes(verb)[:-10])  # the headers and most of the body
        await writer.drain()
        budget = served.app[_BUDGET]
        await until("the handler to wait for the body", lambda: budget.used > 0)
        getattr(writer.transport, hang_up)()
        requests = "gpusteward_extender_requests_total"
        await until("the request to be counted", lambda: served.sample(
            requests, verb=verb, code="499") == 1)
        assert served.sample(requests, verb=verb, code="500") == 0
        assert await answer(await served.connect(), verb) == b"HTTP/1.1 200 OK"
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
    assert [r.levelname for r in caplog.records if "(499)" in r.getMessage()] == ["DEBUG"]


SLOW = {  # sent at once, then trickled a byte every 0.2 s; the deadline that closes it
    "silent": (b"", b"", "first_byte_timeout", 1.0),
    "headers a byte at a time": (b"POST /filter HTTP/1.1\r\n", b"X-Slow: " + b"a" * 100,
                                 "header_timeout", 2.0),
    "body a byte at a time": (b"POST /filter HTTP/1.1\r\nHost: extender\r\n"
                              b"Content-Length: 1000\r\n\r\n", b" " * 100,
                              "request_timeout", 4.0),
}


@pytest.mark.parametrize("sent,trickled,reason,after", SLOW.values(), ids=SLOW.keys())
async def test_a_slow_connection_is_closed_by_the_deadline_it_misses(
        sent, trickled, reason, after, unused_tcp_port):
    transport = Transport(first_byte_timeout=1.0, header_timeout=2.0, request_timeout=4.0)
    async with serving(unused_tcp_port, transport) as served:
        reader, writer = await served.connect()
        opened = time.monotonic()
        writer.write(sent)
        trickle = asyncio.create_task(trickling(writer, trickled))
        try:
            assert await closed_by_server(reader)
        finally:
            trickle.cancel()
        waited = time.monotonic() - opened
        assert after - 0.1 <= waited < after + 3, waited
        assert {r: served.closed(r) for r in REASONS} == {r: float(r == reason) for r in REASONS}


async def trickling(writer: asyncio.StreamWriter, data: bytes) -> None:
    for i in range(len(data)):
        writer.write(data[i:i + 1])
        await asyncio.sleep(0.2)


async def test_an_idle_keep_alive_connection_outlives_the_first_byte_and_header_deadlines(
        unused_tcp_port):
    transport = Transport(first_byte_timeout=1.0, header_timeout=1.0, request_timeout=2.0)
    async with serving(unused_tcp_port, transport) as served:
        kept = await served.connect()
        assert await answer(kept) == b"HTTP/1.1 200 OK"
        await asyncio.sleep(3.5)  # past every deadline, as kube-scheduler's between two pods
        assert await answer(kept) == b"HTTP/1.1 200 OK"
        assert sum(served.closed(r) for r in REASONS) == 0


async def test_at_the_cap_a_new_connection_is_served_and_the_silent_ones_make_room(
        unused_tcp_port):
    # Deadlines far off: only the cap decides here.
    transport = Transport(max_connections=8, first_byte_timeout=60.0, header_timeout=60.0,
                          request_timeout=60.0)
    async with serving(unused_tcp_port, transport) as served:
        scheduler = await served.connect()  # a kept-alive connection that has been answered
        assert await answer(scheduler) == b"HTTP/1.1 200 OK"
        silent = [await served.connect() for _ in range(7)]  # the cap is full
        await until("all eight connections to be open",
                    lambda: len(served.listener.guard.open) == 8)
        for _ in range(3):  # new connections, one after another
            assert await answer(await served.connect()) == b"HTTP/1.1 200 OK"
        assert served.closed("idle_evicted") == 3
        assert served.closed("connection_cap") == 0
        # the oldest silent ones went first; the answered connection was kept
        assert [await closed_by_server(reader, timeout=2) for reader, _ in silent[:3]] == [
            True] * 3
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(silent[3][0].read(), timeout=0.2)
        assert await answer(scheduler) == b"HTTP/1.1 200 OK"


async def test_at_the_cap_a_new_connection_is_refused_while_every_one_is_inside_a_request(
        unused_tcp_port):
    transport = Transport(max_connections=4, first_byte_timeout=60.0, header_timeout=60.0,
                          request_timeout=60.0)
    async with serving(unused_tcp_port, transport) as served:
        guard = served.listener.guard
        held = [await served.connect() for _ in range(4)]
        for _, writer in held:
            writer.write(b"POST /filter HTTP/1.1\r\nHost: extender\r\n")  # never finished
        await until("all four connections to be inside a request", lambda: len(guard.open) == 4
                    and all(c.started is not None for c in guard.open))
        reader, _ = await served.connect()
        assert await closed_by_server(reader, timeout=5)  # closed at once, not queued
        assert served.closed("connection_cap") == 1
        assert served.closed("idle_evicted") == 0
        for _, writer in held:
            writer.close()
        await until("the held connections to go", lambda: not guard.open)
        assert await answer(await served.connect()) == b"HTTP/1.1 200 OK"
