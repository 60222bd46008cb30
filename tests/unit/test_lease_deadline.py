"""The Lease's local write deadline and the client gate that applies it to every write request
(adapters.lease ``may_write``, adapters.kube ``GatedClient``): no write leaves this process once
``renew_deadline - margin`` has passed since the last successful renewal started, checked
immediately before the request, while reads and the Lease's own renewals go through."""

from __future__ import annotations

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from gpusteward.adapters.errors import LeaseLost
from gpusteward.adapters.kube import GatedClient
from gpusteward.adapters.lease import LeaseGuard
from tests.support.loopback import served

LEASE = "https://api/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpusteward"
POD = "https://api/api/v1/namespaces/ml/pods/nb-0"


class Monotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def leading(duration: int = 15) -> tuple[LeaseGuard, Monotonic]:
    mono = Monotonic()
    guard = LeaseGuard(client.ApiClient(), "kube-system", "gpusteward", "me", duration,
                       monotonic=mono)
    guard.leading, guard._renewed = True, mono.now
    return guard, mono


async def test_the_write_deadline_is_the_renew_deadline_less_the_margin():
    guard, _ = leading(15)
    assert guard.write_deadline == pytest.approx(7.5 - 3.75)


async def test_a_write_passes_right_after_a_renewal():
    guard, mono = leading()
    mono.now += guard.write_deadline - 0.01
    guard.may_write(POD)


async def test_a_write_is_refused_once_the_deadline_has_passed_since_the_last_renewal():
    guard, mono = leading()
    mono.now += guard.write_deadline + 0.01
    with pytest.raises(LeaseLost, match="past the 3.75s write deadline"):
        guard.may_write(POD)


async def test_the_leases_own_renewal_passes_past_the_deadline():
    guard, mono = leading()
    mono.now += 60
    guard.may_write(LEASE)


async def test_a_replica_that_does_not_lead_writes_nothing():
    guard, _ = leading()
    guard.leading = False
    with pytest.raises(LeaseLost, match="not leading"):
        guard.may_write(POD)


@pytest.fixture
async def apiserver():
    seen: list[str] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.method)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success",
                                  "metadata": {}})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    async with served(app) as url:
        api = GatedClient(configuration=client.Configuration(host=url))
        yield api, seen
        await api.close()


def refuse(url: str) -> None:
    raise LeaseLost(f"refused {url}")


async def test_the_gate_stops_a_write_before_it_leaves_and_lets_reads_through(apiserver):
    api, seen = apiserver
    api.gate = refuse
    core = client.CoreV1Api(api)
    with pytest.raises(LeaseLost, match="/api/v1/namespaces/ml/pods/nb-0"):
        await core.patch_namespaced_pod("nb-0", "ml", {"metadata": {"annotations": {"a": "b"}}})
    with pytest.raises(LeaseLost):
        await core.delete_namespaced_pod("nb-0", "ml")
    assert seen == []
    await api.call_api("/api/v1/namespaces/ml/pods/nb-0", "GET", _preload_content=False)
    assert seen == ["GET"]


async def test_without_a_gate_every_write_goes_through(apiserver):
    api, seen = apiserver
    await client.CoreV1Api(api).delete_namespaced_pod("nb-0", "ml")
    assert seen == ["DELETE"]
