"""The extender's transport over loopback: TLS with client certificates, slow and many connections.

kube-scheduler reaches an HTTPS extender with the Extender's ``tlsConfig`` (``certFile``,
``keyFile``, ``caFile``; k8s.io/kube-scheduler/config/v1 ``ExtenderTLSConfig``, see
/work/shared/reference/extender-protocol-and-telemetry.md §2.1): it presents a client
certificate and checks ours against the CA. The certificates here are made with ``openssl``,
and the app is the real one behind the real listener (``serve.listen``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gpusteward.core.fleet import FleetStore
from gpusteward.core.policy import parse_policy
from gpusteward.extender.app import Extender, create_app
from gpusteward.extender.serve import (
    CertificateReloader,
    Listener,
    Transport,
    listen,
    server_tls,
)
from gpusteward.extender.view import PlacementView
from tests.factories import H100, node

BODY = {"Pod": {"metadata": {"name": "t", "namespace": "ml", "uid": "u"},
                "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}},
        "Nodes": None, "NodeNames": ["h1"]}


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)


def make_cert(d: Path, name: str, ca: str, san: str | None = None) -> None:
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", f"{name}.crt", cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    make_ca(d, "ca")  # signs the extender's certificate and the scheduler's client certificate
    make_ca(d, "other-ca")
    make_cert(d, "extender", "ca", san="IP:127.0.0.1")
    make_cert(d, "scheduler", "ca")
    make_cert(d, "intruder", "other-ca")
    return d


async def start(port: int, tls: ssl.SSLContext | None,
                transport: Transport | None = None) -> tuple[Listener, web.AppRunner, Extender]:
    fleet = FleetStore()
    fleet.replace_all([node("h1", H100)], [])
    extender = Extender(PlacementView(parse_policy({}), fleet), telemetry=None)
    await extender.refresh()
    runner = web.AppRunner(create_app(extender), access_log=None)
    await runner.setup()
    listener = await listen(runner, extender, "127.0.0.1", port, tls, transport or Transport())
    return listener, runner, extender


def client_tls(certs: Path, who: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    if who:
        context.load_cert_chain(str(certs / f"{who}.crt"), str(certs / f"{who}.key"))
    return context


async def filter_status(url: str, context: ssl.SSLContext | None) -> int:
    async with aiohttp.ClientSession() as s, s.post(url, data=json.dumps(BODY),
                                                    ssl=context or False) as r:
        await r.read()
        return r.status


async def test_only_clients_with_a_certificate_from_the_ca_are_served(certs, unused_tcp_port):
    tls = server_tls(str(certs / "extender.crt"), str(certs / "extender.key"),
                     str(certs / "ca.crt"))
    listener, runner, _ = await start(unused_tcp_port, tls)
    url = f"https://127.0.0.1:{unused_tcp_port}/filter"
    try:
        assert await filter_status(url, client_tls(certs, "scheduler")) == 200
        for who in (None, "intruder"):
            with pytest.raises(aiohttp.ClientError):
                await filter_status(url, client_tls(certs, who))
        with pytest.raises(aiohttp.ClientError):  # plain HTTP on the TLS port
            await filter_status(f"http://127.0.0.1:{unused_tcp_port}/filter", None)
        assert await filter_status(url, client_tls(certs, "scheduler")) == 200
    finally:
        await listener.close()
        await runner.cleanup()


def test_tls_flags_are_checked_together(certs):
    with pytest.raises(ValueError, match="go together"):
        server_tls(str(certs / "extender.crt"), None, None)
    with pytest.raises(FileNotFoundError):
        server_tls(str(certs / "missing.crt"), str(certs / "extender.key"), None)
    assert server_tls(None, None, None) is None


async def test_slow_connections_are_closed_and_the_server_keeps_answering(unused_tcp_port):
    # Issue 13, item 9: connections sending a request a byte at a time stayed open for an hour.
    listener, runner, extender = await start(
        unused_tcp_port, None, Transport(max_connections=20, request_timeout=2.0))
    url = f"http://127.0.0.1:{unused_tcp_port}/filter"
    try:
        slow = []
        for _ in range(10):
            reader, writer = await asyncio.open_connection("127.0.0.1", unused_tcp_port)
            writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Len")  # never finished
            await writer.drain()
            slow.append((reader, writer))
        closed = 0
        for reader, _ in slow:  # each is closed by the server within the timeout and a sweep
            assert await asyncio.wait_for(reader.read(), timeout=30) == b""
            closed += 1
        assert closed == 10
        assert await filter_status(url, None) == 200
        count = extender.metrics.registry.get_sample_value(
            "gpusteward_extender_connections_closed_total", {"reason": "request_timeout"})
        assert count == 10
        for _, writer in slow:
            writer.close()
    finally:
        await listener.close()
        await runner.cleanup()


async def test_a_silent_socket_on_the_tls_port_is_closed_after_the_first_byte_deadline(
        certs, unused_tcp_port):
    # A TLS client's first byte is its handshake: one never started is a silent socket.
    tls = server_tls(str(certs / "extender.crt"), str(certs / "extender.key"), None)
    listener, runner, _ = await start(unused_tcp_port, tls, Transport(first_byte_timeout=1.0))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", unused_tcp_port)
        opened = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""
        assert asyncio.get_running_loop().time() - opened < 5
        writer.close()
        url = f"https://127.0.0.1:{unused_tcp_port}/filter"
        assert await filter_status(url, client_tls(certs, None)) == 200
    finally:
        await listener.close()
        await runner.cleanup()


async def peer_subject(port: int, certs: Path) -> str:
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=client_tls(certs, "scheduler"))
    subject = dict(x[0] for x in writer.get_extra_info("peercert")["subject"])["commonName"]
    writer.close()
    return subject


async def test_a_rotated_certificate_is_served_to_new_connections(certs, tmp_path,
                                                                   unused_tcp_port):
    for f in ("extender.crt", "extender.key"):
        (tmp_path / f).write_bytes((certs / f).read_bytes())
    cert, key = str(tmp_path / "extender.crt"), str(tmp_path / "extender.key")
    tls = server_tls(cert, key, str(certs / "ca.crt"))
    reloader = CertificateReloader(tls, cert, key)
    listener, runner, _ = await start(unused_tcp_port, tls)
    try:
        assert await peer_subject(unused_tcp_port, certs) == "extender"
        assert reloader.check() is False  # nothing changed
        (tmp_path / "extender.crt").write_text("half written")
        assert reloader.check() is False  # the old pair stays
        assert await peer_subject(unused_tcp_port, certs) == "extender"
        make_cert(certs, "rotated", "ca", san="IP:127.0.0.1")
        (tmp_path / "extender.crt").write_bytes((certs / "rotated.crt").read_bytes())
        (tmp_path / "extender.key").write_bytes((certs / "rotated.key").read_bytes())
        assert reloader.check() is True
        assert await peer_subject(unused_tcp_port, certs) == "rotated"
    finally:
        await listener.close()
        await runner.cleanup()


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
], ids=["request-line", "content-length", "chunk-size"])
async def test_requests_aiohttp_cannot_parse_are_counted_without_a_traceback(
        raw, unused_tcp_port, caplog):
    listener, runner, extender = await start(unused_tcp_port, None)
    try:
        with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
            reader, writer = await asyncio.open_connection("127.0.0.1", unused_tcp_port)
            writer.write(raw)
            reply = await asyncio.wait_for(reader.read(), timeout=10)
            writer.close()
        assert reply.startswith(b"HTTP/1.0 400 Bad Request")
        assert extender.metrics.registry.get_sample_value(
            "gpusteward_extender_requests_total", {"verb": "other", "code": "400"}) == 1
        assert [r for r in caplog.records if r.exc_info] == []
        assert any("unreadable HTTP request (400)" in r.getMessage() for r in caplog.records)
        assert await filter_status(f"http://127.0.0.1:{unused_tcp_port}/filter", None) == 200
    finally:
        await listener.close()
        await runner.cleanup()
