"""Folding range-query answers into a what-if history: what the record lacks is said, owners and
labels come back from kube-state-metrics' names (docs/metrics/workload/pod-metrics.md:
``label_<sanitized key>``; ``created_by``/``owner_*`` as ``<none>`` without an owner)."""

from __future__ import annotations

import pytest

from gpusteward.adapters.errors import TelemetryUnavailable
from gpusteward.adapters.historyfold import Facts, NoHistory, Series, label_name
from gpusteward.adapters.promclient import PrometheusClient
from gpusteward.core.policy import parse_policy
from gpusteward.core.whatif.history import Grid

POLICY = parse_policy({})
GRID = Grid(1_800_000_000.0, 60.0, 10)


def points(first: int, last: int, value: str = "1") -> list[list]:
    return [[GRID.time(i), value] for i in range(first, last + 1)]


def facts_with_pods(xid_from: int = 0) -> Facts:
    facts = Facts(GRID, POLICY.telemetry.node_labels, xid_from)
    facts.add("info", [Series({"namespace": "ml", "pod": "web-5d8f-abcde", "uid": "u1",
                               "node": "n1", "priority_class": ""}, points(0, 9))])
    facts.add("phase", [Series({"uid": "u1", "phase": "Running"}, points(0, 9))])
    facts.add("gpus", [Series({"uid": "u1", "resource": "nvidia_com_gpu"}, points(9, 9, "2"))])
    facts.add("owner", [Series({"uid": "u1", "owner_kind": "ReplicaSet",
                                "owner_name": "web-5d8f"}, points(9, 9))])
    facts.add("labels", [Series({"uid": "u1", label_name("gpusteward.io/team"): "vision"},
                                points(9, 9))])
    return facts


def test_pods_without_gpu_telemetry_in_the_window_are_no_history_to_replay():
    with pytest.raises(NoHistory, match="no GPU telemetry"):
        facts_with_pods().history(POLICY)


def facts_with_an_idle_gpu(xid_from: int = 0) -> Facts:
    """The pod of facts_with_pods on GPU-1 of n1, idle at 2 samples a step."""
    facts = facts_with_pods(xid_from)
    gpu = {"UUID": "GPU-1", "Hostname": "n1", "gpu": "0", "exported_namespace": "ml",
           "exported_pod": "web-5d8f-abcde"}
    facts.add("peak", [Series(gpu, points(0, 9, "0"))])
    facts.add("count", [Series(gpu, points(0, 9, "2"))])
    return facts


def test_a_replicaset_pod_belongs_to_its_deployment_and_keeps_its_team():
    history = facts_with_an_idle_gpu().history(POLICY)
    (record,) = history.pods
    assert record.pod.gpus == 2 and record.pod.labels == {"gpusteward.io/team": "vision"}
    assert history.owners["u1"].key == "ml/Deployment/web"
    assert len(record.gpus) == 1 and list(record.gpus[0].samples) == [2.0] * 10
    assert any("annotations" in g for g in history.gaps)


def test_a_series_with_gaps_and_points_before_the_window_is_folded_step_by_step():
    # Prometheus' range answer leaves out the steps where a series had no sample (an exporter
    # outage): those steps stay unsampled; points before the grid are dropped.
    facts = Facts(GRID, POLICY.telemetry.node_labels)
    gpu = {"Hostname": "n1", "UUID": "GPU-1", "gpu": "0"}
    steps = [-1, 0, 1, 3, 4]
    facts.add("peak", [Series(gpu, [(GRID.time(i), f"{10 * i}") for i in steps])])
    facts.add("count", [Series(gpu, [(GRID.time(i), "2") for i in steps])])
    piece = facts.gpu_series[tuple(sorted(gpu.items()))]
    assert piece.first == 0
    assert list(piece.peaks) == [0.0, 10.0, -1.0, 30.0, 40.0]
    assert list(piece.samples) == [2.0, 2.0, 0.0, 2.0, 2.0]
    assert list(facts.telemetry) == [1, 1, 0, 1, 1, 0, 0, 0, 0, 0]


# A range query's matrix (prometheus/docs/querying/api.md, "Range queries" and "Range
# vectors"): {"metric": {labels}, "values": [[unix_time, "sample as a string"], ...]}, with
# NaN and ±Inf spelled "NaN", "+Inf", "-Inf". A real Prometheus never answers garbage, so a
# stand-in on 127.0.0.1 does here (the real server's answers are in tests/component).
MATRIX = (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"gpu":"0"},'
          b'"values":[[1800000000,"+Inf"],[1800000060.5,"NaN"],[1800000120,"42"]]}]}}')


@pytest.fixture
def answering():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = {"answer": b""}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the base class's name
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body["answer"])))
            self.end_headers()
            self.wfile.write(body["answer"])

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def source(answer: bytes) -> PrometheusClient:
        body["answer"] = answer
        return PrometheusClient(f"http://127.0.0.1:{server.server_port}", POLICY.telemetry,
                                attempts=1)

    yield source
    server.shutdown()


async def test_a_range_answer_is_read_as_typed_series_infinities_included(answering):
    rows = await answering(MATRIX).query_matrix("up", 1_800_000_000, 1_800_000_120, 60)
    assert rows == [Series({"gpu": "0"}, [(1_800_000_000.0, "+Inf"), (1_800_000_060.5, "NaN"),
                                          (1_800_000_120.0, "42")])]


@pytest.mark.parametrize("answer", [
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"gpu":"0"}}]}}',
    b'{"status":"success","data":{"resultType":"matrix","result":[{"values":[]}]}}',
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},'
    b'"values":[[1800000000,1]]}]}}',
    b"<html>proxy error</html>"])
async def test_a_malformed_range_answer_is_telemetry_unavailable_naming_it(answering, answer):
    with pytest.raises(TelemetryUnavailable, match="answered garbage"):
        await answering(answer).query_matrix("up", 1_800_000_000, 1_800_000_120, 60)


def test_a_gpus_xid_count_rising_while_its_pod_ran_is_a_fault_at_that_step():
    # DCGM_EXP_XID_ERRORS_TOTAL per GPU and code, kept by (node, GPU place, xid) as the history
    # query keeps it: a series appears with the GPU's first XID of a code after the exporter
    # starts (dcgm-exporter README, "Cumulative XID and clock event counters").
    facts = facts_with_an_idle_gpu()
    place = {"UUID": "GPU-1", "Hostname": "n1", "gpu": "0"}
    facts.add("xid", [
        # appears at 2 (the first XID 79), stays, rises at 5; gone at 7, back at 9 (a restart)
        Series({**place, "xid": "79"}, [(GRID.time(i), v) for i, v in
                                        ((2, "1"), (3, "1"), (4, "1"), (5, "2"), (6, "2"),
                                         (9, "1"))]),
        Series({**place, "xid": "48"}, [(GRID.time(i), "NaN") for i in range(3)]),
        # another GPU's XID is not this pod's fault
        Series({"UUID": "GPU-2", "Hostname": "n1", "gpu": "1", "xid": "79"},
               points(4, 9)),
    ])
    history = facts.history(POLICY)
    (record,) = history.pods
    assert [step for step, _ in record.faults] == [2, 5, 9]
    assert record.faults[0][1] == "XID 79 on GPU GPU-1 (DCGM_EXP_XID_ERRORS_TOTAL rose)"
    assert any("DCGM_EXP_XID_ERRORS_TOTAL" in g for g in history.gaps)


def test_xid_counts_read_from_an_xid_window_before_tell_history_from_fresh_faults():
    # The reader asks for the counts from health.xidWindow before the window (step -3 here):
    # a count there from the read's first step on is history; one that rose just before the
    # window is held against the pod running when the window began.
    place = {"UUID": "GPU-1", "Hostname": "n1", "gpu": "0"}
    old, fresh = facts_with_an_idle_gpu(xid_from=-3), facts_with_an_idle_gpu(xid_from=-3)
    for facts, values in ((old, ["1"] * 13), (fresh, ["0", "1"] + ["1"] * 11)):
        facts.add("xid", [Series({**place, "xid": "79"},
                                 [(GRID.time(i), v) for i, v in zip(range(-3, 10), values,
                                                                   strict=True)])])
    assert old.history(POLICY).pods[0].faults == ()
    assert [s for s, _ in fresh.history(POLICY).pods[0].faults] == [-2]
