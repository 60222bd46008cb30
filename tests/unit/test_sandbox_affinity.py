"""The sandbox's Service stand-in picks replicas as kube-proxy does: ClientIP affinity that a
connection renews and ``timeoutSeconds`` of silence ends (kube-proxy iptables mode,
pkg/proxy/iptables/proxier.go: ``-m recent --rcheck --seconds <timeout> --reap`` then ``--set``),
fail-over to the next replica, only ready replicas offered (the Service's endpoints), or round
robin without affinity."""

from __future__ import annotations

from gpusteward.sandbox.affinity import CLIENT_IP, NONE, Chooser


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_client_ip_affinity_keeps_a_client_on_the_replica_it_first_reached() -> None:
    chooser = Chooser(2, CLIENT_IP, timeout=60, clock=Clock())
    first = chooser.order("10.0.0.1")[0]
    chooser.connected("10.0.0.1", first)
    assert [chooser.order("10.0.0.1")[0] for _ in range(5)] == [first] * 5
    # another client starts on the next replica in turn
    assert chooser.order("10.0.0.2")[0] != first


def test_a_refused_replica_is_skipped_and_the_client_rebound_to_the_next() -> None:
    chooser = Chooser(3, CLIENT_IP, timeout=60, clock=Clock())
    chooser.connected("10.0.0.1", 1)
    assert chooser.order("10.0.0.1") == [1, 2, 0]
    chooser.connected("10.0.0.1", 2)  # replica 1 refused; the proxy connected to 2
    assert chooser.order("10.0.0.1") == [2, 0, 1]


def test_affinity_ends_after_timeout_seconds_without_a_connection() -> None:
    clock = Clock()
    chooser = Chooser(2, CLIENT_IP, timeout=60, clock=clock)
    chooser.connected("10.0.0.1", 1)
    clock.now = 59
    chooser.connected("10.0.0.1", chooser.order("10.0.0.1")[0])  # renews the timer
    clock.now = 118
    assert chooser.order("10.0.0.1")[0] == 1
    clock.now = 179
    assert "10.0.0.1" in chooser.bound and chooser.order("10.0.0.1")[0] == 0
    assert "10.0.0.1" not in chooser.bound


def test_without_affinity_connections_rotate_over_the_replicas() -> None:
    chooser = Chooser(2, NONE, clock=Clock())
    picks = []
    for _ in range(4):
        picks.append(chooser.order("10.0.0.1")[0])
        chooser.connected("10.0.0.1", picks[-1])
    assert picks == [0, 1, 0, 1]


def test_a_replica_out_of_the_endpoints_is_not_offered_and_the_client_moves_on() -> None:
    chooser = Chooser(3, CLIENT_IP, timeout=60, clock=Clock())
    chooser.connected("10.0.0.1", 1)
    assert chooser.order("10.0.0.1", ready={0, 1, 2}) == [1, 2, 0]
    moved = chooser.order("10.0.0.1", ready={0, 2})  # replica 1 draining: readiness failed
    assert 1 not in moved and moved
    chooser.connected("10.0.0.1", moved[0])
    assert chooser.order("10.0.0.1", ready={0, 1, 2})[0] == moved[0]  # bound to the new one
    assert chooser.order("10.0.0.1", ready=set()) == []  # no endpoints: refused
