"""An HTTP proxy on loopback in front of the sandbox's API server, for one client: it forwards
every request as it is, and can hold one back or slow some down, as a stalled network or a
slow API server does. A write held here has left its client — every check the client makes
before sending has passed — and reaches the API server only when released, as a request sent
just before its process was paused. What the server answered is recorded per request.

Only the client whose kubeconfig names the proxy goes through it; the sandbox's own components
and the other replicas talk to the API server directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from tests.support.loopback import served

Match = Callable[[str, str], bool]  # (method, path) -> whether it applies
# Hop-by-hop and recomputed headers: aiohttp sets its own (RFC 9110 section 7.6.1).
_DROP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive",
         "content-encoding"}


@dataclass
class Answer:
    method: str
    path: str
    status: int
    after_release: bool  # forwarded once the hold was released


@dataclass
class ApiProxy:
    upstream: str
    url: str = ""
    answers: list[Answer] = field(default_factory=list)
    caught: tuple[str, str] | None = None  # the request held back
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    _release: asyncio.Event = field(default_factory=asyncio.Event)
    _hold: Match | None = None
    _slow: list[tuple[Match, float]] = field(default_factory=list)

    def hold(self, match: Match) -> None:
        """Hold back the first request that matches until ``release``."""
        self._hold, self.caught = match, None
        self.reached.clear()
        self._release.clear()

    def release(self) -> None:
        self._release.set()

    def slow(self, match: Match, seconds: float) -> None:
        """Answer every matching request ``seconds`` late."""
        self._slow.append((match, seconds))

    def written_after_release(self, part: str) -> list[int]:
        """What the API server answered to each write forwarded since the release whose path
        holds ``part``."""
        return [a.status for a in self.answers
                if a.after_release and a.method != "GET" and part in a.path]

    def kubeconfig(self, token: str, path: Path) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "proxied",
            "clusters": [{"name": "proxied", "cluster": {"server": self.url}}],
            "users": [{"name": "admin", "user": {"token": token}}],
            "contexts": [{"name": "proxied",
                          "context": {"cluster": "proxied", "user": "admin"}}]}))
        return path

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        method, path = request.method, request.path_qs
        body = await request.read()
        held = self._hold is not None and self.caught is None and self._hold(method, path)
        if held:
            self.caught = (method, path)
            self.reached.set()
            await self._release.wait()
        for match, seconds in self._slow:
            if match(method, path):
                await asyncio.sleep(seconds)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        async with self._session.request(method, self.upstream + path, headers=headers,
                                         data=body, ssl=False) as resp:
            data = await resp.read()
            self.answers.append(Answer(method, path, resp.status, self._release.is_set()))
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _DROP}
            return web.Response(status=resp.status, body=data, headers=out)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[ApiProxy]:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        try:
            async with served(app) as self.url:
                try:
                    yield self
                finally:
                    self.release()
        finally:
            await self._session.close()


def writes_to(path_part: str, method: str | None = None) -> Match:
    """A write (any method but GET) whose path holds ``path_part``."""
    return lambda m, p: m != "GET" and path_part in p and (method is None or m == method)


def lease_reads(m: str, p: str) -> bool:
    return m == "GET" and "/leases/" in p
