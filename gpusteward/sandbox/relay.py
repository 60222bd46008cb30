"""A TCP relay from a real node's side of the host to loopback-only sandbox servers.

The API server and Prometheus listen on 127.0.0.1 only, which a real node's network namespace
cannot reach; this relay listens on the host's end of the node's veth pair (an address the
sandbox gave itself) and copies bytes both ways, so nothing listens on the machine's own
interfaces.

    python -m gpusteward.sandbox.relay 10.251.0.1:6443=127.0.0.1:6443 [...]
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

_CHUNK = 1 << 16


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            writer.close()


def _handler(host: str, port: int):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    return handle


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def serve(routes: list[tuple[tuple[str, int], tuple[str, int]]]) -> None:
    servers = [await asyncio.start_server(_handler(*target), *listen)
               for listen, target in routes]
    print("relaying " + ", ".join(f"{a}:{b} -> {c}:{d}" for (a, b), (c, d) in routes),
          flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: relay LISTEN_HOST:PORT=TARGET_HOST:PORT ...", file=sys.stderr)
        return 2
    routes = []
    for arg in argv:
        listen, _, target = arg.partition("=")
        routes.append((_address(listen), _address(target)))
    asyncio.run(serve(routes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
