"""The Events the reclaimer writes (adapters.events), as the API server receives them: one body
for a pod's and a workload's, whole-second ``Z`` timestamps (metav1.Time's own form), the
involved object's apiVersion and uid for ``kubectl describe``."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from gpusteward.adapters.events import EventWriter, ObjectEvents
from tests.support.loopback import served

AT = 1_780_000_000.75  # 2026-05-28T20:26:40.75Z


@pytest.fixture
async def apiserver():
    """Records each Event created; every object read has uid ``u-1``."""
    created: list[dict[str, Any]] = []

    async def create(request: web.Request) -> web.Response:
        created.append(await request.json())
        return web.json_response(created[-1], status=201)

    async def read(request: web.Request) -> web.Response:
        return web.json_response({"metadata": {"name": request.match_info["name"],
                                               "uid": "u-1"}})

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{ns}/events", create)
    app.router.add_get("/{tail:.*}/{name}", read)
    async with served(app) as url:
        api = client.ApiClient(client.Configuration(host=url))
        yield api, created
        await api.close()


async def test_an_event_on_a_pod_carries_the_whole_second_and_the_pod_reference(apiserver):
    api, created = apiserver
    writer = EventWriter(api)
    writer.instance = "replica-1"
    pod = {"kind": "Pod", "namespace": "ml", "name": "nb-0", "apiVersion": "v1", "uid": "p-1"}
    await writer.write(pod, "GPUIdle", "m" * 1200, True, AT)
    assert created == [{
        "metadata": {"generateName": "nb-0.", "namespace": "ml"}, "involvedObject": pod,
        "reason": "GPUIdle", "message": "m" * 1000, "type": "Warning",
        "source": {"component": "gpusteward-reclaimer"},
        "reportingComponent": "gpusteward-reclaimer", "reportingInstance": "replica-1",
        "firstTimestamp": "2026-05-28T20:26:40Z", "lastTimestamp": "2026-05-28T20:26:40Z",
        "count": 1}]


@pytest.mark.parametrize(("workload", "api_version"), [
    pytest.param("ml/Deployment/web", "apps/v1", id="a Deployment is apps/v1"),
    pytest.param("ml/Job/train", "batch/v1", id="a Job is batch/v1"),
])
async def test_an_event_on_a_workload_names_its_api_version_and_uid(apiserver, workload,
                                                                   api_version):
    api, created = apiserver
    await ObjectEvents(api, clock=lambda: AT).emit(workload, "GPURestored", "back")
    _, kind, name = workload.split("/")
    assert created[0]["involvedObject"] == {"kind": kind, "namespace": "ml", "name": name,
                                            "apiVersion": api_version, "uid": "u-1"}
    assert (created[0]["type"], created[0]["firstTimestamp"]) == ("Normal",
                                                                  "2026-05-28T20:26:40Z")
