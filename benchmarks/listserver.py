"""LISTs served as the API server pages them, without the API server's own cost.

A benchmark that wants gpusteward's side of a read alone (decoding, joining, deciding) serves
the objects from here, in another process: ``?limit=N&continue=TOKEN`` pages with
``metadata.continue`` on every page but the last and the list's ``resourceVersion``, as
kube-apiserver answers a paginated LIST (API Concepts, "Retrieving large results sets in
chunks"). Any other collection path is an empty list, as a LIST of a kind with no objects is.

    with ListServer({"/api/v1/pods": [...]}) as api:
        api.kubeconfig(tmp)  # a kubeconfig for it, plain HTTP on loopback
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from pathlib import Path
from typing import Any

import msgspec

from gpusteward.sandbox.procs import free_port

RESOURCE_VERSION = "4242"


def _page(items: list[bytes], start: int, limit: int) -> bytes:
    chunk = items[start:start + limit]
    meta = {"resourceVersion": RESOURCE_VERSION}
    if start + limit < len(items):
        meta["continue"] = str(start + limit)
    return (b'{"kind":"List","apiVersion":"v1","metadata":' + msgspec.json.encode(meta)
            + b',"items":[' + b",".join(chunk) + b"]}")


def _serve(port: int, lists: dict[str, list[Any]], ready: Any) -> None:
    from aiohttp import web

    encoded = {path: [msgspec.json.encode(o) for o in items] for path, items in lists.items()}

    async def listed(request: web.Request) -> web.Response:
        items = encoded.get(request.path, [])
        limit = int(request.query.get("limit") or len(items) or 1)
        start = int(request.query.get("continue") or 0)
        return web.Response(body=_page(items, start, limit), content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/{path:.*}", listed)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


class ListServer:
    def __init__(self, lists: dict[str, list[Any]]):
        self.lists = lists
        self.port = free_port()
        self._proc: multiprocessing.Process | None = None

    def __enter__(self) -> ListServer:
        ready = multiprocessing.Event()
        self._proc = multiprocessing.Process(target=_serve, args=(self.port, self.lists, ready),
                                             daemon=True)
        self._proc.start()
        if not ready.wait(120):
            raise RuntimeError("the list server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, directory: Path) -> Path:
        path = directory / "listserver.kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "bench", "cluster": {"server": self.url}}],
            "users": [{"name": "bench", "user": {}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}]}))
        return path
