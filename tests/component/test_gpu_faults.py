"""GPU faults from a real Prometheus holding 45 minutes of dcgm-exporter history (15 s samples),
stored as a Prometheus Operator ServiceMonitor scrape stores it (issue 31).

Shapes: DCGM_FI_DEV_XID_ERRORS, the last-XID gauge printed for every GPU (0 until an XID; it keeps
the last one, NVIDIA/dcgm-exporter#500); DCGM_EXP_XID_ERRORS_TOTAL, the opt-in counter since
dcgm-exporter 4.8.3, one series per GPU and `xid` label that appears with that XID's first
occurrence ("cumulative XID errors observed since exporter start", dcgm-exporter README,
"Cumulative XID and clock event counters"). DCGM's own verdicts, at the instant:
DCGM_EXP_GPU_HEALTH_STATUS, one series per GPU and health watch (`health_watch`,
`health_error_code`; 0 pass, 10 warn, 20 fail: dcgm-exporter
internal/pkg/collector/gpu_health_collector.go), and DCGM_FI_DEV_ROW_REMAP_FAILURE (1 once a row
remap failed; in its default-counters.csv). All printed by gpusteward.core.dcgm."""

from __future__ import annotations

import time

import pytest

from gpusteward.adapters.faults import assemble, gpu_faults
from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.adapters.promql import exact_range, fault_queries
from gpusteward.core.attribution import Attribution
from gpusteward.core.dcgm import HEALTH_FAIL, HEALTH_WARN, PodRef
from gpusteward.core.health import Source
from gpusteward.core.policy import parse_policy
from gpusteward.sandbox.simgpu import SimGpu, render_openmetrics_history
from tests.support.prometheus import servicemonitor
from tests.unit.test_reclaim_decide import gpu_pod

STEP = 15.0
MINUTE = 60.0
POLICY = parse_policy({"telemetry": {"scrapeInterval": "15s"}, "health": {"xidWindow": "10m"}})


def gpus_at(now: float, t: float) -> list[SimGpu]:
    def gpu(node: str, idx: int, pod: str | None, xid: int = 0, total: int = 0,
            **kw) -> SimGpu:
        return SimGpu(node, idx, "NVIDIA H100 80GB HBM3", util_percent=0.0, xid=xid,
                      xid_total=total, pod=PodRef("ml", pod, "main") if pod else None, **kw)

    ago = now - t
    return [
        # XID 79 five minutes ago: the gauge changes and the counter's series appears
        gpu("n1", 0, "bad", *((79, 1) if ago <= 5 * MINUTE else (0, 0))),
        gpu("n1", 1, "beside"),  # a healthy idle neighbour
        gpu("n1", 2, "old-xid", *((79, 1) if ago <= 30 * MINUTE else (0, 0))),  # history
        gpu("n1", 3, "app-xid", *((13, 1) if ago <= 3 * MINUTE else (0, 0))),  # ignored
        # XID 48 forty minutes ago, and again four minutes ago: the counter rises
        gpu("n2", 0, "second", 48 if ago <= 40 * MINUTE else 0,
            2 if ago <= 4 * MINUTE else 1 if ago <= 40 * MINUTE else 0),
        # An XID 79 long before this pod came: its series (with the pod's labels) carries the
        # GPU's old count and the gauge its old code; neither is a fault of now.
        gpu("n2", 1, "newcomer" if ago <= 8 * MINUTE else None,
            *((79, 1) if ago <= 35 * MINUTE else (0, 0))),
        # DCGM's memory watch failed two minutes ago; another GPU's only warns
        gpu("n2", 2, "dbe", health=(("MEM", HEALTH_FAIL, "DCGM_FR_VOLATILE_DBE_DETECTED"),)
            if ago <= 2 * MINUTE else ()),
        gpu("n2", 3, "warned", health=(("PCIE", HEALTH_WARN, "DCGM_FR_PCI_REPLAY_RATE"),)),
        # a failed row remap, long ago: it stays failed until the GPU is reset
        gpu("n2", 4, "remap", row_remap_failure=True),
    ]


def history(now: float, honor: bool) -> str:
    frames, t = [], now - 45 * MINUTE
    while t <= now - 5:
        frames.append((t, gpus_at(now, t)))
        t += STEP
    return render_openmetrics_history(frames, scrape=servicemonitor(honor), xid_total=True,
                                      health=True)


PODS = [gpu_pod(name, node=node) for name, node in [
    ("bad", "n1"), ("beside", "n1"), ("old-xid", "n1"), ("app-xid", "n1"), ("second", "n2"),
    ("newcomer", "n2"), ("dbe", "n2"), ("warned", "n2"), ("remap", "n2")]]


@pytest.fixture(scope="module")
def now() -> float:
    return time.time()


@pytest.fixture(scope="module", params=[False, True],
                ids=["honorLabels-false", "honorLabels-true"])
def faults(request, module_prometheus_factory, now):
    prometheus = module_prometheus_factory(history_openmetrics=history(now, request.param))
    client = PrometheusClient(prometheus.url, POLICY.telemetry)
    who = Attribution.of(POLICY.telemetry.node_labels, "auto", {"n1", "n2"}, PODS)

    async def read(only: str | None = None):
        await client.check_names(3600)
        if only is None:
            return await gpu_faults(client, POLICY, who)
        queries = fault_queries(POLICY.health, POLICY.telemetry.node_labels, client.present,
                                600.0, exact_range(600.0, bool(client.left_closed)))
        return assemble({only: await client.query(queries[only])}, who)
    return read


async def test_only_xids_of_the_window_and_dcgms_failures_are_faults_of_their_gpus(faults):
    found = await faults()
    assert set(found) == {"ml/bad", "ml/second", "ml/dbe", "ml/remap"}
    assert {k for k, f in found.items() if f.source == Source.XID} == {"ml/bad", "ml/second"}
    assert found["ml/dbe"].source == found["ml/remap"].source == Source.DCGM_HEALTH
    assert found["ml/dbe"].reason.startswith("DCGM health watch MEM failed on GPU GPU-")
    assert "DCGM_FR_VOLATILE_DBE_DETECTED" in found["ml/dbe"].reason
    assert found["ml/remap"].reason.startswith("row remapping failed on GPU GPU-")
    assert found["ml/bad"].reason.startswith("XID 79 on GPU ")
    assert found["ml/second"].reason.startswith("XID 48 on GPU ")
    # the new counter series, and the counter that rose: each found by its own query
    assert "DCGM_EXP_XID_ERRORS_TOTAL" in found["ml/second"].reason


@pytest.mark.parametrize(("query", "pods"), [
    pytest.param("xid_total", {"ml/second"}, id="counter-rose"),
    pytest.param("xid_new", {"ml/bad"}, id="counter-series-appeared"),
    pytest.param("xid_gauge", {"ml/bad"}, id="gauge-took-it-within-the-window"),
    pytest.param("xid_counted", set(), id="windowed-count-not-enabled"),
    pytest.param("health_failed", {"ml/dbe"}, id="health-watch-failed-not-warned"),
    pytest.param("row_remap_failed", {"ml/remap"}, id="row-remap-failed"),
])
async def test_each_fault_query_finds_its_own_evidence(faults, query, pods):
    # The gauge does not see XID 48 again (it held 48 already), nor does increase() see a
    # series' first sample; the other queries cover each.
    assert set(await faults(query)) == pods
