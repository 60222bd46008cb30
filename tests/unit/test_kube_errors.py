"""The API server's refusals become gpusteward's own error tree in one place (issue 28): the
SDK's ApiException inside ``adapters.kube.kube_errors``, a status read raw through the same
``adapters.errors.kube_error``; the class says the status, the reason and the server's message
are kept, the SDK's error is the cause. No module outside the adapters imports the SDK's
exceptions."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpusteward.adapters.errors import (
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeNotFound,
    KubeRefused,
    KubeTooManyRequests,
    KubeUnprocessable,
    LeaseLost,
    WatchExpired,
    kube_error,
)
from gpusteward.adapters.kube import kube_errors, list_raw
from gpusteward.adapters.stopper import Switches
from tests.support.loopback import served

PACKAGE = Path(__file__).resolve().parents[2] / "gpusteward"
SDK_ERRORS = ("kubernetes_asyncio.client.exceptions", "kubernetes_asyncio.client.rest")


@pytest.mark.parametrize(("status", "cls"), [
    pytest.param(403, KubeForbidden, id="403-rbac"),
    pytest.param(404, KubeNotFound, id="404-gone"),
    pytest.param(409, KubeConflict, id="409-changed-since-read"),
    pytest.param(410, WatchExpired, id="410-too-old"),
    pytest.param(429, KubeTooManyRequests, id="429-pdb-says-not-now"),
    pytest.param(422, KubeUnprocessable, id="422-a-json-patch-test-failed"),
    pytest.param(500, KubeRefused, id="500-not-acted-on"),
])
def test_each_status_gpusteward_acts_on_has_its_class(status: int, cls: type[KubeRefused]):
    error = kube_error(status, "why")
    assert type(error) is cls
    assert isinstance(error, KubeError)
    assert (error.status, error.reason, str(error)) == (
        status, "why", f"the API server answered HTTP {status} why")


def test_the_sdks_refusal_keeps_its_status_reason_and_message_and_is_the_cause():
    sdk = ApiException(status=409, reason="Conflict")
    sdk.body = json.dumps({"kind": "Status", "code": 409, "message": "the object has been "
                           "modified; please apply your changes to the latest version"})
    with pytest.raises(KubeConflict) as raised, kube_errors():
        raise sdk
    error = raised.value
    assert (error.status, error.reason, str(error)) == (
        409, "Conflict", "the API server answered HTTP 409 Conflict")
    assert error.detail.startswith("the object has been modified")
    assert error.__cause__ is sdk


def test_an_sdk_refusal_without_a_readable_body_has_no_detail():
    with pytest.raises(KubeForbidden) as raised, kube_errors():
        raise ApiException(status=403, reason="Forbidden")
    assert raised.value.detail == ""


@pytest.mark.parametrize("own", [
    pytest.param(LeaseLost("not leading"), id="lease-lost"),
    pytest.param(KubeNotFound("already mapped", 404), id="already-mapped"),
    pytest.param(ValueError("a bug"), id="not-an-api-error"),
])
def test_errors_that_are_not_the_sdks_pass_as_they_are(own: Exception):
    with pytest.raises(type(own)) as raised, kube_errors():
        raise own
    assert raised.value is own


def status(code: int, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "code": code, "message": message},
                             status=code)


@pytest.fixture
async def apiserver():
    """Answers every path with the Status its first segment after /apis/ names (403, 404,
    409), as the API server's own refusals look."""

    async def answer(request: web.Request) -> web.Response:
        code = int(request.match_info["code"])
        return status(code, f"refused with {code}")

    async def no_pod(request: web.Request) -> web.Response:
        return status(404, f'pods "{request.match_info["name"]}" not found')

    app = web.Application()
    app.router.add_route("*", "/apis/{code}/{tail:.*}", answer)
    app.router.add_get("/api/v1/namespaces/ml/pods/{name}", no_pod)
    async with served(app) as url:
        api = client.ApiClient(client.Configuration(host=url))
        yield api
        await api.close()


async def test_a_typed_call_refused_raises_the_class_with_the_servers_message(apiserver):
    with pytest.raises(KubeNotFound) as raised, kube_errors():
        await client.CoreV1Api(apiserver).read_namespaced_pod("gone", "ml")
    assert (raised.value.reason, raised.value.detail) == ("Not Found", 'pods "gone" not found')
    assert isinstance(raised.value.__cause__, ApiException)


@pytest.mark.parametrize(("code", "cls"), [
    pytest.param(403, KubeForbidden, id="forbidden"),
    pytest.param(404, KubeNotFound, id="not-found"),
])
async def test_a_raw_list_refused_raises_the_class_naming_the_path(apiserver, code, cls):
    with pytest.raises(cls) as raised:
        await list_raw(apiserver, f"/apis/{code}/v1/things")
    assert str(raised.value) == f"list /apis/{code}/v1/things: HTTP {code}: refused with {code}"
    assert (raised.value.status, raised.value.detail) == (code, f"refused with {code}")


async def test_a_raw_write_refused_raises_the_class_with_the_servers_message_as_reason(
        apiserver):
    with pytest.raises(KubeConflict) as raised:
        await Switches(apiserver).patch("/apis/409/v1/namespaces/ml/things/a", {})
    assert (raised.value.status, raised.value.reason) == (409, "refused with 409")


async def test_a_group_not_served_is_none_not_an_error(apiserver):
    assert await Switches(apiserver).served("404") is None


def sdk_error_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [n for n in names if n.startswith(SDK_ERRORS)]
    return found


def test_no_module_outside_the_adapters_imports_the_sdks_exceptions():
    # import-linter's forbidden contracts take top-level external packages only
    outside = {str(p.relative_to(PACKAGE)): sdk_error_imports(p)
               for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "adapters"}
    assert {p: names for p, names in outside.items() if names} == {}
