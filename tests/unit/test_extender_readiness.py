"""/readyz: unready until every watch has its first list, then ready; /healthz alive throughout;
unready again while draining after SIGTERM, when every answer also closes its connection.

The kubelet counts a probe answer in [200, 400) as success and anything else as failure
(Kubernetes docs, "Configure Liveness, Readiness and Startup Probes", HTTP probes), so an
extender that has not yet listed nodes and pods answers 503 and gets no scheduler traffic
through its Service, while its liveness probe keeps passing.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpusteward.core.fleet import FleetStore
from gpusteward.core.policy import parse_policy
from gpusteward.extender.app import Extender, create_app, create_metrics_app
from gpusteward.extender.serve import drain
from gpusteward.extender.view import PlacementView
from tests.factories import NOW

UNREADY = "waiting for the first list of nodes and pods"


class HeldWatch:
    """A watch whose first list arrives when the test says so (adapters.kube.Watcher sets
    ``synced`` once its first list is in the store, and keeps watching)."""

    def __init__(self) -> None:
        self.synced = asyncio.Event()
        self.listed = asyncio.Event()

    async def run(self) -> None:
        await self.listed.wait()
        self.synced.set()
        await asyncio.Event().wait()  # keeps watching until cancelled


def extender(*watches: HeldWatch) -> Extender:
    return Extender(PlacementView(parse_policy({}), FleetStore(), clock=lambda: NOW),
                    telemetry=None, watches=watches)


async def probe(client: TestClient, path: str) -> tuple[int, str]:
    resp = await client.get(path)
    return resp.status, await resp.text()


async def wait_ready(client: TestClient) -> tuple[int, str]:
    for _ in range(200):
        status, text = await probe(client, "/readyz")
        if status == 200:
            return status, text
        await asyncio.sleep(0.01)
    return status, text


async def test_unready_until_the_first_list_then_ready():
    nodes, pods = HeldWatch(), HeldWatch()
    async with TestClient(TestServer(create_app(extender(nodes, pods)))) as client:
        assert await probe(client, "/readyz") == (503, UNREADY)
        assert await probe(client, "/healthz") == (200, "ok")  # alive, only not ready

        nodes.listed.set()  # one watch listed, the other not yet: still unready
        await asyncio.wait_for(nodes.synced.wait(), 5)
        assert await probe(client, "/readyz") == (503, UNREADY)

        pods.listed.set()
        assert await wait_ready(client) == (200, "ok")


@pytest.mark.parametrize("listed", [False, True], ids=["unready", "ready"])
async def test_the_metrics_port_answers_the_same_probe(listed):
    watch = HeldWatch()
    if listed:
        watch.synced.set()
    async with TestClient(TestServer(create_metrics_app(extender(watch)))) as client:
        assert await probe(client, "/readyz") == ((200, "ok") if listed else (503, UNREADY))


async def test_draining_turns_unready_and_closes_each_connection_after_its_answer():
    """Kubernetes marks a terminating pod's endpoint not ready and kube-proxy stops sending it
    new connections; until then the replica keeps answering, but with ``Connection: close``
    so the scheduler's next call opens a connection the Service routes elsewhere."""
    watch = HeldWatch()
    watch.synced.set()
    ext = extender(watch)
    body = b'{"Pod":{"metadata":{"name":"p","namespace":"n","uid":""}},"NodeNames":[]}'
    async with TestClient(TestServer(create_app(ext))) as client:
        before = await client.post("/filter", data=body)
        assert before.status == 200 and before.headers.get("Connection", "").lower() != "close"
        hurry = asyncio.Event()
        draining = asyncio.create_task(drain(ext, 30, hurry))
        await asyncio.sleep(0)
        assert await probe(client, "/readyz") == (503, "shutting down")
        during = await client.post("/filter", data=body)
        assert during.status == 200 and during.headers["Connection"].lower() == "close"
        assert not draining.done()  # still answering within the delay
        hurry.set()  # a second signal ends the drain at once
        await asyncio.wait_for(draining, 5)


async def test_the_metrics_port_turns_unready_while_draining():
    watch = HeldWatch()
    watch.synced.set()
    ext = extender(watch)
    ext.draining = True
    async with TestClient(TestServer(create_metrics_app(ext))) as client:
        assert await probe(client, "/readyz") == (503, "shutting down")
