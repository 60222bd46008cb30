"""GPU faults against the sandbox (issue 31): the real API server and scheduler, the sandbox's
Prometheus scraping the DCGM double, the reclaimer through its own adapters.

Shapes: the double prints dcgm-exporter's XID gauge and its opt-in DCGM_EXP_XID_ERRORS_TOTAL
(one series per GPU and `xid`, appearing with the first XID: dcgm-exporter README, "Cumulative
XID and clock event counters"; gpusteward.core.dcgm). NVIDIA NVSentinel's fault-quarantine
cordons the node and records the event in the node annotation `quarantineHealthEvent`
(fault-quarantine pkg/common: QuarantineHealthEventAnnotationKey); its platform-connector sets
a node condition per fatal check, e.g. `GpuMemWatch`/`GpuMemWatchIsNotHealthy`."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import yaml

from gpusteward.core.reclaim.model import FAULTY_GPU
from gpusteward.core.report.aggregate import build_report
from gpusteward.core.report.model import ReportInput, Window
from gpusteward.sandbox.cluster import SANDBOX_POLICY
from gpusteward.sandbox.fleet import XID_GPUS_LABEL, XID_LABEL
from gpusteward.sandbox.kubehttp import wait_for
from tests.e2e import scenarios
from tests.e2e.kube import (
    annotations,
    cycle_until,
    events,
    gone,
    gpu_pod,
    promql,
    wait_for_gpu_samples,
)
from tests.e2e.scenarios import due_pod, filter_passes

# One node per test: an XID stays in the exporter's windowed count after its test ends, and a
# pod placed on that GPU then is on a faulty GPU (rightly).
XID_NODE, QUARANTINED = "a100-1", "a100-0"
REPLAYED = "l4-2"  # the what-if replay counts an XID counter present at its start as new


@contextmanager
def node_patch(box, node: str, patch: dict, undo: dict) -> Iterator[None]:
    api, path = box.api(), f"/api/v1/nodes/{node}"
    api.merge_patch(path, patch)
    try:
        yield
    finally:
        api.merge_patch(path, undo)


def held_by(pod: str, ns, metric: str = "DCGM_FI_DEV_GPU_UTIL", match: str = "") -> str:
    """A selector for ``pod``'s series in either label mode of the scrape (``exported_*``
    under honor_labels false)."""
    return (f'{metric}{{exported_namespace="{ns.name}", exported_pod="{pod}"{match}}} or '
            f'{metric}{{namespace="{ns.name}", pod="{pod}"{match}}}')


def gpu_of(box, ns, pod: str) -> str:
    found = promql(box.prometheus_url, held_by(pod, ns))
    assert len(found) == 1, found
    return str(found[0]["metric"]["gpu"])


async def faulty_report(rec, ns):
    snap = await rec.reader.read()
    r = build_report(ReportInput(snap, Window(snap.now - 60, snap.now, 10)), rec.policy)
    return {f.pod: f.fault for f in r.faulty if f.namespace == ns.name}


async def test_a_pod_on_a_gpu_with_an_xid_is_faulty_and_its_idle_neighbour_is_reclaimed(
        sandbox, ns, reclaimer):
    for name in ("broken", "beside"):
        ns.create_pod(due_pod(name, node=XID_NODE))
        ns.running(name)
    wait_for_gpu_samples(sandbox.prometheus_url, ns.name, ["broken", "beside"], settle=0)
    gpu = gpu_of(sandbox, ns, "broken")
    assert gpu != gpu_of(sandbox, ns, "beside")
    with node_patch(sandbox, XID_NODE,
                    {"metadata": {"labels": {XID_LABEL: "79", XID_GPUS_LABEL: gpu}}},
                    {"metadata": {"labels": {XID_LABEL: None, XID_GPUS_LABEL: None}}}):
        wait_for("the XID counter", lambda: promql(sandbox.prometheus_url, held_by(
            "broken", ns, "DCGM_EXP_XID_ERRORS_TOTAL", ', xid="79"')), timeout=30)
        rec = await reclaimer("enforce")
        await scenarios.the_faulty_pod_stays_and_its_idle_neighbour_goes(ns, rec, "XID 79")
        assert "XID 79" in (await faulty_report(rec, ns))["broken"]


def quarantine(event: str = "GpuMemWatch") -> dict:
    """What NVSentinel leaves on a node it quarantined: cordoned, and the event it acted on."""
    return {"metadata": {"annotations": {"quarantineHealthEvent": json.dumps(
        [{"checkName": event, "isFatal": True, "nodeName": QUARANTINED}])}},
        "spec": {"unschedulable": True}}


async def test_a_quarantined_nodes_gpus_are_faulty_never_offered_and_never_reclaimed(
        sandbox, ns, reclaimer):
    ns.create_pod(due_pod("held", node=QUARANTINED))
    ns.running("held")
    wait_for_gpu_samples(sandbox.prometheus_url, ns.name, ["held"], settle=0)
    assert filter_passes(sandbox, QUARANTINED, gpus=1)
    with node_patch(sandbox, QUARANTINED, quarantine(), {"metadata": {"annotations": {
            "quarantineHealthEvent": None}}, "spec": {"unschedulable": None}}):
        wait_for("the extender to see the quarantine",
                 lambda: not filter_passes(sandbox, QUARANTINED, gpus=1), timeout=30)
        rec = await reclaimer("enforce")
        await cycle_until(rec, "the fault noted", lambda: FAULTY_GPU in annotations(ns, "held"))
        for _ in range(3):  # well past its deadline: still not reclaimed
            await rec.cycle()
        assert not gone(ns, "held")
        assert "quarantineHealthEvent" in annotations(ns, "held")[FAULTY_GPU]
        assert "quarantineHealthEvent" in (await faulty_report(rec, ns))["held"]
    wait_for("the extender to offer the node again",
             lambda: filter_passes(sandbox, QUARANTINED, gpus=1), timeout=30)
    await cycle_until(rec, "the note cleared", lambda: FAULTY_GPU not in annotations(ns, "held"))
    assert any("no longer faulty" in m for reason, m in events(ns, "held")
               if reason == "GPUActive")


async def test_the_whatif_replay_holds_a_pod_on_an_xid_gpu_faulty_and_reclaims_its_neighbour(
        sandbox, ns, tmp_path):
    """The same two idle pods, replayed by `gpusteward whatif` from Prometheus alone
    (kube-state-metrics' pod series, the DCGM double's series with its XID counter) under the
    sandbox policy with a 10 m xidWindow: the neighbour is reclaimed, the pod whose GPU's XID
    count rose is not."""
    start = float(math.floor(time.time())) - 20  # whatif reads 1 m at least
    for name in ("broken", "beside"):
        ns.create_pod(gpu_pod(name, 1, node=REPLAYED, util="0"))
        ns.running(name)
    wait_for_gpu_samples(sandbox.prometheus_url, ns.name, ["broken", "beside"], settle=0)
    gpu = gpu_of(sandbox, ns, "broken")
    with node_patch(sandbox, REPLAYED,
                    {"metadata": {"labels": {XID_LABEL: "79", XID_GPUS_LABEL: gpu}}},
                    {"metadata": {"labels": {XID_LABEL: None, XID_GPUS_LABEL: None}}}):
        wait_for("the XID counter", lambda: promql(sandbox.prometheus_url, held_by(
            "broken", ns, "DCGM_EXP_XID_ERRORS_TOTAL", ', xid="79"')), timeout=30)
    policy = yaml.safe_load(SANDBOX_POLICY.read_text())
    policy["health"]["xidWindow"] = "10m"
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    # idle window 15 s + a cycle to warn + grace 4 s: the neighbour is due well within 40 s
    time.sleep(max(0.0, start + 20 + 45 - time.time()))
    (outcome,) = scenarios.whatif(sandbox, start, time.time() - 2, path)
    assert set(scenarios.in_namespace(outcome, ns.name)) == {f"{ns.name}/beside"}, outcome


@pytest.fixture(autouse=True)
def _node_left_healthy(sandbox):
    yield
    for node in (XID_NODE, QUARANTINED, REPLAYED):
        wait_for(f"{node} offered again", lambda n=node: filter_passes(sandbox, n, gpus=1),
                 timeout=60)
