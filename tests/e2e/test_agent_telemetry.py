"""The NVML agent in place of the DCGM simulator, end to end.

A second sandbox runs with ``telemetry="agent"``: one real ``gpusteward agent`` process per GPU
node, each loading the NVML test library through the real pynvml binding and asking a kubelet
PodResources socket which pod holds which GPU; the simulator keeps both true to its own GPUs,
and Prometheus scrapes the agents instead of the simulator. Then:

* the agents export the simulator's DCGM series, series for series and value for value;
* for the same workload the extender gives the same filter and prioritize replies, byte for
  byte, whether the simulator (the session sandbox) or the agents feed it;
* every placement, reclaim and report scenario the simulator's tests run holds with the agents
  too, unhealthy GPUs both lost (XID 79) and reported by an NVML XID event (XID 48). This
  sandbox's Prometheus keeps the exporter's labels (honor_labels: true, as our agent's
  ServiceMonitor sets it) where the session sandbox's stores dcgm-exporter's chart default
  (false): so each scenario runs in both label modes.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpusteward.core.dcgm import GENERATIONS
from gpusteward.sandbox.cluster import Sandbox
from gpusteward.sandbox.fleet import DEFAULT_FLEET, Fleet
from gpusteward.sandbox.kubehttp import wait_for
from gpusteward.sandbox.scrape import AGENT
from tests.e2e import scenarios
from tests.e2e.kube import Namespace, gpu_pod, promql, wait_for_gpu_samples
from tests.e2e.scenarios import A100S, H100S, L4S
from tests.support.sandbox import fresh_namespace, started

NODES = sorted(H100S | A100S | L4S)
GPUS = 2 * 8 + 2 * 8 + 3 * 4
# The whole-GPU pools: the agent enumerates no MIG instances (docs/agent.md), and the shared
# pools' telemetry is covered by the simulator's tests (test_shared_gpus).
WHOLE_GPU_FLEET = Fleet(pools=[p for p in DEFAULT_FLEET.pools if p.mig is None and p.replicas == 1])

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def agent_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    # honor_labels: true, as our agent's ServiceMonitor sets it (the session sandbox scrapes the
    # simulator with dcgm-exporter's chart default, false): every scenario runs in both modes.
    for box in started(tmp_path_factory, "agent-sandbox", fleet=WHOLE_GPU_FLEET,
                       telemetry="agent", honor_labels=True):
        # Each agent starts on its own: until every node's GPUs are read, a node without
        # samples scores neutral load, and a first placement can prefer an idle H100 to an
        # A100 whose agent is not scraped yet (seen in CI).
        wait_for("every node's telemetry in the extender", lambda box=box: _scored_everywhere(box),
                 timeout=60)
        yield box


def _scored_everywhere(box: Sandbox) -> bool:
    """The extender knows every node of the fleet and scores none of them neutral."""
    gauges = {f.name: f.samples[0].value
              for f in text_string_to_metric_families(_get(f"{box.extender_url}/metrics"))
              if f.name in ("gpusteward_extender_nodes", "gpusteward_telemetry_stale_nodes")}
    return gauges == {"gpusteward_extender_nodes": len(NODES),
                      "gpusteward_telemetry_stale_nodes": 0}


@pytest.fixture
def agent_ns(agent_sandbox: Sandbox) -> Iterator[Namespace]:
    yield from fresh_namespace(agent_sandbox.api())


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def _post(url: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return bytes(resp.read())


# What the agent exports: the double's families of dcgm-exporter's default CSV, under either
# generation's names; not the exporter's opt-in XID counts nor the health families, which the
# simulator prints too (docs/agent.md).
AGENT_FAMILIES = frozenset(f.name for g in GENERATIONS.values() for f in g.fields)


def dcgm_series(text: str) -> Series:
    """The samples of one exposition the agent also exports, by name and label set."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in AGENT_FAMILIES
    }


def _eventually_equal(what: str, left, right, timeout: float = 30.0):
    """Poll both sides until they agree; on timeout assert, so pytest shows the difference."""
    deadline = time.monotonic() + timeout
    while True:
        a, b = left(), right()
        if a == b or time.monotonic() > deadline:
            assert a == b, what
            return a
        time.sleep(1.0)


WORKLOAD = (("busy", "l4-0", 2, "70"), ("idle", "h100-0", 1, "0"), ("half", "a100-1", 4, "37"))


def test_the_agents_export_the_simulators_series(agent_sandbox, agent_ns):
    for name, node, gpus, util in WORKLOAD:
        agent_ns.create_pod(gpu_pod(name, gpus, node=node, util=util))
    for name, *_ in WORKLOAD:
        agent_ns.running(name)

    def simulator() -> Series:
        return dcgm_series(_get(f"{agent_sandbox.simulator_url}/metrics"))

    def agents() -> Series:
        merged: Series = {}
        for url in agent_sandbox.agent_urls().values():
            merged |= dcgm_series(_get(f"{url}/metrics"))
        return merged

    series = _eventually_equal("agents' DCGM series == simulator's", agents, simulator)
    util = {dict(labels).get("pod"): value for (name, labels), value in series.items()
            if name == "DCGM_FI_DEV_GPU_UTIL"}
    assert len([1 for (name, _) in series if name == "DCGM_FI_DEV_GPU_UTIL"]) == GPUS
    assert {util[name] for name, *_ in WORKLOAD} == {70.0, 0.0, 37.0}
    # Prometheus holds them as scraped from the seven agents, pod labels and all.
    wait_for_gpu_samples(agent_sandbox.prometheus_url, agent_ns.name,
                         [name for name, *_ in WORKLOAD], settle=0)
    wait_for("Prometheus to scrape every agent", lambda: sorted(
        r["value"][1] for r in promql(agent_sandbox.prometheus_url, 'up{job="gpusteward-agent"}'))
        == ["1"] * len(NODES))
    query = f'max by (pod, Hostname) (DCGM_FI_DEV_GPU_UTIL{{namespace="{agent_ns.name}"}})'
    placed = {r["metric"]["pod"]: (r["metric"]["Hostname"], r["value"][1])
              for r in promql(agent_sandbox.prometheus_url, query)}
    assert placed == {name: (node, util) for name, node, _, util in WORKLOAD}
    # honor_labels: true: a free GPU carries the agent's own pod, as the Operator's target label.
    free = promql(agent_sandbox.prometheus_url,
                  'count by (pod) (DCGM_FI_DEV_GPU_UTIL{Hostname="l4-0", namespace="gpusteward"})')
    assert [r["metric"]["pod"] for r in free] == [AGENT.pod("l4-0")]
    assert free[0]["value"][1] == "2"  # 4 GPUs, 2 held by "busy"


PROBES = (
    gpu_pod("probe-inference", 1, cards="NVIDIA-L4", cls="inference"),
    gpu_pod("probe-batch", 4, cls="batch"),
    gpu_pod("probe-interactive", 1, cards="NVIDIA-L4", cls="interactive"),
    gpu_pod("probe-training", 8, cls="training"),
)
LOAD = (("l4-0", 2, "95"), ("l4-1", 2, "5"), ("l4-2", 2, "60"), ("h100-0", 4, "40"),
        ("a100-0", 8, "0"), ("a100-1", 2, "85"))


def _replies(box: Sandbox) -> list[bytes]:
    return [_post(f"{box.extender_url}/{verb}", {"Pod": probe, "NodeNames": NODES})
            for probe in PROBES for verb in ("filter", "prioritize")]


def test_the_extender_answers_alike_from_either_source(sandbox, agent_sandbox):
    name = f"alike-{secrets.token_hex(3)}"  # the same namespace and pods in both clusters
    namespaces = [Namespace(box.api(), name) for box in (sandbox, agent_sandbox)]
    try:
        for ns in namespaces:
            ns.create()
            for node, gpus, util in LOAD:
                ns.create_pod(gpu_pod(f"load-{node}", gpus, node=node, util=util))
        for box, ns in zip((sandbox, agent_sandbox), namespaces, strict=True):
            for node, *_ in LOAD:
                ns.running(f"load-{node}")
            wait_for_gpu_samples(box.prometheus_url, name, [f"load-{n}" for n, *_ in LOAD])
        replies = _eventually_equal("extender replies from simulator == from agents",
                                    lambda: _replies(sandbox), lambda: _replies(agent_sandbox))
    finally:
        for ns in namespaces:
            ns.delete()
    # Not vacuous: the interactive probe (live load alone) ranks the L4s by their load.
    scores = {h["Host"]: h["Score"] for h in json.loads(replies[5])}
    assert scores["l4-1"] > scores["l4-0"], scores
    assert scores["l4-1"] >= scores["l4-2"] >= scores["l4-0"], scores


def test_pods_land_only_on_cards_they_accept_in_preference_order(agent_sandbox, agent_ns):
    scenarios.pods_land_only_on_cards_they_accept_in_preference_order(agent_sandbox, agent_ns)


def test_a_burst_does_not_all_land_on_the_node_that_looked_idlest(agent_sandbox, agent_ns):
    scenarios.a_burst_does_not_all_land_on_the_node_that_looked_idlest(agent_sandbox, agent_ns)


def test_spread_class_prefers_the_cooler_node(agent_sandbox, agent_ns):
    scenarios.spread_class_prefers_the_cooler_node(agent_sandbox, agent_ns)


@pytest.mark.parametrize("xid", [pytest.param(79, id="gpus-lost"),
                                 pytest.param(48, id="xid-event-double-bit-ecc")])
def test_an_unhealthy_node_receives_no_new_gpu_pods(agent_sandbox, agent_ns, xid):
    # 79: NVML calls the GPUs lost; 48: NVML's XID event, through the agent's event thread.
    scenarios.an_unhealthy_node_receives_no_new_gpu_pods(agent_sandbox, agent_ns, xid)


async def test_an_idle_pod_is_warned_then_evicted(agent_sandbox, agent_ns, reclaimer):
    rec = await reclaimer("enforce", box=agent_sandbox)
    await scenarios.an_idle_pod_is_warned_then_evicted(agent_ns, rec)


async def test_a_busy_pod_is_left_alone(agent_sandbox, agent_ns, reclaimer):
    rec = await reclaimer("enforce", box=agent_sandbox)
    await scenarios.a_busy_pod_is_left_alone_and_its_marks_cleared(agent_ns, rec)


def test_a_known_workload_gives_exact_report_numbers(agent_sandbox, tmp_path):
    with scenarios.report_workload(agent_sandbox, tmp_path) as workload:
        scenarios.a_known_workload_gives_exact_numbers_by_team(workload)
