"""Listen addresses as operators write them on the command line."""

from __future__ import annotations


def parse_hostport(text: str) -> tuple[str, int]:
    """`0.0.0.0:8888`, `[::1]:9400` or `:9090` (all interfaces) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)
