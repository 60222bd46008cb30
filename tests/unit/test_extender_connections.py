"""The extender's connections over loopback sockets: clients that hang up mid-request (issue 25,
item 4). The real aiohttp app behind the real listener (``serve.listen``, the connection guard).
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


