"""A loopback TCP proxy in front of several extender replicas, choosing a replica per connection
the way kube-proxy does for a Service:

* ``ClientIP`` (the Service's ``sessionAffinity: ClientIP``): a client's connections all go to
  the replica its first one went to, until it has opened none for ``timeoutSeconds`` (kube-proxy
  iptables mode: ``-m recent --rcheck --seconds <timeout> --reap`` then ``--set``, so each new
  connection renews the timer). Only replicas whose ``/readyz`` answers 200 are offered (probed
  every quarter second): the Service's endpoints, which lose a pod when its readiness fails or
  it starts terminating. A replica that refuses the connection (gone, not listening) is skipped
  too. Either way the client is bound to the next one, as kube-proxy does once the endpoint
  has left its rules.
* ``None``: round robin over the replicas per connection (kube-proxy picks at random; the
  rotation makes the sandbox repeatable).

A replica's connection that ends ends the client's connection too, as a reset through kube-proxy
would; the client reconnects and lands on a live replica.

    python -m gpusteward.sandbox.affinity --listen 127.0.0.1:PORT \
        --backend 127.0.0.1:P0 --backend 127.0.0.1:P1 [--affinity None|ClientIP] [--timeout S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Collection

from gpusteward.adapters.addresses import parse_hostport

CLIENT_IP, NONE = "ClientIP", "None"
DEFAULT_TIMEOUT_S = 10800  # the Service's default sessionAffinityConfig.clientIP.timeoutSeconds
CHUNK = 64 << 10
PROBE_PERIOD_S = 0.25  # how soon a replica that turns unready leaves the offered replicas


class Chooser:
    """Which replica a new connection from ``client`` tries, in order (pure, clocked)."""

    def __init__(self, replicas: int, affinity: str = CLIENT_IP,
                 timeout: float = DEFAULT_TIMEOUT_S, clock: Callable[[], float] = time.monotonic):
        self.replicas, self.affinity, self.timeout, self.clock = replicas, affinity, timeout, clock
        self.bound: dict[str, tuple[int, float]] = {}  # client -> (replica, last connection)
        self.turn = 0

    def order(self, client: str, ready: Collection[int] | None = None) -> list[int]:
        """The ready replicas (all when ``ready`` is None), the client's own first."""
        first = self._sticky(client)
        if first is None or (ready is not None and first not in ready):
            first, self.turn = self.turn, (self.turn + 1) % self.replicas
        rotation = [(first + i) % self.replicas for i in range(self.replicas)]
        return rotation if ready is None else [r for r in rotation if r in ready]

    def connected(self, client: str, replica: int) -> None:
        if self.affinity == CLIENT_IP:
            self.bound[client] = (replica, self.clock())

    def _sticky(self, client: str) -> int | None:
        if self.affinity != CLIENT_IP or client not in self.bound:
            return None
        replica, last = self.bound[client]
        if self.clock() - last > self.timeout:
            del self.bound[client]
            return None
        return replica


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await src.read(CHUNK):
            dst.write(data)
            await dst.drain()
    dst.close()


async def ready(backend: tuple[str, int], timeout: float = 1.0) -> bool:
    """The replica's readiness probe, as the kubelet's httpGet: 200 from /readyz in time."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(*backend)
            try:
                writer.write(b"GET /readyz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
                status = (await reader.readline()).split()
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return False
    return len(status) > 1 and status[1] == b"200"


class Proxy:
    def __init__(self, backends: list[tuple[str, int]], chooser: Chooser):
        self.backends, self.chooser = backends, chooser
        self.ready: set[int] = set()  # the endpoints: replicas whose last probe passed

    async def probe(self) -> None:
        results = await asyncio.gather(*(ready(b) for b in self.backends))
        self.ready = {i for i, ok in enumerate(results) if ok}

    async def probe_forever(self, period: float = PROBE_PERIOD_S) -> None:
        while True:
            await asyncio.sleep(period)
            await self.probe()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = writer.get_extra_info("peername")[0]
        for replica in self.chooser.order(client, self.ready):
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.backends[replica])
            except OSError:
                continue
            self.chooser.connected(client, replica)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            return
        writer.close()  # no replica answers: the client sees its connection refused-like close


async def serve(listen: tuple[str, int], proxy: Proxy) -> None:
    await proxy.probe()
    prober = asyncio.create_task(proxy.probe_forever())
    server = await asyncio.start_server(proxy.handle, *listen)
    async with server:
        try:
            await server.serve_forever()
        finally:
            prober.cancel()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpusteward.sandbox.affinity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", type=parse_hostport, required=True)
    p.add_argument("--backend", type=parse_hostport, action="append", required=True)
    p.add_argument("--affinity", choices=(CLIENT_IP, NONE), default=CLIENT_IP)
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    args = p.parse_args(argv)
    if any(host != "127.0.0.1" for host, _ in [args.listen, *args.backend]):
        p.error("loopback only: every address must be 127.0.0.1")
    chooser = Chooser(len(args.backend), args.affinity, args.timeout)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.listen, Proxy(args.backend, chooser)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
