"""pytest fixtures for tests that need a real Prometheus or a DCGM endpoint.

Import the fixtures into a test module (or list this module in a root
``conftest.py``'s ``pytest_plugins``)::

    from tests.support.fixtures import dcgm_endpoint, prometheus_factory  # noqa: F401
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpusteward.sandbox.simgpu import SimGpu, render_exposition
from tests.support.prometheus import PrometheusServer

__all__ = ["DcgmEndpoint", "dcgm_endpoint", "module_prometheus_factory", "prometheus_factory",
           "prometheus_major"]

PrometheusFactory = Callable[..., PrometheusServer]


@pytest.fixture(scope="module")
def prometheus_major() -> str | None:
    """The Prometheus major ``prometheus_factory`` starts: None, the default
    ($GPUSTEWARD_PROMETHEUS, else 3). tests/component/conftest.py runs each of its tests on
    every major instead (module-scoped, so a module's servers may be too)."""
    return None


@pytest.fixture
def prometheus_factory(tmp_path: Path, prometheus_major: str | None
                       ) -> Iterator[PrometheusFactory]:
    """Start Prometheus servers (of ``prometheus_major``) under ``tmp_path``; all are stopped at
    teardown."""
    yield from _servers(tmp_path, prometheus_major)


@pytest.fixture(scope="module")
def module_prometheus_factory(tmp_path_factory: pytest.TempPathFactory,
                              prometheus_major: str | None) -> Iterator[PrometheusFactory]:
    """``prometheus_factory`` for a module's servers that its tests only read: one backfill
    for them all."""
    yield from _servers(tmp_path_factory.mktemp("prometheus"), prometheus_major)


def _servers(workdir: Path, major: str | None) -> Iterator[PrometheusFactory]:
    servers: list[PrometheusServer] = []

    def start(
        *,
        history_openmetrics: str | None = None,
        scrape_targets: Sequence[str] = (),
        scrape_interval: str = "1s",
        scrape_configs: Sequence[dict[str, Any]] = (),
    ) -> PrometheusServer:
        server = PrometheusServer(
            workdir / f"prometheus-{len(servers)}",
            history_openmetrics=history_openmetrics,
            scrape_targets=scrape_targets,
            scrape_interval=scrape_interval,
            scrape_configs=scrape_configs,
            major=major,
        )
        servers.append(server)  # before start(), so a half-started one is still stopped
        server.start()
        return server

    yield start
    for server in reversed(servers):
        server.stop()


class DcgmEndpoint:
    """``/metrics`` serving dcgm-exporter text for ``gpus``; a test may replace them any time."""

    def __init__(self, gpus: Sequence[SimGpu] = ()) -> None:
        self.gpus: Sequence[SimGpu] = gpus
        # What a scrape returns for the GPUs; a fault test may serve a broken exporter's text.
        self.render: Callable[[Sequence[SimGpu]], str] = render_exposition
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = endpoint.render(endpoint.gpus).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # base-class name
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def target(self) -> str:
        """``host:port`` as a Prometheus scrape target."""
        return f"127.0.0.1:{self._server.server_port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@pytest.fixture
def dcgm_endpoint() -> Iterator[DcgmEndpoint]:
    """A live dcgm-exporter stand-in on a loopback port; no GPUs until a test sets them."""
    endpoint = DcgmEndpoint()
    yield endpoint
    endpoint.close()
