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

* a reservation one reclaimer replica made (GPUs freed for a waiting pod, core/reclaim/reserve.py)
  is honoured by every extender replica and by the other reclaimer replica: it lives on the pod.

Without affinity (round robin per connection) the burst protection would only split when the
scheduler's connection is re-established between the calls of one burst: kube-scheduler makes
its extender calls one at a time over one keep-alive connection, so that split cannot be
provoked reliably here and is not compared (docs/operations.md explains the choice).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpusteward.adapters.policyfile import load_policy
from gpusteward.core.kubewire import WirePod, to_pod
from gpusteward.core.model import RESERVED
from gpusteward.core.reclaim import reserve
from gpusteward.core.reclaim.model import ActResult
from gpusteward.sandbox.cluster import REPLICA_PREFIX, Sandbox
from gpusteward.sandbox.fleet import DEFAULT_FLEET, Fleet
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e import scenarios
from tests.e2e.kube import Namespace, annotations, apply_priority_classes, cycle_for, gpu_pod
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


async def test_a_reservation_one_reclaimer_made_is_honoured_by_every_replica(box, ns,
                                                                          reclaimer):
    """Replica A's actor reserves h100-0 for a waiting pod, as its queue claim does (that
    decision: tests/e2e/test_reservations.py); the pod asks for a card no node has, so the
    reservation stays while it is watched. A pod of higher priority, which the scheduler's
    nominator would let past that nomination (it counts only nominated pods of equal or higher
    priority, and only while the nomination lasts), fits only on h100-0: both extender
    replicas keep it off the reserved GPUs, and replica B's cycles keep the reservation. The
    waiting pod deleted, both extenders free the GPUs."""
    apply_priority_classes(box.api(), {"gpu-low": 100, "gpu-high": 10000})
    ns.create_pod(gpu_pod("full", 8, node="h100-1", util="90", priority_class="gpu-high"))
    ns.running("full")
    ns.create_pod(gpu_pod("waits", 8, cards="NVIDIA-NONE*", priority_class="gpu-low"))
    wait_for("the waiting pod to be unschedulable", lambda: any(
        c.get("reason") == "Unschedulable"
        for c in ns.pod("waits")["status"].get("conditions") or ()), timeout=60)
    a, b = await reclaimer("enforce", box=box), await reclaimer("enforce", box=box)
    policy = load_policy(box.cfg.policy)
    waiting = to_pod(msgspec.convert(ns.pod("waits"), WirePod), policy.resources)
    made = reserve.reserve(waiting, "h100-0", [], ns.name, time.time(),
                           float(policy.queue.reservation_ttl))
    assert await a.writer.apply(made) == ActResult.DONE
    ns.create_pod(gpu_pod("other", 8, cards="NVIDIA-H100*", priority_class="gpu-high"))
    other = ns.pod("other")
    for port in box.replica_ports():  # each replica, asked directly, from its own watch
        wait_for(f"replica on port {port} to keep h100-0 from the other pod", lambda port=port: (
            "reserved for a waiting pod" in filter_failures(port, other).get("h100-0", "")),
            timeout=30)
    await cycle_for(b, 10)  # replica B, leading now
    # the scheduler's failed attempts cleared the nomination (schedule_one.go
    # clearNominatedNode); the reservation stands, and the extenders keep to it
    assert RESERVED in annotations(ns, "waits")
    assert ns.pod("waits")["status"].get("nominatedNodeName") in (None, "h100-0")
    assert not ns.pod("other")["spec"].get("nodeName")
    ns.api.delete(ns.path("pods", "waits"))  # its reservation goes with it
    for port in box.replica_ports():
        wait_for(f"replica on port {port} to free h100-0", lambda port=port: (
            "h100-0" not in filter_failures(port, other)), timeout=30)
    # The scheduler retries the waiting pod only on an event its filter plugins care about (a
    # pending pod's deletion is none) or after its unschedulable flush (5 min); a new pod is
    # placed at once.
    ns.api.delete(ns.path("pods", "other"))
    ns.create_pod(gpu_pod("after", 8, cards="NVIDIA-H100*", priority_class="gpu-high"))
    assert ns.node_of("after", timeout=60) == "h100-0"


def filter_failures(port: int, pod: dict) -> dict[str, str]:
    body = json.dumps({"Pod": pod, "NodeNames": ["h100-0", "h100-1"]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/filter", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        failed: dict[str, str] = json.loads(resp.read()).get("FailedNodes") or {}
    return failed


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
