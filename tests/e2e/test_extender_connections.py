"""The real kube-scheduler keeps placing GPU pods through the extender while silent sockets
hold the extender's connection cap (issue 25, item 4).

An attacker opens more connections than the cap (256) on loopback and never sends a byte,
reopening each one the extender closes, as a flood would. Before the first-byte deadline and
the making of room at the cap, such sockets held the cap for two minutes and every new
connection, the scheduler's included, was reset; the extender being ``ignorable``, pods were
then placed without it, on any card.
"""

from __future__ import annotations

import select
import socket
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client.parser import text_string_to_metric_families

from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e.kube import Namespace, gpu_pod
from tests.e2e.scenarios import L4S

CAP = 256  # serve.Transport.max_connections
HELD = CAP + 16  # past the cap: each new one makes the extender close the oldest


class SilentFlood:
    """Keeps ``count`` connections open to 127.0.0.1:port, none ever sending a byte, each one
    the server closes opened again (four times a second)."""

    def __init__(self, port: int, count: int):
        self.port, self.count = port, count
        self.open: list[socket.socket] = []
        self.fewest_open = count  # after each refill, once first filled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="silent-flood", daemon=True)

    def _connect(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", self.port))
        except OSError:  # the accept queue full for a moment: again next round
            s.close()
            return
        self.open.append(s)

    def _drop_closed(self) -> None:
        readable, _, _ = select.select(self.open, [], [], 0)
        for s in readable:  # a silent socket turns readable only when the server closes it
            self.open.remove(s)
            s.close()

    def _run(self) -> None:
        filled = False
        while not self._stop.is_set():
            self._drop_closed()
            for _ in range(self.count - len(self.open)):
                if self._stop.is_set():
                    return
                self._connect()
            if filled:
                self.fewest_open = min(self.fewest_open, len(self.open))
            filled = filled or len(self.open) == self.count
            self._stop.wait(0.25)

    @contextmanager
    def held(self) -> Iterator[SilentFlood]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(timeout=30)
            for s in self.open:
                s.close()
            self.open.clear()


def extender_counts(box: Sandbox) -> dict[str, float]:
    """The extender's answered filter calls and its connection closes by reason, read from its
    /metrics over a new connection of our own (which the cap must admit too)."""
    with urllib.request.urlopen(f"{box.extender_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "gpusteward_extender_requests_total" and s.labels == {
                    "verb": "filter", "code": "200"}:
                counts["filter"] = s.value
            elif s.name == "gpusteward_extender_connections_closed_total":
                counts[s.labels["reason"]] = s.value
    return counts


def test_gpu_pods_are_placed_through_the_extender_while_silent_sockets_hold_its_cap(
        sandbox: Sandbox, ns: Namespace) -> None:
    with SilentFlood(sandbox.ports["extender"], HELD).held() as flood:
        start = extender_counts(sandbox)
        wait_for("the flood to fill the extender's cap", lambda: extender_counts(sandbox).get(
            "idle_evicted", 0) > start.get("idle_evicted", 0), timeout=60)
        before = extender_counts(sandbox)
        for i in range(3):
            ns.create_pod(gpu_pod(f"small-{i}", 1, cards="NVIDIA-L4"))
        placed = {f"small-{i}": ns.node_of(f"small-{i}", timeout=90) for i in range(3)}
        after = extender_counts(sandbox)
    assert set(placed.values()) <= L4S, placed
    assert after["filter"] - before.get("filter", 0) >= 3, (before, after)  # not skipped
    # the cap stayed full while they were placed, and no connection was refused
    assert after["idle_evicted"] > before["idle_evicted"], (before, after)
    assert after.get("connection_cap", 0) == before.get("connection_cap", 0), (before, after)
    assert flood.fewest_open >= CAP, flood.fewest_open
