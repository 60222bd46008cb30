"""Sandbox ports: picked below the kernel's ephemeral range, where no outgoing connection can
take one between the pick and the child's bind (CI once lost Prometheus's port that way with
several sandboxes on one machine), and never the same one twice in a process."""

from __future__ import annotations

import socket

from gpusteward.sandbox import procs


def test_ports_come_from_below_the_ephemeral_range_and_are_free():
    low, _ = procs._ephemeral_range()
    ports = [procs.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(procs._LOWEST_PORT <= p < low for p in ports)
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free: would raise "address already in use"


def test_a_port_someone_listens_on_is_never_handed_out(monkeypatch):
    with socket.socket() as taken, socket.socket() as other:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        other.bind(("127.0.0.1", 0))
        busy, free = taken.getsockname()[1], other.getsockname()[1]
        other.close()
        picks = iter([busy, busy, free])

        class Scripted:  # the random picks, in order
            def randrange(self, *_):
                return next(picks)

        monkeypatch.setattr(procs.random, "SystemRandom", Scripted)
        monkeypatch.setattr(procs, "_handed_out", set())
        assert procs.free_port() == free


def test_a_kernel_with_every_port_ephemeral_falls_back_to_the_kernels_pick(monkeypatch):
    monkeypatch.setattr(procs, "_ephemeral_range", lambda: (1024, 65535))
    port = procs.free_port()
    assert 0 < port < 65536
