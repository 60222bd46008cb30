"""Secured Prometheus: a real Prometheus served with ``--web.config.file`` (TLS with a CA made
here, basic auth with a bcrypt hash, as prometheus/exporter-toolkit's web configuration
documents), and, in front of it, a gateway that wants a bearer token and a tenant header.

Prometheus's web configuration has no bearer-token auth; Thanos and Mimir deployments put a
gateway (or an auth proxy) in front that checks ``Authorization: Bearer`` and, for Mimir,
``X-Scope-OrgID`` (Mimir's tenant header). The gateway below is that, on loopback: it answers
401 like such a gateway does and forwards good requests to the real Prometheus.

The clients are the extender and the reclaimer's evidence reader; the report builds the same
PrometheusSource from the same PrometheusConnection.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gpusteward.adapters.errors import TelemetryUnavailable
from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.promconnection import PrometheusConnection
from gpusteward.adapters.snapshot import SnapshotReader
from gpusteward.adapters.telemetry import PrometheusSource
from gpusteward.core.policy import parse_policy
from gpusteward.extender.app import Extender
from gpusteward.extender.view import PlacementView
from gpusteward.sandbox.controllers import PROMETHEUS_MAJORS
from tests.component.test_extender_telemetry import fleet, history
from tests.factories import pod
from tests.support.loopback import served
from tests.support.prometheus import PrometheusServer, WebConfig
from tests.support.tls import Pki, make_pki

USER, PASSWORD = "gpusteward", "correct horse"
TENANT = "team-a"
POLICY = parse_policy({})
# With telemetry, two of the five nodes read stale (see test_extender_telemetry.py); without
# it, all five are neutral.
STALE_WITH_TELEMETRY, STALE_WITHOUT = 2, 5


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module", params=PROMETHEUS_MAJORS,
                ids=[f"prometheus-{m}" for m in PROMETHEUS_MAJORS])
def secured(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            pki: Pki) -> Iterator[PrometheusServer]:
    """On each major, as every test here (tests/component/conftest.py); module-scoped, so one
    server a major."""
    server = PrometheusServer(tmp_path_factory.mktemp("secured-prometheus"),
                              history_openmetrics=history(time.time()),
                              web=WebConfig(tls=pki, users={USER: PASSWORD}),
                              major=request.param)
    with server:
        yield server


def password_file(tmp_path: Path, password: str = PASSWORD) -> Path:
    path = tmp_path / "password"
    path.write_text(password + "\n")
    return path


async def extender_with(connection: PrometheusConnection) -> Extender:
    source = PrometheusSource.at(connection, POLICY.telemetry, POLICY.health, attempts=1)
    extender = Extender(PlacementView(POLICY, fleet()), source)
    await extender.refresh()
    return extender


async def fetch_error(connection: PrometheusConnection) -> str:
    source = PrometheusSource.at(connection, POLICY.telemetry, POLICY.health, attempts=1)
    with pytest.raises(TelemetryUnavailable) as caught:
        await source.fetch()
    return str(caught.value)


async def test_tls_is_verified_by_default_and_a_failure_leaves_scores_neutral(
        secured: PrometheusServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    connection = PrometheusConnection(secured.url, basic_auth_user=USER,
                                      basic_auth_password_file=password_file(tmp_path))
    with caplog.at_level(logging.WARNING):
        extender = await extender_with(connection)

    assert extender.view.stale_nodes() == STALE_WITHOUT
    assert extender.metrics.refresh_errors._value.get() == 1
    assert (f"prometheus at {secured.url}: TLS verification failed (unable to get local issuer "
            "certificate); give the CA that signed its certificate with --prometheus-ca-file"
            ) in caplog.text


@pytest.mark.parametrize(("with_ca", "ok"), [pytest.param(False, False, id="no-ca-no-action"),
                                              pytest.param(True, True, id="ca")])
async def test_the_reclaimers_evidence_halts_unless_tls_verifies(
        secured: PrometheusServer, pki: Pki, tmp_path: Path, with_ca: bool, ok: bool) -> None:
    connection = PrometheusConnection(secured.url, ca_file=pki.ca_cert if with_ca else None,
                                      basic_auth_user=USER,
                                      basic_auth_password_file=password_file(tmp_path))
    source = PrometheusClient(connection, POLICY.telemetry, attempts=1)
    busy = pod("busy0", node="h-hot", bound_at=time.time() - 3600)
    _, telemetry_ok, problem = await SnapshotReader(None, source, POLICY).evidence(
        (busy,), time.time())
    # A cycle whose telemetry is not ok halts: nothing is marked, warned or reclaimed.
    assert telemetry_ok is ok
    assert ("TLS verification failed" in problem) is not ok


async def test_the_ca_file_and_basic_auth_get_telemetry(
        secured: PrometheusServer, pki: Pki, tmp_path: Path) -> None:
    extender = await extender_with(PrometheusConnection(
        secured.url, ca_file=pki.ca_cert, basic_auth_user=USER,
        basic_auth_password_file=password_file(tmp_path)))

    assert extender.view.stale_nodes() == STALE_WITH_TELEMETRY
    assert extender.metrics.refresh_errors._value.get() == 0
    utils = sorted(r.util for r in extender.view.telemetry.for_node("h-hot"))
    assert utils == [0.0] * 4 + [0.9] * 4


async def test_insecure_skip_verify_reaches_it_only_when_asked(
        secured: PrometheusServer, tmp_path: Path) -> None:
    extender = await extender_with(PrometheusConnection(
        secured.url, insecure_skip_verify=True, basic_auth_user=USER,
        basic_auth_password_file=password_file(tmp_path)))
    assert extender.view.stale_nodes() == STALE_WITH_TELEMETRY


@pytest.mark.parametrize("password", [pytest.param("wrong", id="wrong-password"),
                                      pytest.param(None, id="no-credentials")])
async def test_refused_credentials_are_a_clear_error(
        secured: PrometheusServer, pki: Pki, tmp_path: Path, password: str | None) -> None:
    auth = dict(basic_auth_user=USER, basic_auth_password_file=password_file(tmp_path, password)
                ) if password else {}
    error = await fetch_error(PrometheusConnection(secured.url, ca_file=pki.ca_cert, **auth))
    assert error.startswith(f"prometheus at {secured.url} refused our credentials: "
                            "HTTP Status Code 401")
    assert error.endswith("check the bearer token or basic auth settings")
    assert PASSWORD not in error and "wrong" not in error


class Gateway:
    """A Mimir/Thanos-style gateway: wants ``Authorization: Bearer <accepted>`` and the tenant
    header, forwards to the secured Prometheus with its own CA and basic auth."""

    def __init__(self, upstream: PrometheusServer, pki: Pki):
        self.upstream, self.pki = upstream, pki
        self.accepted = ""
        self.seen: list[tuple[str, str]] = []  # (Authorization, X-Scope-OrgID) per request
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        tenant = request.headers.get("X-Scope-OrgID", "")
        self.seen.append((auth, tenant))
        if auth != f"Bearer {self.accepted}":
            return web.Response(status=401, text="invalid bearer token\n")
        if tenant != TENANT:
            return web.Response(status=401, text="no org id\n")  # Mimir's answer
        ca = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        assert self.upstream.web is not None
        async with aiohttp.ClientSession(headers=self.upstream.web.auth_header()) as session, \
                session.get(f"{self.upstream.url}{request.path_qs}", ssl=ca) as upstream:
            return web.Response(status=upstream.status, body=await upstream.read(),
                                content_type="application/json")


@pytest.fixture
async def gateway(secured: PrometheusServer, pki: Pki) -> AsyncIterator[Gateway]:
    gw = Gateway(secured, pki)
    app = web.Application()
    app.router.add_get("/api/v1/{tail:.*}", gw.handle)
    async with served(app) as gw.url:
        yield gw


async def test_the_bearer_token_and_tenant_header_reach_the_gateway_and_rotation_is_followed(
        gateway: Gateway, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("token-one\n")
    gateway.accepted = "token-one"
    source = PrometheusSource.at(
        PrometheusConnection(gateway.url, bearer_token_file=token,
                             headers=(("X-Scope-OrgID", TENANT),)),
        POLICY.telemetry, POLICY.health, attempts=1)

    first = await source.fetch()
    assert len(first.nodes["h-cool"]) == 8
    assert set(gateway.seen) == {("Bearer token-one", TENANT)}

    # The gateway moves on to the next token before the file does: refused, said clearly.
    # (One query: a refused fetch leaves its other queries' threads finishing in the back.)
    gateway.accepted = "token-two"
    with pytest.raises(TelemetryUnavailable, match="refused our credentials: HTTP Status "
                                                   "Code 401"):
        await source.client.query("vector(1)")

    # kubelet writes the rotated projected token into place with a rename.
    (tmp_path / "token.tmp").write_text("token-two\n")
    os.replace(tmp_path / "token.tmp", token)
    gateway.seen.clear()
    again = await source.fetch()
    assert len(again.nodes["h-cool"]) == 8
    assert set(gateway.seen) == {("Bearer token-two", TENANT)}


async def test_without_the_tenant_header_the_gateway_refuses(
        gateway: Gateway, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("token-one")
    gateway.accepted = "token-one"
    error = await fetch_error(PrometheusConnection(gateway.url, bearer_token_file=token))
    assert "refused our credentials: HTTP Status Code 401 (b'no org id\\n')" in error
