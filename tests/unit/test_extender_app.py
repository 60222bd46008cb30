"""The extender over HTTP (aiohttp test client, fleet fed straight into the store).

Upstream shape and bad input; replies against real telemetry are in tests/component.
"""

from __future__ import annotations

import json

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpusteward.core.fleet import FleetStore
from gpusteward.core.model import Telemetry
from gpusteward.core.policy import parse_policy
from gpusteward.extender import wire
from gpusteward.extender.app import Extender, create_app
from gpusteward.extender.replies import prioritize_reply
from gpusteward.extender.view import PlacementView
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


async def test_health_and_readiness(client):
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200  # no watches to wait for here


def coolness_only_view() -> tuple[PlacementView, FleetStore]:
    policy = parse_policy({"classes": {"batch": {"weights": {
        "card": 0, "coolness": 1, "packing": 0, "health": 0}}}})
    fleet = FleetStore()
    view = PlacementView(policy, fleet, clock=lambda: NOW)
    fleet.replace_all([node("x", H100), node("y", H100)], [])
    view.set_telemetry(Telemetry(nodes={"x": readings("x", [0.0] * 8),
                                        "y": readings("y", [0.2] * 8)}))
    return view, fleet


def scores(view: PlacementView, uid: str) -> dict[str, int]:
    pod_json = gpu_pod(4)
    pod_json["metadata"]["uid"] = uid
    args = wire.decode_args(json.dumps({"Pod": pod_json, "NodeNames": ["x", "y"]}).encode())
    return {e["Host"]: e["Score"] for e in json.loads(prioritize_reply(view, args).body)}


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
