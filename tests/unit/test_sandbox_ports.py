"""Sandbox ports: picked below the kernel's ephemeral range, where no outgoing connection can
take one between the pick and the child's bind (CI once lost Prometheus's port that way with
several sandboxes on one machine), and never one another process on the machine chose in the
last quarter hour (parallel test workers each start sandboxes)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from gpusteward.sandbox import procs


def test_ports_come_from_below_the_ephemeral_range_and_are_free():
    low, _ = procs._ephemeral_range()
    ports = [procs.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(procs._LOWEST_PORT <= p < low for p in ports)
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free: would raise "address already in use"


@pytest.fixture(autouse=True)
def claims(tmp_path, monkeypatch):
    monkeypatch.setattr(procs, "_claims_path", lambda: tmp_path / "ports.json")
    return tmp_path / "ports.json"


class Scripted:
    """The random picks, in order."""

    def __init__(self, *picks):
        self.picks = iter(picks)

    def __call__(self):
        return self

    def randrange(self, *_):
        return next(self.picks)


def unbound_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_port_someone_listens_on_is_never_handed_out(monkeypatch):
    with socket.socket() as taken, socket.socket() as other:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        other.bind(("127.0.0.1", 0))
        busy, free = taken.getsockname()[1], other.getsockname()[1]
        other.close()
        monkeypatch.setattr(procs.random, "SystemRandom", Scripted(busy, busy, free))
        assert procs.free_port() == free


def test_a_port_another_process_claimed_is_skipped_until_its_claim_expires(claims, monkeypatch):
    first, second = unbound_port(), unbound_port()
    claims.write_text(json.dumps({str(first): time.time() - 60}))  # chosen, not bound yet
    monkeypatch.setattr(procs.random, "SystemRandom", Scripted(first, second))
    assert procs.free_port() == second

    claims.write_text(json.dumps({str(first): time.time() - procs._CLAIM_S - 1}))
    monkeypatch.setattr(procs.random, "SystemRandom", Scripted(first))
    assert procs.free_port() == first
    assert set(json.loads(claims.read_text())) == {str(first)}  # the expired claim renewed


PICKER = """
import sys
from pathlib import Path
from gpusteward.sandbox import procs
procs._claims_path = lambda: Path(sys.argv[1])
print(" ".join(str(procs.free_port()) for _ in range(300)))
"""


def test_processes_choosing_at_once_never_share_a_port(claims):
    # 2 × 300 picks among ~20,000: without the claims, two coincide with probability 98 %.
    pickers = [subprocess.Popen([sys.executable, "-c", PICKER, str(claims)],
                                stdout=subprocess.PIPE, text=True) for _ in range(2)]
    chosen = [set(map(int, p.communicate(timeout=60)[0].split())) for p in pickers]
    assert [len(c) for c in chosen] == [300, 300]
    assert chosen[0].isdisjoint(chosen[1])


def test_a_kernel_with_every_port_ephemeral_falls_back_to_the_kernels_pick(monkeypatch):
    monkeypatch.setattr(procs, "_ephemeral_range", lambda: (1024, 65535))
    port = procs.free_port()
    assert 0 < port < 65536
