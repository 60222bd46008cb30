"""The extender over HTTP (aiohttp test client, fleet fed straight into the store).

Upstream shape and bad input; replies against real telemetry are in tests/component.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import tracemalloc

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpusteward.core.fleet import FleetStore
from gpusteward.core.model import Telemetry
from gpusteward.core.policy import parse_policy
from gpusteward.extender import wire
from gpusteward.extender.app import _BUDGET, Extender, create_app, respond
from gpusteward.extender.replies import filter_reply, prioritize_reply
from gpusteward.extender.view import PARKED_MAX, PlacementView
from tests.factories import A100, H100, L4, NOW, node, pod, readings

POLICY = parse_policy({})


def gpu_pod(gpus: int = 1, cards: str | None = None, cls: str | None = None) -> dict:
    annotations = {"gpusteward.io/card-types": cards} if cards else {}
    labels = {"gpusteward.io/class": cls} if cls else {}
    return {
        "metadata": {"name": "train", "namespace": "ml", "uid": "u1",
                     "annotations": annotations, "labels": labels},
        "spec": {"containers": [{"name": "c", "resources": {
            "requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}}]},
    }


def wire_node(name: str, product: str, gpus: int = 8) -> dict:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64"}}}


@pytest.fixture
async def client():
    fleet = FleetStore()
    view = PlacementView(POLICY, fleet, clock=lambda: NOW)
    fleet.replace_all([node("h1", H100), node("a1", A100), node("l1", L4)],
                      [pod("busy", node="h1", gpus=7)])
    extender = Extender(view, telemetry=None)
    await extender.refresh()
    async with TestClient(TestServer(create_app(extender, max_body_bytes=64 << 10))) as c:
        yield c


async def post(client, verb: str, body) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = await client.post(f"/{verb}", data=data, headers={"Content-Type": "application/json"})
    return resp.status, await resp.read()


async def test_filter_in_node_names_mode_returns_upstream_shape(client):
    status, body = await post(client, "filter", {
        "Pod": gpu_pod(2, cards="NVIDIA-H100*,NVIDIA-A100*"), "Nodes": None,
        "NodeNames": ["h1", "a1", "l1"]})
    assert status == 200
    assert body == (
        b'{"Nodes":null,"NodeNames":["a1"],'
        b'"FailedNodes":{"h1":"pod needs 2 healthy free GPUs, node has 1"},'
        b'"FailedAndUnresolvableNodes":{"l1":"card NVIDIA-L4 not accepted '
        b'(pod wants NVIDIA-H100*,NVIDIA-A100*)"},"Error":""}'
    )


async def test_filter_in_full_node_mode_echoes_the_passing_nodes(client):
    nodes = [wire_node("h1", H100), wire_node("l1", L4)]
    status, body = await post(client, "filter", {
        "Pod": gpu_pod(1, cards="NVIDIA-H100*"),
        "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None})
    assert status == 200
    reply = json.loads(body)
    assert reply["NodeNames"] is None
    assert reply["Nodes"] == {"metadata": {}, "items": [nodes[0]]}
    assert list(reply["FailedAndUnresolvableNodes"]) == ["l1"]


async def test_full_node_mode_judges_nodes_the_cache_has_not_seen(client):
    status, body = await post(client, "filter", {
        "Pod": gpu_pod(1, cards="NVIDIA-H100*"),
        "Nodes": {"items": [wire_node("new-h", H100), wire_node("new-l", L4)]}})
    reply = json.loads(body)
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["new-h"]
    assert list(reply["FailedAndUnresolvableNodes"]) == ["new-l"]


async def test_prioritize_returns_a_bare_array_of_integer_scores(client):
    status, body = await post(client, "prioritize", {
        "Pod": gpu_pod(1, cls="training"), "Nodes": None, "NodeNames": ["l1", "h1", "a1"]})
    assert status == 200
    reply = json.loads(body)
    assert [e["Host"] for e in reply] == ["l1", "h1", "a1"]
    assert all(isinstance(e["Score"], int) and 0 <= e["Score"] <= 10 for e in reply)
    scores = {e["Host"]: e["Score"] for e in reply}
    assert scores["h1"] > scores["a1"] > scores["l1"]  # training prefers premium, then standard
    assert body.startswith(b'[{"Host":"l1","Score":')


async def test_prioritize_in_full_node_mode_scores_the_same(client):
    names = {"Pod": gpu_pod(1), "NodeNames": ["h1", "a1"]}
    full = {"Pod": gpu_pod(1), "Nodes": {"items": [wire_node("h1", H100), wire_node("a1", A100)]}}
    assert (await post(client, "prioritize", names))[1] == (await post(client, "prioritize",
                                                                       full))[1]


async def test_a_node_the_cache_never_saw_fails_filter_with_a_reason(client):
    _, body = await post(client, "filter", {"Pod": gpu_pod(), "NodeNames": ["ghost"]})
    reply = json.loads(body)
    assert reply["NodeNames"] == []
    assert "not in gpusteward's cache" in reply["FailedNodes"]["ghost"]
    metrics = await (await client.get("/metrics")).text()
    assert 'gpusteward_extender_unknown_nodes_total{verb="filter"} 1.0' in metrics


async def test_an_empty_node_list_gets_an_empty_answer(client):
    status, body = await post(client, "prioritize", {"Pod": gpu_pod(), "NodeNames": []})
    assert (status, body) == (200, b"[]")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(b"{not json", "malformed JSON", id="malformed-json"),
        pytest.param(b"", "empty body", id="empty-body"),
        pytest.param({"NodeNames": ["h1"]}, "no Pod", id="no-pod"),
        pytest.param({"Pod": gpu_pod()}, "neither NodeNames nor Nodes", id="no-nodes"),
        pytest.param({"pod": gpu_pod(), "nodenames": ["h1"]}, "PascalCase", id="lowercase-keys"),
        pytest.param({"Pod": gpu_pod(), "NodeNames": "h1"}, "$.NodeNames", id="wrong-type"),
        pytest.param({"Pod": gpu_pod(cards="bad pattern!"), "NodeNames": ["h1"]},
                     "card pattern", id="bad-card-annotation"),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
async def test_bad_requests_get_400_with_the_reason_and_the_server_keeps_serving(
        client, verb, body, reason):
    status, reply = await post(client, verb, body)
    assert status == 400
    assert reason in json.loads(reply)["Error"]
    status, _ = await post(client, verb, {"Pod": gpu_pod(), "NodeNames": ["h1"]})
    assert status == 200


async def test_a_body_over_the_limit_is_refused_with_a_reason(client):
    huge = {"Pod": gpu_pod(), "NodeNames": [f"node-{i:06d}" for i in range(20_000)]}
    status, reply = await post(client, "filter", huge)
    assert status == 413
    assert "limit" in json.loads(reply)["Error"]
    assert (await post(client, "filter", {"Pod": gpu_pod(), "NodeNames": ["h1"]}))[0] == 200


async def test_bad_requests_are_counted_by_verb_and_code(client):
    await post(client, "filter", b"{")
    metrics = await (await client.get("/metrics")).text()
    assert 'gpusteward_extender_requests_total{code="400",verb="filter"} 1.0' in metrics
    assert "gpusteward_extender_request_duration_seconds_bucket" in metrics


def pod_with_gpus(count) -> dict:
    body = gpu_pod()
    body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": count}}
    return body


DEEP = "[" * 30_000 + "]" * 30_000  # 100k deep in the report; the fixture caps bodies at 64 KiB


@pytest.mark.parametrize(
    ("body", "reason"),
    [  # issue 13, item 10: each of these answered 500 and was never counted
        pytest.param({"Pod": pod_with_gpus("²"), "NodeNames": ["h1"]}, "'²'", id="superscript"),
        pytest.param({"Pod": pod_with_gpus("٣"), "NodeNames": ["h1"]}, "'٣'", id="arabic-digit"),
        pytest.param({"Pod": pod_with_gpus(-5), "NodeNames": ["h1"]}, "-5", id="negative"),
        pytest.param({"Pod": pod_with_gpus(2.9), "NodeNames": ["h1"]}, "2.9", id="fraction"),
        pytest.param({"Pod": gpu_pod(), "Nodes": {"items": [
            {"metadata": {"name": "new"}, "status": {"allocatable": {"nvidia.com/gpu": "abc"}}}]}},
            "node new: 'abc'", id="unknown-node-bad-count"),
        pytest.param(('{"Pod":{"metadata":{"x":' + DEEP + '}},"NodeNames":["h1"]}').encode(),
                     "nested too deeply", id="deep-json-ignored-field"),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
async def test_malformed_values_get_400_with_the_reason_and_are_counted(
        client, verb, body, reason):
    status, reply = await post(client, verb, body)
    assert status == 400, reply[:200]
    assert reason in json.loads(reply)["Error"]
    metrics = await (await client.get("/metrics")).text()
    assert f'gpusteward_extender_requests_total{{code="400",verb="{verb}"}} 1.0' in metrics


async def test_compressed_bodies_are_refused_before_inflating(client):
    # Issue 13, item 9: a 1 MB gzip body inflating to 1 GiB blocked the event loop for 13 s.
    bomb = gzip.compress(b" " * (64 << 20))
    resp = await client.post("/filter", data=bomb, headers={
        "Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert resp.status == 415
    assert "Content-Encoding 'gzip'" in json.loads(await resp.read())["Error"]
    resp = await client.post("/prioritize", data=b"not gzip", headers={"Content-Encoding": "gzip"})
    assert resp.status == 415
    metrics = await (await client.get("/metrics")).text()
    assert 'gpusteward_extender_requests_total{code="415",verb="filter"} 1.0' in metrics
    assert (await post(client, "filter", {"Pod": gpu_pod(), "NodeNames": ["h1"]}))[0] == 200


async def test_unknown_paths_and_methods_are_counted(client):
    assert (await client.get("/filter")).status == 405
    assert (await client.post("/bind", data=b"{}")).status == 404
    metrics = await (await client.get("/metrics")).text()
    assert 'gpusteward_extender_requests_total{code="405",verb="filter"} 1.0' in metrics
    assert 'gpusteward_extender_requests_total{code="404",verb="other"} 1.0' in metrics


async def test_health_and_readiness(client):
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200  # no watches to wait for here


def coolness_only_view() -> tuple[PlacementView, FleetStore]:
    policy = parse_policy({"classes": {"batch": {"weights": {
        "card": 0, "coolness": 1, "packing": 0, "health": 0}}}})
    fleet = FleetStore()
    view = PlacementView(policy, fleet, clock=lambda: NOW)
    pending = [msgspec.structs.replace(pod(uid, node=None, gpus=4), uid=uid)
               for uid in ("first", "second")]
    fleet.replace_all([node("x", H100), node("y", H100)], pending)
    view.set_telemetry(Telemetry(nodes={"x": readings("x", [0.0] * 8),
                                        "y": readings("y", [0.2] * 8)}))
    return view, fleet


def scores(view: PlacementView, uid: str) -> dict[str, int]:
    pod_json = gpu_pod(4)
    pod_json["metadata"]["uid"] = uid
    args = wire.decode_args(json.dumps({"Pod": pod_json, "NodeNames": ["x", "y"]}).encode())
    reply = respond(view, prioritize_reply, args)
    return {e["Host"]: e["Score"] for e in json.loads(reply.body)}


def test_building_a_reply_changes_nothing_the_handler_records_the_expected_placement():
    view, _ = coolness_only_view()
    pod_json = gpu_pod(4)
    pod_json["metadata"]["uid"] = "first"
    args = wire.decode_args(json.dumps({"Pod": pod_json, "NodeNames": ["x", "y"]}).encode())
    reply = prioritize_reply(view, args)
    assert reply.best_node == "x"
    assert view.inflight == {}
    assert respond(view, prioritize_reply, args).body == reply.body
    assert view.inflight == {"first": ("x", 4, NOW)}


def test_a_burst_does_not_pile_onto_the_node_that_looked_idlest():
    view, _ = coolness_only_view()
    assert scores(view, "first") == {"x": 10, "y": 8}
    # "first" is expected on x (4 of 8 GPUs busy) until the watch shows its binding.
    assert scores(view, "second") == {"x": 5, "y": 8}


def test_asking_again_about_the_same_pod_does_not_count_it_twice():
    view, _ = coolness_only_view()
    assert scores(view, "first") == scores(view, "first") == {"x": 10, "y": 8}


def test_the_watch_replaces_the_expectation_with_the_real_binding():
    view, fleet = coolness_only_view()
    scores(view, "first")
    bound = msgspec.structs.replace(pod("first", node="y", gpus=4, bound_at=NOW), uid="first")
    fleet.upsert_pod(bound)  # the scheduler chose y after all
    assert view.inflight == {}
    assert scores(view, "second") == {"x": 10, "y": 3}  # y: (1.6 + 4) / 8 busy -> 0.3 cool


@pytest.mark.parametrize("ends", ["deleted", "deleting"])
def test_a_pod_deleted_while_pending_stops_counting_where_it_was_expected(ends):
    # A pending pod's deletion changes no node, so the fleet notifies nobody: its expectation
    # used to keep x looking busy for INFLIGHT_TTL (30 s).
    view, fleet = coolness_only_view()
    scores(view, "first")
    if ends == "deleted":
        fleet.delete_pod("first")
    else:
        fleet.upsert_pod(msgspec.structs.replace(pod("first", node=None, gpus=4), uid="first",
                                                 deleting=True))
    assert scores(view, "second") == {"x": 10, "y": 8}
    assert set(view.inflight) == {"second"}


def test_each_ranking_is_one_debug_line_saying_what_the_scores_counted(caplog):
    view, fleet = coolness_only_view()
    scores(view, "first")
    fleet.upsert_pod(msgspec.structs.replace(pod("bound", node="y", gpus=4), uid="bound"))
    with caplog.at_level(logging.DEBUG, logger="gpusteward.extender.placement"):
        scores(view, "second")
        scores(view, "made-up")
        scores(view, "bound")
    first, second, third = (r.getMessage() for r in caplog.records)
    assert first == (
        "ranked ml/train: y=8 (load 0.20, allocated 4, expected 0, reserved 0), "
        "x=5 (load 0.50, allocated 0, expected 4, reserved 0); now expected on y")
    assert second.endswith("; not watched yet, parked for x")  # x=5, y=3 by then
    assert third.endswith("; not counted (bound already, or every GPU expected) on x")


def test_made_up_pods_cannot_make_a_node_look_busy():
    # Issue 13, item 8: thousands of prioritize calls for invented UIDs halved a real pod's
    # scores. Only a pod the watch shows pending registers an expectation.
    view, _ = coolness_only_view()
    for i in range(2000):
        scores(view, f"made-up-{i}")
    assert view.inflight == {}
    assert len(view.parked) == PARKED_MAX
    assert scores(view, "first") == {"x": 10, "y": 8}


def test_a_pod_ranked_before_the_watch_saw_it_counts_once_the_watch_does():
    view, fleet = coolness_only_view()
    assert scores(view, "third") == {"x": 10, "y": 8}  # not watched yet: parked, no effect
    assert scores(view, "first") == {"x": 10, "y": 8}
    fleet.upsert_pod(msgspec.structs.replace(pod("third", node=None, gpus=4), uid="third"))
    # "first" and now "third" are both expected on x: 8 of 8 GPUs.
    assert scores(view, "second") == {"x": 0, "y": 8}


def test_a_bound_pod_cannot_be_expected_again():
    view, fleet = coolness_only_view()
    fleet.upsert_pod(msgspec.structs.replace(pod("first", node="y", gpus=4), uid="first"))
    scores(view, "first")
    assert view.inflight == {}


def test_expectations_never_exceed_the_node_gpu_count():
    view, fleet = coolness_only_view()
    fleet.replace_all(None, [msgspec.structs.replace(pod(f"p{i}", node=None, gpus=4), uid=f"p{i}")
                             for i in range(6)])
    for i in range(6):
        scores(view, f"p{i}")
    by_node: dict[str, int] = {}
    for name, gpus, _ in view.inflight.values():
        by_node[name] = by_node.get(name, 0) + gpus
    assert by_node and all(total <= 8 for total in by_node.values())


def test_the_watch_gpu_count_wins_over_the_request():
    # A caller claiming 1 GPU for a pending pod that requests 4 expects the 4 the watch knows.
    view, _ = coolness_only_view()
    pod_json = gpu_pod(1)
    pod_json["metadata"]["uid"] = "first"
    respond(view, prioritize_reply, wire.decode_args(json.dumps(
        {"Pod": pod_json, "NodeNames": ["x", "y"]}).encode()))
    assert [gpus for _, gpus, _ in view.inflight.values()] == [4]


def lagging_watch(wait: float) -> tuple[PlacementView, FleetStore, Extender]:
    """coolness_only_view's nodes, with a pod watch that has delivered nothing yet."""
    view, fleet = coolness_only_view()
    fleet.replace_all(None, [])
    return view, fleet, Extender(view, telemetry=None, watch_wait=wait)


async def prioritized(c: TestClient, uid: str, gpus: int = 4) -> dict[str, int]:
    pod_json = gpu_pod(gpus)
    pod_json["metadata"]["uid"] = uid
    status, body = await post(c, "prioritize", {"Pod": pod_json, "NodeNames": ["x", "y"]})
    assert status == 200, body
    return {e["Host"]: e["Score"] for e in json.loads(body)}


def delivered_later(fleet: FleetStore, *uids: str) -> None:
    """The watch delivers these pending pods 20 ms from now, in this order."""
    asyncio.get_running_loop().call_later(0.02, lambda: [
        fleet.upsert_pod(msgspec.structs.replace(pod(u, node=None, gpus=4), uid=u))
        for u in uids])


@pytest.mark.parametrize("wait", [0.5, 0.0])
async def test_a_call_the_watch_lags_behind_waits_for_it_so_the_burst_before_counts(wait):
    # A burst whose every call reached us before our watch showed its pod: with the wait, each
    # answer comes once the watch shows the pod, and with it the pods created before; without
    # it both pods are parked when answered and both rank x first.
    view, fleet, extender = lagging_watch(wait)
    async with TestClient(TestServer(create_app(extender))) as c:
        delivered_later(fleet, "first")
        assert await prioritized(c, "first") == {"x": 10, "y": 8}
        delivered_later(fleet, "second")
        second = await prioritized(c, "second")
        metrics = await (await c.get("/metrics")).text()
    if wait:
        assert second == {"x": 5, "y": 8}  # "first" expected on x: 4 of its 8 GPUs busy
        assert 'gpusteward_extender_watch_waits_total{outcome="caught_up"} 2.0' in metrics
    else:
        assert second == {"x": 10, "y": 8}
        assert "gpusteward_extender_watch_waits_total{" not in metrics


async def test_a_pod_the_watch_never_shows_delays_only_its_own_answer():
    view, fleet, extender = lagging_watch(0.3)
    fleet.upsert_pod(msgspec.structs.replace(pod("real", node=None, gpus=4), uid="real"))
    async with TestClient(TestServer(create_app(extender))) as c:
        loop = asyncio.get_running_loop()
        started = loop.time()
        made_up = asyncio.ensure_future(prioritized(c, "made-up"))
        assert await prioritized(c, "real") == {"x": 10, "y": 8}
        assert loop.time() - started < 0.2  # answered while the other call waits
        assert await made_up == {"x": 5, "y": 8}  # "real", just ranked, is expected on x
        assert loop.time() - started >= 0.3
        metrics = await (await c.get("/metrics")).text()
    assert 'gpusteward_extender_watch_waits_total{outcome="timed_out"} 1.0' in metrics
    assert view.inflight.keys() == {"real"}  # the made-up pod registered nothing


async def test_a_pod_without_gpus_or_with_a_bad_quantity_is_never_waited_for():
    _, _, extender = lagging_watch(5.0)
    async with TestClient(TestServer(create_app(extender))) as c:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await prioritized(c, "cpu-only", gpus=0)
        bad = gpu_pod(1)
        bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1.5"
        status, _ = await post(c, "prioritize", {"Pod": bad, "NodeNames": ["x"]})
        assert status == 400
        assert loop.time() - started < 1.0


async def test_more_nodes_than_any_cluster_has_are_refused_before_scoring(client):
    names = b'"a",' * wire.MAX_NODES + b'"a"'
    body = b'{"Pod":' + json.dumps(gpu_pod()).encode() + b',"NodeNames":[' + names + b"]}"
    status, reply = await post(client, "filter", body)
    assert status == 400
    assert f"over the limit of {wire.MAX_NODES}" in json.loads(reply)["Error"]


def test_a_body_of_tiny_values_is_refused_before_it_is_decoded():
    # 8 M one-letter names in 32 MiB took 550 MB to decode; the comma count stops it first.
    body = b'{"Pod":{},"NodeNames":[' + b'"a",' * (wire.MAX_VALUES + 1) + b'"a"]}'
    with pytest.raises(wire.BadRequest, match="JSON values"):
        wire.decode_args(body)


def test_the_worst_accepted_body_costs_a_bounded_multiple_of_its_size():
    # Issue 13, item 9: a valid 50 MB body peaked at 1.5 GB. The most a request can hold:
    # MAX_NODES nodes unknown to the cache, each judged from the request, with all the values
    # the body may carry. Scaled down 8x; docs/operations.md gives the full-size figures.
    nodes, per_node = wire.MAX_NODES // 8, wire.MAX_VALUES // wire.MAX_NODES - 5
    labels = ",".join(f'"k{j:04d}":"{"v" * 16}"' for j in range(per_node))
    item = ('{"metadata":{"name":"n%06d","labels":{' + labels + ',"nvidia.com/gpu.product":"'
            + H100 + '"}},"status":{"allocatable":{"nvidia.com/gpu":"8"}}}')
    body = ('{"Pod":' + json.dumps(gpu_pod()) + ',"Nodes":{"items":['
            + ",".join(item % i for i in range(nodes)) + ']},"NodeNames":null}').encode()
    view = PlacementView(POLICY, FleetStore(), clock=lambda: NOW)
    tracemalloc.start()
    try:
        reply = filter_reply(view, wire.decode_args(body))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(json.loads(reply.body)["Nodes"]["items"]) == nodes
    assert peak < 5 * len(body), (peak, len(body))  # measured: 4.0x


async def test_a_bug_in_a_handler_is_a_counted_500_and_the_server_keeps_serving(
        client, monkeypatch):
    def broken(self, pod):
        raise OverflowError("a bug")

    with monkeypatch.context() as m:
        m.setattr(PlacementView, "demand_of", broken)
        status, reply = await post(client, "prioritize", {"Pod": gpu_pod(), "NodeNames": ["h1"]})
    assert status == 500
    assert "internal error" in json.loads(reply)["Error"]
    metrics = await (await client.get("/metrics")).text()
    assert 'gpusteward_extender_requests_total{code="500",verb="prioritize"} 1.0' in metrics
    assert (await post(client, "prioritize", {"Pod": gpu_pod(), "NodeNames": ["h1"]}))[0] == 200


async def test_slow_large_uploads_cannot_starve_the_scheduler_small_requests():
    fleet = FleetStore()
    fleet.replace_all([node("h1", H100)], [])
    extender = Extender(PlacementView(POLICY, fleet, clock=lambda: NOW), telemetry=None)
    await extender.refresh()
    app = create_app(extender, max_body_bytes=4 << 20)
    async with TestClient(TestServer(app)) as c:
        app[_BUDGET].used = app[_BUDGET].limit  # large bodies announced and still arriving
        big = {"Pod": gpu_pod(), "NodeNames": ["h1"], "pad": "x" * (2 << 20)}
        resp = await c.post("/filter", data=json.dumps(big))
        assert resp.status == 503
        assert "retry" in json.loads(await resp.read())["Error"]
        assert (await post(c, "filter", {"Pod": gpu_pod(), "NodeNames": ["h1"]}))[0] == 200


async def test_a_mig_pod_passes_only_nodes_that_offer_its_profile():
    """Full-node mode with GFD's mixed-strategy allocatable (k8s-device-plugin
    internal/lm/mig-strategy.go: one `nvidia.com/mig-<profile>` resource per profile)."""
    policy = parse_policy({"resources": ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]})
    extender = Extender(PlacementView(policy, FleetStore(), clock=lambda: NOW), telemetry=None)
    await extender.refresh()
    mig = {"metadata": {"name": "m1", "labels": {"nvidia.com/gpu.product": A100}},
           "status": {"allocatable": {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "14"}}}
    pod_ = gpu_pod(1)
    pod_["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
    async with TestClient(TestServer(create_app(extender, max_body_bytes=64 << 10))) as c:
        _, body = await post(c, "filter", {"Pod": pod_, "Nodes": {"items": [
            mig, wire_node("a1", A100)]}})
    reply = json.loads(body)
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["m1"]
    assert reply["FailedAndUnresolvableNodes"] == {
        "a1": "pod needs 1 nvidia.com/mig-1g.10gb, node has 0"}
