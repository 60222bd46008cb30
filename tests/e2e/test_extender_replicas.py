"""Two extender replicas behind one address, as the shipped Service runs them.

A sandbox of its own (two H100 nodes and one L4 node, to keep the CPU low) runs two extender
processes behind ``gpusteward.sandbox.affinity``, a loopback proxy that picks a replica per
connection as kube-proxy does for a Service with ``sessionAffinity: ClientIP`` (kube-proxy's
iptables rules: ``-m recent --rcheck --seconds <timeoutSeconds> --reap``, and a dead pod leaves
the endpoints). The real kube-scheduler calls that one address.

* every scheduling call reaches one replica, so its in-flight expectations protect a burst as a
  single extender's do (the burst scenario of tests/e2e/scenarios.py, unchanged);
* the replica serving the scheduler stopped in the middle of a burst (SIGTERM, as Kubernetes
  stops a pod) loses nothing: it drains (unready, ``Connection: close`` on each answer) while
  the proxy, probing ``/readyz`` as the endpoints follow readiness, stops offering it; every pod
  binds on a card it accepts and the other replica answers from then on. (Before the drain, a
  CI run saw one pod of this burst placed on the L4 node: the replica closed the scheduler's
  keep-alive connection under a call being written, Go does not resend a written POST, and the
  ``ignorable`` extender was skipped for that pod.)

Without affinity (round robin per connection) the burst protection would only split when the
scheduler's connection is re-established between the calls of one burst: kube-scheduler makes
its extender calls one at a time over one keep-alive connection, so that split cannot be
provoked reliably here and is not compared (docs/operations.md explains the choice).
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpusteward.sandbox.cluster import REPLICA_PREFIX, Sandbox
from gpusteward.sandbox.fleet import DEFAULT_FLEET, Fleet
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e import scenarios
from tests.e2e.kube import Namespace, gpu_pod
from tests.e2e.scenarios import H100S
from tests.support.sandbox import fresh_namespace, started

FLEET = Fleet(pools=[p if p.name == "h100" else msgspec.structs.replace(p, count=1)
                     for p in DEFAULT_FLEET.pools if p.name in ("h100", "l4")])


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from started(tmp_path_factory, "replicas-sandbox", fleet=FLEET, extender_replicas=2)


@pytest.fixture
def ns(box: Sandbox) -> Iterator[Namespace]:
    yield from fresh_namespace(box.api(), "replicas")


def scheduling_calls(port: int) -> float:
    """filter + prioritize calls one replica answered, from its own /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples
               if s.name == "gpusteward_extender_requests_total"
               and s.labels.get("verb") in ("filter", "prioritize"))


def calls_by_replica(box: Sandbox) -> dict[int, float]:
    return {i: scheduling_calls(port) for i, port in enumerate(box.replica_ports())
            if f"{REPLICA_PREFIX}{i}" in box.procs}


def test_a_burst_spreads_as_with_one_replica(box, ns):
    scenarios.a_burst_does_not_all_land_on_the_node_that_looked_idlest(box, ns)
    calls = calls_by_replica(box)
    assert sorted(calls.values())[0] == 0 < sorted(calls.values())[1], calls  # one replica


def test_a_replica_stopped_mid_burst_loses_nothing(box, ns):
    ns.create_pod(gpu_pod("first", 1, cards="NVIDIA-H100*", cls="interactive"))
    assert ns.node_of("first") in H100S
    before = calls_by_replica(box)
    serving = max(before, key=before.__getitem__)
    survivor = 1 - serving
    wave = [f"burst-{i}" for i in range(8)]
    for name in wave[:4]:
        ns.create_pod(gpu_pod(name, 1, cards="NVIDIA-H100*", cls="interactive"))
    wait_for("the burst to start binding",
             lambda: any(ns.pod(n)["spec"].get("nodeName") for n in wave[:4]), timeout=60)
    stopping = threading.Thread(target=box.stop_component, args=(f"{REPLICA_PREFIX}{serving}",))
    stopping.start()
    for name in wave[4:]:  # while the serving replica shuts down
        ns.create_pod(gpu_pod(name, 1, cards="NVIDIA-H100*", cls="interactive"))
    stopping.join()
    ns.create_pod(gpu_pod("after", 1, cards="NVIDIA-H100*", cls="interactive"))
    placed = {name: ns.node_of(name) for name in [*wave, "after"]}
    assert set(placed.values()) <= H100S, placed  # no pod scheduled without the filter
    assert scheduling_calls(box.replica_ports()[survivor]) > before[survivor]
